"""Checks a request against its model's config before anything runs, in Triton's order and words.

Triton keeps a request's inputs in a hash map whose iteration order, for the handful of inputs a
request has, is the reverse of the order they were added: where several inputs are wrong, the one
reported is the one Triton would report.  Inputs that arrived as raw bytes become arrays only once
their datatype, shape and byte size are known to be right.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from runtime.config.spec import ModelSpec, TensorSpec
from runtime.datatypes import DATATYPES, MAX_ELEMENTS, deserialize_bytes, element_count, numpy_dtype, wire_dtype
from runtime.errors import InvalidArgument
from runtime.extensions.classification import requested_count
from runtime.types import InferRequest, InferTensor

BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended "
    "to each input shape. If you want to specify the full shape including the batch dim in your input dims "
    "config, try setting max_batch_size to zero. See the model configuration docs for more info on "
    "max_batch_size."
)


def dims_text(dims) -> str:
    """Triton's DimsListToString: ``[-1,4]``."""
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


def names_text(names) -> str:
    """``['a','b']``; Triton drops the opening bracket of an empty list (``]``), so does this."""
    text = "[" + "".join(f"'{name}'," for name in names)
    return text[:-1] + "]"


def shape_matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def expected_shape(spec: ModelSpec, tensor: TensorSpec) -> list[int]:
    """The full shape a client must send, with -1 for the batch dim."""
    return ([-1] if spec.max_batch_size > 0 else []) + list(tensor.dims)


