"""A lane's side of a request (``runtime/native/lane_request.h``, through the lanes' module's
``lane_batch_message``) held to Python's, on generated requests near a model's declared form and far from it:

- the accept rule against runtime/validation.py: every request the lane takes, the core accepts, with the same batch
  size and the same arrays (the lane may decline more: the core then serves it);
- the batch message the lane writes (C++ writes, Python reads) against the one handlers/python/batch.py writes for
  the same request: read with the worker's own reader, equal field for field and type for type, each input's bytes
  where its reference says (carried in the message, or in the lane's buffer).

Python writes and C++ reads (the worker's answers) is tests/test_worker_pickle.py's."""

from __future__ import annotations

import importlib
import math
import os
import pickle
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from handlers.python.batch import batch_message
from handlers.python.transport import INLINE, INLINE_MAX_BYTES, inline_ref
from runtime.config.pbtxt import parse_model_config
from runtime.datatypes import wire_dtype
from runtime.direct_path import DIRECT_EXECUTION
from runtime.errors import InvalidArgument
from runtime.native.lanes import NATIVE_LANES_BUILT, lane_inputs
from runtime.types import InferRequest, InferTensor, RequestedOutput
from runtime.validation import validate_request

if not NATIVE_LANES_BUILT and os.environ.get("REQUIRE_NATIVE_GRPC_EDGE"):  # CI: scripts/setup.sh builds it
    raise RuntimeError("the native lanes are not built (runtime/native/_native_lanes): see scripts/setup.sh")
pytestmark = pytest.mark.skipif(not NATIVE_LANES_BUILT, reason="the native lanes are not built (no C++ compiler)")

CONFIGS = {
    "batched": """
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "B" data_type: TYPE_INT64 dims: [ 1, 2 ] } ]
output [ { name: "C" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "D" data_type: TYPE_FP32 dims: [ 2 ] } ]
""",
    "unbatched": """
max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP16 dims: [ 3 ] }, { name: "B" data_type: TYPE_BOOL dims: [ 2, 1 ] } ]
output [ { name: "C" data_type: TYPE_FP32 dims: [ 2 ] } ]
""",
    "variable": """
max_batch_size: 8
input [ { name: "A" data_type: TYPE_UINT8 dims: [ -1 ] }, { name: "B" data_type: TYPE_FP64 dims: [ -1, 3 ] } ]
output [ { name: "C" data_type: TYPE_FP32 dims: [ -1 ] } ]
""",
    "large": """
max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "C" data_type: TYPE_FP32 dims: [ -1 ] } ]
""",
}
SPECS = {name: parse_model_config('backend: "python"\n' + text, "m") for name, text in CONFIGS.items()}
BUFFER_SEGMENT = 1 << 30
NAMES = ["A", "B", "C", "D", "é", ""]
DATATYPES = ["FP32", "INT64", "FP16", "BOOL", "UINT8", "FP64", "BYTES", "INT8"]


def _lane_message(spec, buffer_size: int, version: str, request_id: str, inputs: list[tuple], outputs: list[str],
                  batch_id: int):
    lanes = importlib.import_module("runtime.native._native_lanes")
    return lanes.lane_batch_message(
        spec.name, "1", lane_inputs(spec), [t.name for t in spec.outputs], spec.max_batch_size, buffer_size,
        BUFFER_SEGMENT, batch_id, spec.name, version, request_id, inputs, outputs)


