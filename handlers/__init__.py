"""Per-backend model handlers, selected by the config's platform/backend."""

from __future__ import annotations

from handlers.base import HandlerContext, ModelHandler, RequestResult, TensorHandler


def handler_class(handler_name: str) -> type[ModelHandler]:
    """The handler class for ``onnxruntime``, ``pytorch`` or ``python`` (imported lazily)."""
    if handler_name == "onnxruntime":
        from handlers.onnx import OnnxRuntimeHandler

        return OnnxRuntimeHandler
    if handler_name == "pytorch":
        from handlers.torchscript import TorchScriptHandler

        return TorchScriptHandler
    if handler_name == "python":
        from handlers.python import PythonBackendHandler

        return PythonBackendHandler
    raise ValueError(f"no handler named '{handler_name}'")


__all__ = ["HandlerContext", "ModelHandler", "RequestResult", "TensorHandler", "handler_class"]
