"""Request validation (runtime/validation.py): the one-pass check of the common request decides exactly as the full
checks do, on requests near the declared form and far from it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.config.pbtxt import parse_model_config
from runtime.errors import InvalidArgument
from runtime.types import InferRequest, InferTensor
from runtime.validation import validate_request

CONFIGS = {
    "batched": """
backend: "python"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "B" data_type: TYPE_INT64 dims: [ 1, 2 ] } ]
output [ { name: "C" data_type: TYPE_FP32 dims: [ 2 ] } ]
""",
    "unbatched": """
backend: "python"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "B" data_type: TYPE_INT64 dims: [ 1, 2 ] } ]
output [ { name: "C" data_type: TYPE_FP32 dims: [ 2 ] } ]
""",
    "variable": """
backend: "python"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "B" data_type: TYPE_INT64 dims: [ 1, -1 ] } ]
output [ { name: "C" data_type: TYPE_FP32 dims: [ 2 ] } ]
""",
}


def _outcome(spec, request: InferRequest):
    """What validation makes of a request: the batch size and the arrays, or the error's words."""
    try:
        batch = validate_request(spec, request)
    except InvalidArgument as exc:
        return "error", exc.message
    return batch, [(t.name, t.data.dtype.str, t.data.shape, t.data.tobytes()) for t in request.inputs]


_tensor = st.tuples(st.sampled_from(["A", "B", "C"]), st.sampled_from(["FP32", "INT64", "BYTES"]),
                    st.lists(st.integers(-1, 5), max_size=4).map(tuple), st.integers(0, 64))



_DECLARED = (("A", "FP32", 4), ("B", "INT64", 8))  # name, datatype, bytes per element, as every config declares


@st.composite
def _near_declared(draw, spec) -> list[tuple]:
    """The declared inputs, each part of each kept or changed (name, datatype, shape, size), maybe one more."""
    batched = spec.max_batch_size > 0
    batch = draw(st.integers(-1, 6))
    tensors = []
    for name, datatype, itemsize in _DECLARED:
        dims = tuple(draw(st.integers(-1, 3)) if d == -1 else d for d in spec.input(name).dims)  # -1: any size
        lead = (batch if draw(st.booleans()) else draw(st.integers(-1, 6)),) if batched else ()
        shape = (*lead, *dims) if draw(st.integers(0, 4)) else draw(st.lists(st.integers(-1, 3), max_size=3).map(tuple))
        elements = max(lead[0], 0) if lead else 1
        for d in dims:
            elements *= max(d, 0)
        size = elements * itemsize + (0 if draw(st.integers(0, 3)) else draw(st.integers(-4, 4)))
        tensors.append((name if draw(st.integers(0, 5)) else draw(st.sampled_from(["A", "B", "C"])),
                        datatype if draw(st.integers(0, 5)) else draw(st.sampled_from(["FP32", "INT64", "BYTES"])),
                        shape, max(size, 0)))
    if not draw(st.integers(0, 5)):
        tensors[1] = tensors[0]  # one input twice
    return tensors + draw(st.lists(_tensor, max_size=1))


@settings(max_examples=600, deadline=None)
@given(data=st.data(), config=st.sampled_from(sorted(CONFIGS)))
def test_the_one_pass_check_decides_as_the_full_checks(data, config):
    exact = parse_model_config(CONFIGS[config], "m")
    full = copy.copy(exact)
    object.__setattr__(full, "exact_inputs", {})  # the full checks only
    assert exact.exact_inputs and not full.exact_inputs
    tensors = data.draw(st.one_of(_near_declared(exact), st.lists(_tensor, max_size=3)))
    requests = [InferRequest("m", inputs=[InferTensor(name, datatype, shape, None, raw=bytes(range(size)))
                                          for name, datatype, shape, size in tensors]) for _ in range(2)]
    assert _outcome(exact, requests[0]) == _outcome(full, requests[1])


@pytest.mark.parametrize("a_shape", [(0, -1), (0, 1 << 41), (1, 2.0)])
def test_a_free_dim_the_full_checks_refuse_is_refused(a_shape):
    """Beside a zero the byte size cannot tell: a -1 (not specified), an absurd size, a dim that is not an int."""
    exact = parse_model_config(CONFIGS["variable"], "m")
    full = copy.copy(exact)
    object.__setattr__(full, "exact_inputs", {})
    requests = [InferRequest("m", inputs=[InferTensor("A", "FP32", a_shape, None, raw=b""),
                                          InferTensor("B", "INT64", (a_shape[0], 1, 0), None, raw=b"")])
                for _ in range(2)]
    outcome = _outcome(full, requests[1])
    assert outcome[0] == "error"
    assert _outcome(exact, requests[0]) == outcome


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_a_request_in_the_declared_form_gets_its_arrays(config):
    spec = parse_model_config(CONFIGS[config], "m")
    lead = (3,) if spec.max_batch_size else ()
    a, b = np.arange(6 if lead else 2, dtype=np.float32), np.arange(6 if lead else 2, dtype=np.int64)
    request = InferRequest("m", inputs=[InferTensor("A", "FP32", (*lead, 2), None, raw=a.tobytes()),
                                        InferTensor("B", "INT64", (*lead, 1, 2), None, raw=b.tobytes())])
    assert validate_request(spec, request) == (3 if lead else 1)
    np.testing.assert_array_equal(request.inputs[0].data, a.reshape(*lead, 2))
    np.testing.assert_array_equal(request.inputs[1].data, b.reshape(*lead, 1, 2))
    assert all(t.raw is None for t in request.inputs)
