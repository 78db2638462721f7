"""The lane's reader of the worker's answers (``runtime/native/worker_pickle.h``, through the lanes' module's
``read_pickled``) held to Python's pickle: whatever the worker's pickler writes, the reader reads the same or refuses
it (the lane then gives the request back to the core); whatever it reads from a truncated or edited message, Python's
pickle reads the same, and it never reads what Python's refuses. The answers are shaped by user model code (names,
errors, parameters), so every value the format allows is generated, not only the shapes a worker sends today."""

from __future__ import annotations

import importlib
import math
import os
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers.python.transport import send_direct
from runtime.native.lanes import NATIVE_LANES_BUILT

if not NATIVE_LANES_BUILT and os.environ.get("REQUIRE_NATIVE_GRPC_EDGE"):  # CI: scripts/setup.sh builds it
    raise RuntimeError("the native lanes are not built (runtime/native/_native_lanes): see scripts/setup.sh")
pytestmark = pytest.mark.skipif(not NATIVE_LANES_BUILT, reason="the native lanes are not built (no C++ compiler)")

PROTOCOL = pickle.HIGHEST_PROTOCOL  # as the worker pickles its messages (handlers/python/transport.py)
INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=300)  # no lone surrogates: see below
SCALARS = st.none() | st.booleans() | INT64 | st.floats(allow_nan=True) | TEXT | st.binary(max_size=300)
HASHABLE = st.none() | st.booleans() | INT64 | TEXT | st.binary(max_size=40)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=6) | st.lists(inner, max_size=6).map(tuple)
                      | st.dictionaries(HASHABLE, inner, max_size=6), max_leaves=40)
# The worker's answer to a batch: (kind, batch id, [per request: ("ok", [output refs], parameters) or
# ("error", message, code)]), an output ref (name, datatype, shape, segment, offset, size, inline bytes)
REF = st.tuples(TEXT, st.sampled_from(["FP32", "INT64", "BYTES", "BOOL"]), st.lists(INT64, max_size=4).map(tuple),
                INT64, INT64, INT64, st.none() | st.binary(max_size=200))
RESULT = (st.tuples(st.just("ok"), st.lists(REF, max_size=4), st.none() | TEXT)
          | st.tuples(st.just("error"), TEXT, st.none() | TEXT))
ANSWERS = st.tuples(st.sampled_from(["results", "direct"]), INT64, st.lists(RESULT, min_size=1, max_size=3))


def _read(data: bytes) -> tuple[bool, object]:
    return importlib.import_module("runtime.native._native_lanes").read_pickled(data)


def _same(a: object, b: object) -> bool:
    """Equal, NaN to NaN included, and of the same types all the way down (a tuple is not a list)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    return a == b


def _python_reads(data: bytes) -> tuple[bool, object]:
    try:
        return True, pickle.loads(data)  # noqa: S301 - the bytes were generated here
    except Exception:  # noqa: BLE001 - any refusal
        return False, None


def _agrees_with_python(data: bytes) -> None:
    """What the reader reads from ``data``, Python reads the same; what Python refuses, the reader refuses."""
    try:
        read, value = _read(data)
    except TypeError:  # read, but not a value Python can hold (a dict keyed by a list): Python refuses it too
        assert not _python_reads(data)[0]
        return
    if read:
        python_read, python_value = _python_reads(data)
        assert python_read, f"read what Python's pickle refuses: {data!r} -> {value!r}"
        assert _same(value, python_value), f"{data!r}: {value!r} != {python_value!r}"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALUES)
def test_every_value_of_the_format_round_trips(value):
    data = pickle.dumps(value, PROTOCOL)
    read, got = _read(data)
    assert read, f"refused {value!r}"
    assert _same(got, value)


def _as_the_worker_sends(answer: tuple) -> bytes:
    """The message the worker's ``send_direct`` writes for ``answer``, its 4-byte frame taken off as the lane does."""
    reading, writing = os.pipe()
    try:
        send_direct(writing, answer)
        os.close(writing)
        writing = -1
        frame = b""
        while chunk := os.read(reading, 1 << 16):
            frame += chunk
    finally:
        os.close(reading)
        if writing >= 0:
            os.close(writing)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    return frame[4:]


@settings(max_examples=200, deadline=None)
@given(ANSWERS)
def test_worker_answers_round_trip(answer):
    read, got = _read(_as_the_worker_sends(answer))
    assert read and _same(got, answer)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALUES | ANSWERS, st.data())
def test_a_truncated_message_is_refused(value, data):
    message = pickle.dumps(value, PROTOCOL)
    cut = data.draw(st.integers(min_value=0, max_value=len(message) - 1))
    assert _read(message[:cut]) == (False, None)  # no STOP: never a value


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALUES | ANSWERS, st.data())
def test_an_edited_message_is_read_as_python_reads_it_or_refused(value, data):
    message = bytearray(pickle.dumps(value, PROTOCOL))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        at = data.draw(st.integers(min_value=0, max_value=len(message) - 1))
        message[at] = data.draw(st.integers(min_value=0, max_value=255))
    _agrees_with_python(bytes(message))


@pytest.mark.parametrize("message", [
    b"\x80\x05(.",  # a mark alone
    b"\x80\x05(\x85.",  # a tuple of a mark
    b"\x80\x05]N(a.",  # a mark appended to a list
    b"\x80\x05}K\x01(s.",  # a mark as a dict's value
    b"\x80\x05(\x94.",  # a mark memoized
    b"\x80\x05\x8c\x02\xed\xa0.",  # a str that is not UTF-8 (a lone surrogate, which pickle itself allows)
    b"\x80\x05\x8c\x02\xc3.",  # a str cut in a character
    b"\x80\x05]]\x85\x94h\x00a.",  # a cycle
    b"\x80\x05" + b"]" * 40 + b"a" * 39 + b".",  # nested past 32
], ids=["mark", "tuple of a mark", "append a mark", "setitem a mark", "memoize a mark", "surrogate",
        "cut character", "cycle", "too deep"])
def test_what_the_reader_refuses(message):
    assert _read(message) == (False, None)
    _agrees_with_python(message)


def test_a_lone_surrogate_pickle_writes_is_refused_not_misread():
    """Python's pickler writes a lone surrogate (surrogatepass): refused here, so the lane gives the request back."""
    assert _read(pickle.dumps(("ok", "\ud800"), PROTOCOL)) == (False, None)


def test_the_lane_writes_the_workers_own_constants():
    """The places and markers the lane writes into a batch message (lane_request.h) are the Python worker's:
    a change on one side without the other fails here, not in an end-to-end test."""
    from handlers.python.transport import INLINE, INLINE_MAX_BYTES, REQUEST_INPUT
    from runtime.direct_path import DIRECT_EXECUTION

    lanes = importlib.import_module("runtime.native._native_lanes")
    assert (lanes.WORKER_INLINE_MAX_BYTES, lanes.WORKER_INLINE, lanes.WORKER_REQUEST_INPUT,
            lanes.WORKER_DIRECT_EXECUTION) == (INLINE_MAX_BYTES, INLINE, REQUEST_INPUT, DIRECT_EXECUTION)
