"""ONNX Runtime handler: CUDA execution provider when present (TensorRT or OpenVINO when the config asks for
them: handlers/onnx/options.py), CPU otherwise."""

from __future__ import annotations

import logging
import mmap
from pathlib import Path
from typing import Any

import numpy as np

from handlers.base import HandlerContext, TensorHandler, require_module
from handlers.onnx.environment import quiet_onnxruntime
from handlers.onnx.options import session_plan
from runtime.datatypes import as_bytes_array
from runtime.errors import InternalError, ModelLoadError

logger = logging.getLogger(__name__)

_DATATYPE_BY_ORT_TYPE = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


def _tensors(model) -> list:
    """Every TensorProto of an ONNX model that could hold data: initializers (dense and sparse),
    Constant-style attributes (dense and sparse), in the main graph, subgraphs and function bodies."""
    tensors: list = []
    node_lists = [function.node for function in model.functions]
    graphs = [model.graph]
    while graphs or node_lists:
        if graphs:
            graph = graphs.pop()
            tensors.extend(graph.initializer)
            for sparse in graph.sparse_initializer:
                tensors += [sparse.values, sparse.indices]
            node_lists.append(graph.node)
            continue
        for node in node_lists.pop():
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    tensors.append(attribute.t)
                tensors.extend(attribute.tensors)
                sparse_tensors = list(attribute.sparse_tensors)
                if attribute.HasField("sparse_tensor"):
                    sparse_tensors.append(attribute.sparse_tensor)
                for sparse in sparse_tensors:
                    tensors += [sparse.values, sparse.indices]
                if attribute.HasField("g"):
                    graphs.append(attribute.g)
                graphs.extend(attribute.graphs)
    return tensors


# An external tensor names its file in an ``external_data`` entry whose key (field 1, 8 bytes) is "location".
_LOCATION_KEY = b"\x0a\x08location"


def _may_have_external_data(model_path: Path) -> bool:
    """Whether the file holds the bytes every external-data location entry starts with. A plain scan of the mapped
    file: far cheaper than importing ``onnx`` and parsing the whole model again only to find none."""
    try:
        with model_path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(_LOCATION_KEY) != -1
    except (OSError, ValueError):  # unreadable or empty: the parse below reports it
        return True


def check_external_data(model_path: Path) -> None:
    """Refuse ONNX external-data references that resolve outside the model's folder."""
    if not _may_have_external_data(model_path):
        return
    onnx = require_module("onnx", "onnx", "onnxruntime")

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - any parse failure is a load failure
        raise ModelLoadError(f"cannot parse ONNX model: {type(exc).__name__}: {exc}") from None
    folder = model_path.parent.resolve()
    for tensor in _tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (folder / location).resolve()
        if not location or not target.is_relative_to(folder):
            raise ModelLoadError(
                f"ONNX tensor '{tensor.name}' refers to external data outside the model folder"
            )


class OnnxRuntimeHandler(TensorHandler):
    """Runs ``model.onnx`` with an onnxruntime InferenceSession."""

    def __init__(self, context: HandlerContext) -> None:
        super().__init__(context)
        self.session: Any = None  # an onnxruntime InferenceSession, once loaded
        self._output_names: list[str] = []
        self._string_inputs: set[str] = set()
        self._run_options: Any = None

    def load(self) -> None:
        quiet_onnxruntime()  # before its first import (handlers/onnx/environment.py)
        ort = require_module("onnxruntime", "onnx", "onnxruntime")

        path = self.context.require_model_file()
        check_external_data(path)
        plan = session_plan(ort, self.spec.proto, self.spec.parameters, self.context.gpu_allowed,
                            self.context.device_id)
        try:
            self.session = ort.InferenceSession(str(path), sess_options=plan.options, providers=plan.providers)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises several types
            raise ModelLoadError(f"onnxruntime could not load the model: {exc}") from None
        if plan.run_entries:
            self._run_options = ort.RunOptions()
            for key, value in plan.run_entries.items():
                self._run_options.add_run_config_entry(key, value)
        used = self.session.get_providers()
        self.device = f"cuda:{self.context.device_id}" if "CUDAExecutionProvider" in used else "cpu"
        self._check_against_config()

    def _check_against_config(self) -> None:
        spec = self.spec
        batch_rank = 1 if spec.max_batch_size > 0 else 0
        session_inputs = {i.name: i for i in self.session.get_inputs()}
        session_outputs = {o.name: o for o in self.session.get_outputs()}
        for kind, declared, actual in (
            ("input", spec.inputs, session_inputs),
            ("output", spec.outputs, session_outputs),
        ):
            for tensor in declared:
                node = actual.get(tensor.name)
                if node is None:
                    raise ModelLoadError(
                        f"config {kind} '{tensor.name}' is not in the ONNX model "
                        f"(it has {sorted(actual)})"
                    )
                model_type = _DATATYPE_BY_ORT_TYPE.get(node.type)
                if model_type != tensor.datatype:
                    raise ModelLoadError(
                        f"config {kind} '{tensor.name}' is {tensor.datatype} but the model's is {node.type}"
                    )
                dims = tensor.reshape if tensor.reshape is not None else tensor.dims
                if node.shape and len(node.shape) != batch_rank + len(dims):
                    raise ModelLoadError(
                        f"config {kind} '{tensor.name}' has rank {batch_rank + len(dims)} "
                        f"(with batch dim) but the model's has rank {len(node.shape)}"
                    )
        sequence = spec.sequence
        filled = {c.name for c in sequence.controls} | {s.input_name for s in sequence.states} if sequence else set()
        declared_inputs = {t.name for t in spec.inputs} | filled  # control and state inputs: the server fills them
        missing = sorted(set(session_inputs) - declared_inputs)
        if missing:
            raise ModelLoadError(f"ONNX model inputs {missing} are not in the config")
        self._output_names = [t.name for t in spec.outputs]
        if sequence:  # state outputs too: the sequence scheduler takes them out of each result
            self._output_names += [s.output_name for s in sequence.states if s.output_name in session_outputs]
        self._string_inputs = {t.name for t in spec.inputs if t.datatype == "BYTES"}

    def prepare(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {
            name: (
                np.vectorize(lambda b: b.decode("utf-8", "replace"), otypes=[object])(array)
                if name in self._string_inputs
                else array
            )
            for name, array in inputs.items()
        }

    def infer(self, feeds: dict[str, np.ndarray]) -> list:
        try:
            return self.session.run(self._output_names, feeds, self._run_options)
        except Exception as exc:  # noqa: BLE001
            raise InternalError(f"onnxruntime execution failed: {exc}") from None

    def collect(self, results: list) -> dict[str, np.ndarray]:
        return {name: as_bytes_array(array) if array.dtype == np.object_ else array
                for name, array in zip(self._output_names, results, strict=True)}

    def unload(self, deadline: float | None = None) -> None:
        self.session = None