@st.composite
def _requests(draw, spec) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    """The declared inputs (name, datatype, shape, bytes), each part kept or changed, maybe one dropped, repeated or
    added; sizes up to past the message's inline bound and the lane's buffer."""
    batched = spec.max_batch_size > 0
    batch = draw(st.integers(-1, spec.max_batch_size + 2))
    large = draw(st.integers(0, 9)) == 0
    tensors = []
    for declared in spec.inputs:
        itemsize = wire_dtype(declared.datatype).itemsize
        free = draw(st.integers(1, 9000 if large else 4))
        dims = tuple(free if d == -1 else d for d in declared.dims)
        lead = (batch if draw(st.integers(0, 4)) else draw(st.integers(-1, 6)),) if batched else ()
        shape = (*lead, *dims) if draw(st.integers(0, 6)) else tuple(draw(st.lists(st.integers(-1, 3), max_size=3)))
        elements = math.prod(max(d, 0) for d in shape)
        size = max(0, elements * itemsize + (0 if draw(st.integers(0, 5)) else draw(st.integers(-4, 4))))
        tensors.append((declared.name if draw(st.integers(0, 8)) else draw(st.sampled_from(NAMES)),
                        declared.datatype if draw(st.integers(0, 8)) else draw(st.sampled_from(DATATYPES)),
                        shape, draw(st.binary(min_size=size, max_size=size)) if size <= 64 else bytes(range(256)) *
                        (size // 256) + bytes(size % 256)))
    change = draw(st.integers(0, 9))
    if change == 0 and len(tensors) > 1:
        tensors[1] = tensors[0]  # one input twice
    elif change == 1:
        tensors.pop()
    elif change == 2:
        tensors.append(tensors[0])
    return tensors


def _core(spec, request_id: str, inputs: list[tuple], outputs: list[str]):
    """What the core makes of the request: its batch size and arrays, or its refusal."""
    request = InferRequest(spec.name, id=request_id, outputs=[RequestedOutput(name) for name in outputs],
                           inputs=[InferTensor(name, datatype, shape, None, raw=data)
                                   for name, datatype, shape, data in inputs])
    try:
        batch = validate_request(spec, request)
    except InvalidArgument as error:
        return "refused", error.message, request
    return batch, [(t.name, t.values().dtype.str, t.values().shape, t.values().tobytes()) for t in request.inputs], \
        request


def _same(a: object, b: object) -> bool:
    """Equal, and of the same types all the way down (a tuple is not a list)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _check_message(spec, framed: bytes, buffer: bytes, batch_id: int, request: InferRequest,
                   inputs: list[tuple]) -> None:
    (length,) = struct.unpack("!i", framed[:4])  # transport.recv_direct's framing
    assert length == len(framed) - 4
    message = pickle.loads(framed[4:])  # noqa: S301 - the lane's bytes, written here
    # as the link's execute message: (kind, batch id, one message a request, whether to run them separately)
    assert len(message) == 4 and _same(message[:2], ("direct", batch_id)) and _same(message[3], False)
    (written,) = message[2]
    key, refs = written[0], written[1]
    assert _same(key, (-batch_id,))
    python_refs = []
    placed_end = 0
    for ref, (name, datatype, shape, data) in zip(refs, inputs, strict=True):
        ref_name, ref_datatype, ref_shape, segment, offset, size, carried = ref
        assert _same((ref_name, ref_datatype, ref_shape, size), (name, datatype, tuple(shape), len(data)))
        array = np.frombuffer(data, wire_dtype(datatype)).reshape(shape)
        if len(data) <= INLINE_MAX_BYTES:
            assert _same(ref, inline_ref(name, array)) and segment == INLINE
            python_refs.append(ref)
        else:
            assert segment == BUFFER_SEGMENT and carried is None and offset % 64 == 0 and offset >= placed_end
            assert buffer[offset:offset + size] == data
            placed_end = offset + size
            python_refs.append(ref)  # the arena's place is the server's to choose: compared above by content
    assert _same(written, batch_message(key, python_refs, request)[:9] + (DIRECT_EXECUTION,))
    assert written[9] == DIRECT_EXECUTION


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), config=st.sampled_from(sorted(CONFIGS)))
def test_every_request_a_lane_takes_the_core_accepts_the_same_and_the_worker_reads_it_as_python_writes_it(data,
                                                                                                          config):
    spec = SPECS[config]
    inputs = data.draw(_requests(spec))
    outputs = data.draw(st.lists(st.sampled_from([t.name for t in spec.outputs] + ["Z"]), max_size=3))
    version = data.draw(st.sampled_from(["", "1", "2"]))
    request_id = data.draw(st.text(max_size=20))
    buffer_size = data.draw(st.sampled_from([0, 64, 1 << 20]))
    batch_id = data.draw(st.integers(1, 1 << 40))
    written = _lane_message(spec, buffer_size, version, request_id, inputs, outputs, batch_id)
    event("declined" if written is None else "taken")
    if written is None:
        return  # declined: the core serves it
    core = _core(spec, request_id, inputs, outputs)
    assert core[0] != "refused", core[1]
    batch, arrays, request = core
    assert batch == (inputs[0][2][0] if spec.max_batch_size else 1)
    assert [(name, data) for name, _, _, data in arrays] == [(name, raw) for name, _, _, raw in inputs]
    assert [(name, dtype, shape) for name, dtype, shape, _ in arrays] == \
        [(name, wire_dtype(datatype).str, tuple(shape)) for name, datatype, shape, _ in inputs]
    _check_message(spec, *written, batch_id, request, inputs)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_a_request_in_the_declared_form_is_taken(config):
    """The generated test above checks only what the lane takes: here each model's plain request is taken (with
    inputs carried in the message, and in the buffer), and each way it is declined is the core's to refuse or to
    serve."""
    spec = SPECS[config]
    lead = (2,) if spec.max_batch_size else ()
    inputs = []
    for t in spec.inputs:
        shape = (*lead, *(5000 if config == "large" else 2 if d == -1 else d for d in t.dims))
        inputs.append((t.name, t.datatype, shape, bytes(math.prod(shape) * wire_dtype(t.datatype).itemsize)))
    written = _lane_message(spec, 1 << 20, "", "id-1", inputs, [spec.outputs[0].name], 7)
    assert written is not None
    _check_message(spec, *written, 7, _core(spec, "id-1", inputs, [spec.outputs[0].name])[2], inputs)
    assert _lane_message(spec, 1 << 20, "2", "id-1", inputs, [], 7) is None  # another version
    assert _lane_message(spec, 1 << 20, "", "id-1", inputs, ["Z"], 7) is None  # an output the model lacks
    assert _lane_message(spec, 1 << 20, "", "id-1", inputs[:-1], [], 7) is None  # an input missing
    wrong = [(name, datatype, shape, data + b"\0") for name, datatype, shape, data in inputs]
    assert _lane_message(spec, 1 << 20, "", "id-1", wrong, [], 7) is None  # a byte-size lie
    if config == "large":
        assert _lane_message(spec, 64, "", "id-1", inputs, [], 7) is None  # no room in the buffer
    assert _lane_message(spec, 1 << 20, "", "x" * (65 << 20), inputs, [], 7) is None  # past the message's bound


@given(batch_id=st.integers(1, (1 << 63) - 1))
def test_the_lanes_cancel_message_is_the_supervisors(batch_id):
    """C++ writes, Python reads: the worker's inbox takes it as the cancellation of the request under that key."""
    framed = importlib.import_module("runtime.native._native_lanes").lane_cancel_message(batch_id)
    assert struct.unpack("!i", framed[:4])[0] == len(framed) - 4
    key = (-batch_id,)  # the key the lane's batch message gave the request
    assert _same(pickle.loads(framed[4:]), ("cancel", key))  # noqa: S301 - the lane's bytes, written here
    assert pickle.loads(framed[4:]) == pickle.loads(pickle.dumps(("cancel", key), pickle.HIGHEST_PROTOCOL))  # noqa: S301
