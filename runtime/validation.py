"""Checks a request against its model's config before anything runs."""

from __future__ import annotations

from runtime.config import ModelSpec, TensorSpec
from runtime.errors import InvalidArgument
from runtime.types import InferRequest


def shape_matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def expected_shape(spec: ModelSpec, tensor: TensorSpec) -> list[int]:
    """The full shape a client must send, with -1 for the batch dim."""
    return ([-1] if spec.max_batch_size > 0 else []) + list(tensor.dims)


def validate_request(spec: ModelSpec, request: InferRequest) -> int:
    """Validate inputs and requested outputs; returns the batch size (1 without batching)."""
    model = spec.name
    seen: set[str] = set()
    batch_sizes: set[int] = set()
    for tensor in request.inputs:
        declared = spec.input(tensor.name)
        if declared is None:
            raise InvalidArgument(f"unexpected inference input '{tensor.name}' for model '{model}'")
        if tensor.name in seen:
            raise InvalidArgument(f"input '{tensor.name}' appears more than once in the request")
        seen.add(tensor.name)
        if tensor.datatype != declared.datatype:
            raise InvalidArgument(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{model}' expects '{declared.datatype}'"
            )
        shape = tuple(tensor.shape)
        if spec.max_batch_size > 0:
            if len(shape) < 1 or not shape_matches(shape[1:], declared.dims):
                raise InvalidArgument(
                    f"unexpected shape for input '{tensor.name}' for model '{model}'. "
                    f"Expected {expected_shape(spec, declared)}, got {list(shape)}"
                )
            batch_sizes.add(shape[0])
        elif not shape_matches(shape, declared.dims):
            raise InvalidArgument(
                f"unexpected shape for input '{tensor.name}' for model '{model}'. "
                f"Expected {list(declared.dims)}, got {list(shape)}"
            )
    missing = [t.name for t in spec.inputs if not t.optional and t.name not in seen]
    if missing:
        raise InvalidArgument(
            f"expected {sum(not t.optional for t in spec.inputs)} inputs but got {len(seen)} inputs "
            f"for model '{model}': missing {missing}"
        )
    for output in request.outputs:
        if spec.output(output.name) is None and spec.outputs:
            raise InvalidArgument(f"unexpected inference output '{output.name}' for model '{model}'")
    if len({o.name for o in request.outputs}) != len(request.outputs):
        raise InvalidArgument("an output is requested more than once")
    if spec.max_batch_size == 0:
        return 1
    if len(batch_sizes) > 1:
        raise InvalidArgument(f"inputs of model '{model}' have different batch sizes {sorted(batch_sizes)}")
    batch = batch_sizes.pop() if batch_sizes else 1
    if batch < 1 or batch > spec.max_batch_size:
        raise InvalidArgument(
            f"inference request batch-size must be <= {spec.max_batch_size} for '{model}', got {batch}"
        )
    return batch