def request_label(request: InferRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "


def validate_request(spec: ModelSpec, request: InferRequest) -> int:
    """Validate inputs and requested outputs, turning raw input bytes into arrays; returns the batch size
    (1 without batching)."""
    model = spec.name
    batch = _exact_batch_size(spec, request)
    if batch is not None:
        if request.outputs:
            _check_outputs(spec, request, request_label(request))
        return batch
    label = request_label(request)
    if request.raw_input:
        _deduce_raw_input(spec, request, label)
    seen: set[str] = set()
    for tensor in request.inputs:
        if tensor.name in seen:
            raise InvalidArgument(f"{label}input '{tensor.name}' already exists in request")
        seen.add(tensor.name)
    _check_outputs(spec, request, label)
    inputs = list(reversed(request.inputs))  # Triton's iteration order
    required = [t for t in spec.inputs if not t.optional]
    if len(inputs) > len(spec.inputs) or len(inputs) < len(required):
        missing = [t.name for t in required if t.name not in seen]
        got = names_text(t.name for t in inputs) if inputs else "[]"
        if len(required) == len(spec.inputs):
            counts = f"expected {len(spec.inputs)} inputs"
        else:
            counts = f"expected number of inputs between {len(required)} and {len(spec.inputs)}"
        raise InvalidArgument(
            f"{label}{counts} but got {len(inputs)} inputs for model '{model}'. Got input(s) {got}, "
            f"but missing required input(s) {names_text(missing)}. Please provide all required input(s)."
        )
    batch = _batch_size(spec, inputs, label)
    for tensor in inputs:
        declared = spec.input(tensor.name)
        if declared is None:
            raise InvalidArgument(f"unexpected inference input '{tensor.name}' for model '{model}'")
        if tensor.datatype != declared.datatype:
            shown = tensor.datatype if tensor.datatype in DATATYPES else "<invalid>"
            raise InvalidArgument(
                f"{label}inference input '{tensor.name}' data-type is '{shown}', "
                f"but model '{model}' expects '{declared.datatype}'"
            )
        _check_shape(spec, declared, tensor, label)
    for tensor in inputs:
        _materialize(spec, tensor, label)
    return max(batch, 1) if spec.max_batch_size > 0 else 1


def _check_outputs(spec: ModelSpec, request: InferRequest, label: str) -> None:
    model = spec.name
    for output in request.outputs:
        declared_output = spec.output(output.name)
        if declared_output is None and spec.outputs:
            raise InvalidArgument(f"unexpected inference output '{output.name}' for model '{model}'")
        if output.parameters and requested_count(output.parameters) and declared_output is not None \
                and declared_output.datatype == "BYTES":
            raise InvalidArgument(f"{label}output '{output.name}' of model '{model}' is BYTES: classification "
                                  "needs numeric scores")


def _exact_batch_size(spec: ModelSpec, request: InferRequest) -> int | None:
    """The common request, checked in one pass: every declared input once, as raw bytes of its declared datatype,
    shape and byte size, the batch within bounds; its inputs then become arrays and the batch size is returned.
    None (nothing changed) for any other request: the full checks below decide it, and word the error."""
    exact = spec.exact_inputs
    inputs = request.inputs
    if not exact or len(inputs) != len(exact) or request.raw_input:
        return None
    batched = spec.max_batch_size > 0
    batch = -1
    for tensor in inputs:
        declared = exact.get(tensor.name)
        shape = tensor.shape
        if declared is None or declared.datatype != tensor.datatype or tensor.raw is None or type(shape) is not tuple:
            return None
        if batched:
            if not shape or not 0 <= shape[0] <= spec.max_batch_size or (batch != -1 and shape[0] != batch):
                return None
            batch = shape[0]
            dims = shape[1:]
        else:
            dims = shape
        if declared.row_bytes:
            if dims != declared.dims or len(tensor.raw) != (batch if batched else 1) * declared.row_bytes:
                return None
        elif not _fills(dims, declared.dims) or len(tensor.raw) != math.prod(shape) * declared.dtype.itemsize:
            return None
    if len({tensor.name for tensor in inputs}) != len(inputs):
        return None  # a name twice (and so another missing): the full checks word it
    for tensor in inputs:  # an array on the bytes in one call (frombuffer and reshape: twice the time)
        tensor.data = np.ndarray(tensor.shape, exact[tensor.name].dtype, tensor.raw)
        tensor.raw = None
    return max(batch, 1) if batched else 1


def _fills(dims: tuple, declared: tuple[int, ...]) -> bool:
    """Whether a request's dims match the declared ones (a -1 there taking any size), each an int the full checks
    take."""
    return shape_matches(dims, declared) and all(type(d) is int and 0 <= d <= MAX_ELEMENTS for d in dims)


def _deduce_raw_input(spec: ModelSpec, request: InferRequest, label: str) -> None:
    """A raw binary request's one input takes the name, datatype and shape of the model's one input."""
    if len(request.inputs) != 1 or len(spec.inputs) != 1:
        raise InvalidArgument(
            f"{label}Raw request must only have 1 input (found {len(request.inputs)}) to be deduced but got "
            f"{len(spec.inputs)} inputs in '{spec.name}' model configuration"
        )
    tensor, declared = request.inputs[0], spec.inputs[0]
    shape = [1] if spec.max_batch_size > 0 else []
    dynamic = [index for index, dim in enumerate(declared.dims) if dim == -1]
    if len(dynamic) > 1:
        raise InvalidArgument(f"{label}The shape of the raw input '{declared.name}' can not be deduced because "
                              "there are more than one variable-sized dimension")
    fixed = int(np.prod([d for d in declared.dims if d != -1], dtype=np.int64))
    shape += list(declared.dims)
    raw = tensor.raw if tensor.raw is not None else b""
    if declared.datatype == "BYTES":
        if dynamic or fixed != 1:
            raise InvalidArgument(f"{label}For BYTE datatype raw input '{declared.name}', the model must have "
                                  "input shape [1]")
        raw = struct.pack("<I", len(raw)) + bytes(raw)
    elif dynamic:
        itemsize = numpy_dtype(declared.datatype).itemsize
        shape[len(shape) - len(declared.dims) + dynamic[0]] = len(raw) // max(fixed, 1) // itemsize
    tensor.name, tensor.datatype, tensor.shape, tensor.raw = declared.name, declared.datatype, tuple(shape), raw


def _batch_size(spec: ModelSpec, inputs: list[InferTensor], label: str) -> int:
    if spec.max_batch_size == 0:
        return 0
    batch = 0
    for tensor in inputs:
        declared = spec.input(tensor.name)
        if declared is None:
            raise InvalidArgument(f"unexpected inference input '{tensor.name}' for model '{spec.name}'")
        if not tensor.shape:
            raise InvalidArgument(f"{label}input '{tensor.name}' has no shape but model requires batch dimension "
                                  f"for '{spec.name}'")
        if batch == 0:
            batch = tensor.shape[0]
        elif tensor.shape[0] != batch:
            raise InvalidArgument(f"{label}input '{tensor.name}' batch size does not match other inputs for "
                                  f"'{spec.name}'")
    if batch > spec.max_batch_size:
        raise InvalidArgument(f"{label}inference request batch-size must be <= {spec.max_batch_size} for "
                              f"'{spec.name}'")
    return batch


def _check_shape(spec: ModelSpec, declared: TensorSpec, tensor: InferTensor, label: str) -> None:
    shape = tuple(tensor.shape)
    dims = shape[1:] if spec.max_batch_size > 0 else shape
    if len(dims) == len(declared.dims):
        for actual, wanted in zip(dims, declared.dims, strict=True):
            if actual == -1:
                raise InvalidArgument(f"{label}All input dimensions should be specified for input '{tensor.name}' "
                                      f"for model '{spec.name}', got {dims_text(shape)}")
            if wanted != -1 and wanted != actual:
                break
        else:
            return
    note = BATCH_NOTE if spec.max_batch_size > 0 else ""
    raise InvalidArgument(
        f"{label}unexpected shape for input '{tensor.name}' for model '{spec.name}'. Expected "
        f"{dims_text(expected_shape(spec, declared))}, got {dims_text(shape)}. {note}"
    )


def _materialize(spec: ModelSpec, tensor: InferTensor, label: str) -> None:
    """Check the tensor's byte size against its shape and datatype, then give it its array."""
    count = element_count(tensor.shape)
    if tensor.datatype == "BYTES":
        if tensor.raw is not None:
            tensor.data = deserialize_bytes(tensor.raw, count, tensor.name).reshape(tensor.shape)
            tensor.raw = None
        elif tensor.data is not None and tensor.data.size != count:
            raise InvalidArgument(f"{label}expected {count} string elements for inference input '{tensor.name}' "
                                  f"for model '{spec.name}', got {tensor.data.size}")
        elif tensor.data is not None:
            tensor.data = tensor.data.reshape(tensor.shape)
        return
    dtype = wire_dtype(tensor.datatype)
    expected = count * dtype.itemsize
    actual = len(tensor.raw) if tensor.raw is not None else (tensor.data.nbytes if tensor.data is not None else 0)
    if actual != expected:
        raise InvalidArgument(f"{label}input byte size mismatch for input '{tensor.name}' for model '{spec.name}'. "
                              f"Expected {expected}, got {actual}")
    if tensor.raw is not None:
        tensor.data = np.frombuffer(tensor.raw, dtype=dtype).reshape(tensor.shape)
        tensor.raw = None
    elif tensor.data is not None:
        tensor.data = tensor.data.reshape(tensor.shape)
