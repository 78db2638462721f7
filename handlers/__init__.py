"""Per-backend model handlers, selected by the config's platform/backend.

Nothing is imported here beyond what is asked for: a Python-backend worker process imports
``handlers.python.worker`` and must not pay for the server side (protocol stubs, ONNX Runtime, torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from handlers.base import ModelHandler


def handler_class(handler_name: str) -> type[ModelHandler]:
    """The handler class for a handler name (see runtime/config.py), imported only when asked for."""
    if handler_name == "onnxruntime":
        from handlers.onnx import OnnxRuntimeHandler

        return OnnxRuntimeHandler
    if handler_name == "pytorch":
        from handlers.torchscript import TorchScriptHandler

        return TorchScriptHandler
    if handler_name == "tensorflow_savedmodel":
        from handlers.tensorflow import SavedModelHandler

        return SavedModelHandler
    if handler_name == "tensorflow_graphdef":
        from handlers.tensorflow import GraphDefHandler

        return GraphDefHandler
    if handler_name == "tensorrt":
        from handlers.tensorrt import TensorRtHandler

        return TensorRtHandler
    if handler_name == "openvino":
        from handlers.openvino import OpenVinoHandler

        return OpenVinoHandler
    if handler_name == "python":
        from handlers.python.backend import PythonBackendHandler

        return PythonBackendHandler
    raise ValueError(f"no handler named '{handler_name}'")
