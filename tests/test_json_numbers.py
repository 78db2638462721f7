"""runtime/http/json_numbers.cc held to msgspec, the server's one JSON library, on generated values and text: it
writes every array byte for byte as msgspec writes the same values, and whatever text it reads, it reads as a JSON
parser does (or refuses it, and the generic path decides). runtime/http/json_data.py gives the same tensors and the
same text with the native part and without it (msgspec alone, where it was not built)."""

from __future__ import annotations

import json
import math
import os

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.http import json_data

if json_data.json_numbers is None and os.environ.get("REQUIRE_NATIVE_GRPC_EDGE"):  # CI: setup.py builds both
    raise RuntimeError("runtime/http/_json_numbers is not built: see setup.py")
pytestmark = pytest.mark.skipif(json_data.json_numbers is None, reason="runtime/http/_json_numbers is not built")

INTEGER_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
WHITESPACE = st.sampled_from(["", " ", "\n", "\t", "\r\n  "])


def _native():
    assert json_data.json_numbers is not None
    return json_data.json_numbers


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=40))
def test_a_double_array_is_written_as_msgspec_writes_it(values):
    assert _native().format(np.array(values, np.float64)) == msgspec.json.encode(values)


@given(st.lists(st.floats(width=32, allow_nan=False), max_size=40))
def test_a_float32_array_is_written_as_its_exact_doubles(values):
    array = np.array(values, np.float32)
    assert _native().format(array) == msgspec.json.encode(array.astype(np.float64).tolist())


@given(st.sampled_from(INTEGER_DTYPES), st.data())
def test_integer_and_boolean_arrays_are_written_as_msgspec_writes_them(dtype, data):
    limits = np.iinfo(dtype)
    values = data.draw(st.lists(st.integers(int(limits.min), int(limits.max)), max_size=40))
    assert _native().format(np.array(values, dtype)) == msgspec.json.encode(values)
    flags = data.draw(st.lists(st.booleans(), max_size=10))
    assert _native().format(np.array(flags, bool)) == msgspec.json.encode(flags)


def test_a_buffer_it_cannot_write_is_refused():
    for array in (np.zeros(2, np.float16), np.zeros(2, np.complex64), np.zeros((2, 2), np.float32),
                  np.zeros(4, np.float32)[::2]):
        with pytest.raises(ValueError):
            _native().format(array)


def _parsed(text: str, kind: str) -> list | None:
    out = np.empty(len(text) + 1, {"d": np.float64, "i": np.int64, "u": np.uint64}[kind])
    count = _native().parse(text.encode(), out)
    return None if count < 0 else out[:count].tolist()


def _json_reads(text: str, kind: str) -> list | None:
    """What a JSON parser makes of the array, as ``kind``'s numbers, or None where they are not such numbers."""
    try:
        values = json.loads("[" + text + "]", parse_constant=lambda _: None)
    except ValueError:
        return None
    if any(type(value) not in ((int, float) if kind == "d" else (int,)) for value in values):
        return None
    if kind == "d":
        values = [float(value) for value in values]
        return values if all(math.isfinite(value) for value in values) else None
    low, high = (-(1 << 63), (1 << 63) - 1) if kind == "i" else (0, (1 << 64) - 1)
    return values if all(low <= value <= high for value in values) else None


NUMBER_TEXT = st.text(st.sampled_from(list("0123456789 \t\n\r,.eE+-")), max_size=40)


@settings(max_examples=400)
@given(NUMBER_TEXT, st.sampled_from("diu"))
def test_whatever_text_it_reads_it_reads_as_a_json_parser_does(text, kind):
    native = _parsed(text, kind)
    if native is not None:
        reference = _json_reads(text, kind)
        assert reference is not None and len(native) == len(reference)
        assert all(a == b and math.copysign(1, a) == math.copysign(1, b) if kind == "d" else a == b
                   for a, b in zip(native, reference, strict=True))


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=30), WHITESPACE, WHITESPACE)
def test_every_double_written_by_any_writer_is_read_back(values, before, after):
    for written in (msgspec.json.encode(values).decode(), json.dumps(values)):
        inside = written[1:-1].replace(",", before + "," + after)
        assert _parsed(before + inside + after, "d") == values


@given(st.sampled_from(["i", "u"]), st.data())
def test_every_integer_in_range_is_read_and_none_past_it(kind, data):
    low, high = (-(1 << 63), (1 << 63) - 1) if kind == "i" else (0, (1 << 64) - 1)
    values = data.draw(st.lists(st.integers(low, high), min_size=1, max_size=30))
    assert _parsed(json.dumps(values)[1:-1], kind) == values
    past = data.draw(st.sampled_from([low - 1, high + 1]))
    assert _parsed(json.dumps([*values, past])[1:-1], kind) is None
    assert _parsed(json.dumps([*values, 1.5])[1:-1], kind) is None


def test_it_never_writes_past_the_buffer_it_is_given():
    out = np.zeros(3, np.float64)
    assert _native().parse(b"1,2,3,4", out[:2]) == -1
    assert out[2] == 0


DATATYPES = ["FP32", "FP64", "FP16", "INT8", "INT32", "INT64", "UINT8", "UINT64"]


@settings(max_examples=200)
@given(st.sampled_from(DATATYPES), st.data())
def test_json_data_reads_and_writes_the_same_without_the_native_part(datatype, data):
    dtype = np.dtype(datatype.lower().replace("fp", "float"))
    if dtype.kind == "f":
        values = data.draw(st.lists(st.floats(width=min(dtype.itemsize * 8, 64), allow_nan=False,
                                              allow_infinity=False), max_size=20))
    else:
        limits = np.iinfo(dtype)
        values = data.draw(st.lists(st.integers(int(limits.min), int(limits.max)), max_size=20))
    array = np.array(values, dtype)
    text = json_data.json_fragment(array, datatype)
    read = json_data.array_from_json(datatype, (len(values),), bytes(text))
    module = json_data.json_numbers
    json_data.json_numbers = None
    try:
        assert json_data.json_fragment(array, datatype) == text
        assert json_data.array_from_json(datatype, (len(values),), bytes(text)).tobytes() == read.tobytes()
    finally:
        json_data.json_numbers = module
    assert read.dtype == dtype and read.tobytes() == array.tobytes()
