"""Per-backend model handlers, selected by the config's platform/backend.

Nothing is imported here beyond what is asked for: a Python-backend worker process imports
``handlers.python.worker`` and must not pay for the server side (protocol stubs, ONNX Runtime, torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from handlers.base import ModelHandler

# handler name (runtime/config/pbtxt.py) -> (module, class), imported only when a model of that kind loads
_HANDLERS = {
    "onnxruntime": ("handlers.onnx.handler", "OnnxRuntimeHandler"),
    "pytorch": ("handlers.torchscript", "TorchScriptHandler"),
    "tensorflow_savedmodel": ("handlers.tensorflow", "SavedModelHandler"),
    "tensorflow_graphdef": ("handlers.tensorflow", "GraphDefHandler"),
    "tensorrt": ("handlers.tensorrt", "TensorRtHandler"),
    "openvino": ("handlers.openvino", "OpenVinoHandler"),
    "python": ("handlers.python.backend", "PythonBackendHandler"),
}


def handler_class(handler_name: str) -> type[ModelHandler]:
    """The handler class for a handler name (see runtime/config/pbtxt.py), imported only when asked for."""
    if handler_name not in _HANDLERS:
        raise ValueError(f"no handler named '{handler_name}'")
    module, name = _HANDLERS[handler_name]
    return getattr(importlib.import_module(module), name)
