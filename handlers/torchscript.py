"""TorchScript handler: ``torch.jit.load``, on CUDA when present.

Tensors map to the model's positional arguments and return values in the
order the config lists them (Triton's ``INPUT__0`` / ``OUTPUT__0`` convention).
"""

from __future__ import annotations

import numpy as np

from handlers.base import HandlerContext, TensorHandler, require_module
from runtime.errors import InternalError, ModelLoadError


class TorchScriptHandler(TensorHandler):
    def __init__(self, context: HandlerContext) -> None:
        super().__init__(context)
        self.module = None
        self._torch = None

    def load(self) -> None:
        torch = require_module("torch", "torch", "pytorch")

        self._torch = torch
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
        try:
            with self._torch.inference_mode():
                return self.module(*arguments)
        except Exception as exc:  # noqa: BLE001
            raise InternalError(f"TorchScript execution failed: {exc}") from None

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
            spec.name: value.detach().to("cpu").numpy()
            for spec, value in zip(self.spec.outputs, values, strict=False)
        }

    def unload(self, deadline: float | None = None) -> None:
        self.module = None
