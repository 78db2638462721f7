"""Triton's auto-complete for ONNX models: inputs, outputs and batching read from ``model.onnx``.

As Triton's onnxruntime backend does (unless ``--disable-auto-complete-config``): when a config lacks inputs or
outputs, those it does not declare are filled in from the model's graph (name, data type, dims); a model whose
every input and output has a variable first dimension can batch, and when the config says ``max_batch_size: 0``
(or nothing) it gets the default maximum batch size, 4, and, without another scheduler, the dynamic batcher. A
model without ``config.pbtxt`` at all is completed the same way. The graph is read with ``onnx`` (no session).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.config.layout import newest_model_file
from runtime.errors import ModelLoadError
from runtime.protocol.model_config_pb2 import DataType, ModelConfig

DEFAULT_MAX_BATCH_SIZE = 4  # Triton's --backend-config=onnxruntime,default-max-batch-size default
ONNX_MODEL_FILE = "model.onnx"

_CONFIG_TYPE_BY_ONNX = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16",
                        6: "TYPE_INT32", 7: "TYPE_INT64", 8: "TYPE_STRING", 9: "TYPE_BOOL", 10: "TYPE_FP16",
                        11: "TYPE_FP64", 12: "TYPE_UINT32", 13: "TYPE_UINT64", 16: "TYPE_BF16"}


def _tensors(values: Any) -> list[tuple[str, str, list[int]]]:
    tensors = []
    for value in values:
        tensor_type = value.type.tensor_type
        config_type = _CONFIG_TYPE_BY_ONNX.get(tensor_type.elem_type)
        if config_type is None:
            raise ModelLoadError(f"cannot auto-complete '{value.name}': ONNX element type {tensor_type.elem_type} "
                                 "has no Triton data type")
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
        tensors.append((value.name, config_type, dims))
    return tensors


def complete_onnx_config(config: ModelConfig, model_dir: Path) -> ModelConfig:
    """``config`` with what the ONNX model says filled in. A config that declares inputs and outputs is used as
    written (the model is not read; loading checks it against the model)."""
    if config.input and config.output:
        return config
    path = newest_model_file(model_dir, config.default_model_filename or ONNX_MODEL_FILE)
    if path is None:
        return config  # loading reports the missing file
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # noqa: BLE001 - any parse failure is a load failure
        raise ModelLoadError(f"cannot parse ONNX model: {type(exc).__name__}: {exc}") from None
    initializers = {initializer.name for initializer in graph.initializer}
    inputs = _tensors(value for value in graph.input if value.name not in initializers)
    outputs = _tensors(graph.output)
    declared_inputs = {tensor.name for tensor in config.input}
    declared_outputs = {tensor.name for tensor in config.output}
    if declared_inputs >= {name for name, _, _ in inputs} and declared_outputs >= {name for name, _, _ in outputs}:
        return config
    completed = ModelConfig()
    completed.CopyFrom(config)
    can_batch = all(dims and dims[0] == -1 for _, _, dims in (*inputs, *outputs))
    if completed.max_batch_size == 0 and can_batch and not declared_inputs and not declared_outputs:
        completed.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        if not completed.HasField("dynamic_batching") and not completed.HasField("sequence_batching"):
            completed.dynamic_batching.SetInParent()
    batched = completed.max_batch_size > 0
    for target, tensors, declared in ((completed.input, inputs, declared_inputs),
                                      (completed.output, outputs, declared_outputs)):
        for name, config_type, dims in tensors:
            if name in declared:
                continue
            if batched:
                dims = dims[1:]
            tensor = target.add(name=name, data_type=DataType.Value(config_type))
            if dims:
                tensor.dims.extend(dims)
            else:  # a scalar: Triton's form of it
                tensor.dims.append(1)
                tensor.reshape.SetInParent()
    return completed
