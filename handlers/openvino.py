"""OpenVINO handler (Triton's ``backend: "openvino"``): ``model.xml`` with its ``model.bin``, on the CPU plugin.

Parameters as Triton's OpenVINO backend names them: ``INFERENCE_NUM_THREADS``, ``NUM_STREAMS`` and
``PERFORMANCE_HINT`` (``LATENCY`` / ``THROUGHPUT``) go to the compiled model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from handlers.base import HandlerContext, TensorHandler, require_module
from runtime.datatypes import datatype_of
from runtime.errors import InternalError, ModelLoadError

# Triton's OpenVINO backend parameters -> OpenVINO properties
_PROPERTIES = {"INFERENCE_NUM_THREADS": "INFERENCE_NUM_THREADS", "NUM_STREAMS": "NUM_STREAMS",
               "PERFORMANCE_HINT": "PERFORMANCE_HINT"}


class OpenVinoHandler(TensorHandler):
    """Runs an OpenVINO IR model (``model.xml`` + ``model.bin``) with one infer request per instance."""

    def __init__(self, context: HandlerContext) -> None:
        super().__init__(context)
        self.compiled: Any = None  # OpenVINO's CompiledModel and its InferRequest, once loaded
        self.request: Any = None
        self._outputs: list = []

    def load(self) -> None:
        ov = require_module("openvino", "openvino", "openvino")
        path = self.context.require_model_file()
        for tensor in (*self.spec.inputs, *self.spec.outputs):
            if tensor.datatype == "BYTES":
                raise ModelLoadError(f"the openvino backend does not take BYTES tensors ('{tensor.name}')")
        weights = path.with_suffix(".bin")
        if not weights.is_file():
            raise ModelLoadError(f"model '{self.spec.name}' version {self.context.version}: missing weights file "
                                 f"'{weights.name}' beside '{path.name}'")
        properties = {}
        for parameter, key in _PROPERTIES.items():
            value = self.spec.parameters.get(parameter, "")
            if value:
                properties[key] = int(value) if value.isdigit() else value
        core = ov.Core()
        try:
            model = core.read_model(str(path), str(weights))
            self.compiled = core.compile_model(model, "CPU", properties)
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises RuntimeError and its own types
            raise ModelLoadError(f"OpenVINO could not load the model: {exc}") from None
        self._check_against_config(model)
        self._outputs = [self.compiled.output(tensor.name) for tensor in self.spec.outputs]
        self.request = self.compiled.create_infer_request()

    def _check_against_config(self, model) -> None:
        batch_rank = 1 if self.spec.max_batch_size > 0 else 0
        for kind, declared, ports in (("input", self.spec.inputs, model.inputs),
                                      ("output", self.spec.outputs, model.outputs)):
            by_name = {name: port for port in ports for name in port.get_names()}
            for tensor in declared:
                port = by_name.get(tensor.name)
                if port is None:
                    raise ModelLoadError(f"config {kind} '{tensor.name}' is not in the OpenVINO model "
                                         f"(it has {sorted(by_name)})")
                element = port.get_element_type()
                model_type = datatype_of(np.empty(0, dtype=element.to_dtype()))
                if model_type != tensor.datatype:
                    raise ModelLoadError(f"config {kind} '{tensor.name}' is {tensor.datatype} but the model's is "
                                         f"{element.get_type_name()}")
                dims = tensor.reshape if tensor.reshape is not None else tensor.dims
                rank = port.get_partial_shape().rank
                if rank.is_static and rank.get_length() != batch_rank + len(dims):
                    raise ModelLoadError(f"config {kind} '{tensor.name}' has rank {batch_rank + len(dims)} (with "
                                         f"batch dim) but the model's has rank {rank.get_length()}")
        names = {tensor.name for tensor in self.spec.inputs}
        missing = sorted(port.get_any_name() for port in model.inputs if not set(port.get_names()) & names)
        if missing:
            raise ModelLoadError(f"OpenVINO model inputs {missing} are not in the config")

    def prepare(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: np.ascontiguousarray(array) for name, array in inputs.items()}

    def infer(self, feeds: dict[str, np.ndarray]):
        try:
            return self.request.infer(feeds)
        except Exception as exc:  # noqa: BLE001
            raise InternalError(f"OpenVINO execution failed: {exc}") from None

    def collect(self, results) -> dict[str, np.ndarray]:
        # copies: the infer request reuses its output buffers on the next execution
        return {tensor.name: np.array(results[port]) for tensor, port in zip(self.spec.outputs, self._outputs,
                                                                              strict=True)}

    def unload(self, deadline: float | None = None) -> None:
        self.request = None
        self.compiled = None
