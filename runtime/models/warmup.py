"""Triton's ``model_warmup``: synthetic requests a version must answer before it is ready."""

from __future__ import annotations

import numpy as np

from runtime.config.spec import ModelSpec
from runtime.datatypes import array_from_buffer, config_type_to_datatype, element_count, numpy_dtype
from runtime.errors import ModelLoadError, ServingError
from runtime.protocol import model_config_pb2
from runtime.types import InferRequest, InferTensor

WARMUP_FOLDER = "warmup"


def _warmup_array(name: str, spec_input, batch_size: int, max_batch_size: int, model_dir) -> InferTensor:
    datatype = config_type_to_datatype(model_config_pb2.DataType.Name(spec_input.data_type))
    dims = [int(d) for d in spec_input.dims]
    shape = ([batch_size] if max_batch_size > 0 else []) + dims
    count = element_count(shape)
    which = spec_input.WhichOneof("input_data_type")
    if which == "input_data_file":
        folder = (model_dir / WARMUP_FOLDER).resolve()
        path = (folder / spec_input.input_data_file).resolve()
        if not path.is_relative_to(folder) or not path.is_file():
            raise ModelLoadError(f"warmup input '{name}': no file '{spec_input.input_data_file}' in warmup/")
        data = array_from_buffer(datatype, shape, path.read_bytes())
    elif datatype == "BYTES":
        data = np.array([b"\0" * 4] * count, dtype=np.object_).reshape(shape)
    elif which == "random_data":
        dtype = numpy_dtype(datatype)
        rng = np.random.default_rng(0)
        data = (rng.random(count) > 0.5) if datatype == "BOOL" else (rng.random(count) * 10).astype(dtype)
        data = data.reshape(shape)
    else:
        data = np.zeros(shape, dtype=numpy_dtype(datatype))
    return InferTensor(name=name, datatype=datatype, shape=tuple(shape), data=data)


def warmup_requests(spec: ModelSpec, model_dir) -> list[tuple[str, InferRequest, int]]:
    """(warmup name, request, repetitions) for each ``model_warmup`` entry of the config."""
    result = []
    for warmup in spec.proto.model_warmup:
        batch_size = max(1, warmup.batch_size)
        inputs = [
            _warmup_array(name, spec_input, batch_size, spec.max_batch_size, model_dir)
            for name, spec_input in sorted(warmup.inputs.items())
        ]
        request = InferRequest(model_name=spec.name, id=f"warmup-{warmup.name}", inputs=inputs)
        result.append((warmup.name or "warmup", request, max(1, warmup.count)))
    return result


def run_warmup(spec: ModelSpec, model_dir, instance) -> None:
    """Run each warm-up request on ``instance``; ModelLoadError if any fails."""
    for name, request, repetitions in warmup_requests(spec, model_dir):
        for _ in range(repetitions):
            (result,) = instance.execute([request])
            if isinstance(result, ServingError):
                raise ModelLoadError(f"warmup '{name}' failed: {result.message}")
