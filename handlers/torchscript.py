"""TorchScript handler: ``torch.jit.load``, on CUDA when present.

Tensors map to the model's positional arguments and return values in the
order the config lists them (Triton's ``INPUT__0`` / ``OUTPUT__0`` convention).

Parameters as Triton's pytorch backend names them: ``INFERENCE_MODE`` (default true: ``torch.inference_mode``,
else ``torch.no_grad``), ``DISABLE_OPTIMIZED_EXECUTION``, ``ENABLE_JIT_EXECUTOR``, ``ENABLE_JIT_PROFILING``,
``INTRA_OP_THREAD_COUNT``, ``INTER_OP_THREAD_COUNT`` (these four are process-wide in torch, as in Triton),
``ENABLE_CACHE_CLEANING`` (empty the CUDA cache after each execution); ``ENABLE_NVFUSER`` and
``ENABLE_WEIGHT_SHARING`` are accepted and have no effect here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from handlers.base import HandlerContext, TensorHandler, parameter_flag, require_module
from runtime.errors import InternalError, ModelLoadError

_ACCEPTED = {"INFERENCE_MODE", "DISABLE_OPTIMIZED_EXECUTION", "ENABLE_JIT_EXECUTOR", "ENABLE_JIT_PROFILING",
             "INTRA_OP_THREAD_COUNT", "INTER_OP_THREAD_COUNT", "ENABLE_CACHE_CLEANING", "ENABLE_NVFUSER",
             "ENABLE_WEIGHT_SHARING"}


def _flag(parameters: dict[str, str], name: str, default: bool) -> bool:
    value = parameters.get(name, "")
    return parameter_flag(value, name) if value.strip() else default


def apply_torch_parameters(torch, parameters: dict[str, str]) -> None:
    """The process-wide settings (TorchScript executor, thread pools) the config asks for."""
    if "DISABLE_OPTIMIZED_EXECUTION" in parameters:
        torch._C._set_graph_executor_optimize(not _flag(parameters, "DISABLE_OPTIMIZED_EXECUTION", False))
    if "ENABLE_JIT_EXECUTOR" in parameters:
        torch._C._jit_set_profiling_executor(_flag(parameters, "ENABLE_JIT_EXECUTOR", True))
    if "ENABLE_JIT_PROFILING" in parameters:
        torch._C._jit_set_profiling_mode(_flag(parameters, "ENABLE_JIT_PROFILING", True))
    for name, setter in (("INTRA_OP_THREAD_COUNT", torch.set_num_threads),
                         ("INTER_OP_THREAD_COUNT", torch.set_num_interop_threads)):
        value = parameters.get(name, "").strip()
        if not value:
            continue
        if not value.isdigit() or int(value) < 1:
            raise ModelLoadError(f"parameter '{name}' must be a positive whole number, not '{value}'")
        try:
            setter(int(value))
        except RuntimeError:
            pass  # torch fixes its inter-op pool at first use: the first model's setting stays, as in Triton


class TorchScriptHandler(TensorHandler):
    def __init__(self, context: HandlerContext) -> None:
        super().__init__(context)
        self.module: Any = None  # the loaded ScriptModule
        self._torch: Any = None  # torch, imported at load
        self._inference_mode = True
        self._clean_cache = False

    def load(self) -> None:
        torch = require_module("torch", "torch", "pytorch")

        self._torch = torch
        parameters = {key: value for key, value in self.spec.parameters.items() if key in _ACCEPTED}
        apply_torch_parameters(torch, parameters)
        self._inference_mode = _flag(parameters, "INFERENCE_MODE", True)
        self._clean_cache = _flag(parameters, "ENABLE_CACHE_CLEANING", False)
        path = self.context.require_model_file()
        for tensor in (*self.spec.inputs, *self.spec.outputs):
            if tensor.datatype == "BYTES":
                raise ModelLoadError(f"TorchScript models do not take BYTES tensors ('{tensor.name}')")
        if self.context.gpu_allowed and torch.cuda.is_available():
            self.device = f"cuda:{self.context.device_id}"
        try:
            self.module = torch.jit.load(str(path), map_location=self.device)
        except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError and others
            raise ModelLoadError(f"torch.jit.load failed: {exc}") from None
        self.module.eval()

    def prepare(self, inputs: dict[str, np.ndarray]) -> list:
        torch = self._torch
        arguments = []
        for spec in self.spec.inputs:
            if spec.name in inputs:
                array = inputs[spec.name]
                if not array.flags.writeable or not array.flags.c_contiguous:
                    array = np.array(array, order="C")
                arguments.append(torch.from_numpy(array).to(self.device))
        return arguments

    def infer(self, arguments: list):
        torch = self._torch
        try:
            with torch.inference_mode() if self._inference_mode else torch.no_grad():
                return self.module(*arguments)
        except Exception as exc:  # noqa: BLE001
            raise InternalError(f"TorchScript execution failed: {exc}") from None
        finally:
            if self._clean_cache and self.device.startswith("cuda"):
                torch.cuda.empty_cache()

    def collect(self, result) -> dict[str, np.ndarray]:
        if isinstance(result, dict):
            values = [result.get(spec.name) for spec in self.spec.outputs]
        elif isinstance(result, (list, tuple)):
            values = list(result)
        else:
            values = [result]
        if len(values) < len(self.spec.outputs) or any(v is None for v in values):
            raise InternalError(
                f"TorchScript model returned {len(values)} outputs, config declares {len(self.spec.outputs)}"
            )
        return {
            spec.name: value.detach().to("cpu").numpy()  # type: ignore[union-attr]  # None refused above
            for spec, value in zip(self.spec.outputs, values, strict=False)
        }

    def unload(self, deadline: float | None = None) -> None:
        self.module = None
        if self._torch is not None and self.device.startswith("cuda"):
            self._torch.cuda.empty_cache()  # torch's allocator keeps freed blocks: give the module's back to the GPU
