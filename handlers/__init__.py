"""Per-backend model handlers, selected by the config's platform/backend.

Nothing is imported here beyond what is asked for: a Python-backend worker process imports
``handlers.python.worker`` and must not pay for the server side (protocol stubs, ONNX Runtime, torch).
"""

from __future__ import annotations

import importlib
import logging
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
# handler name -> the framework its module imports only as a model loads
_FRAMEWORKS = {"onnxruntime": "onnxruntime", "pytorch": "torch", "tensorflow_savedmodel": "tensorflow",
               "tensorflow_graphdef": "tensorflow", "tensorrt": "tensorrt", "openvino": "openvino"}

logger = logging.getLogger(__name__)


def handler_class(handler_name: str) -> type[ModelHandler]:
    """The handler class for a handler name (see runtime/config/pbtxt.py), imported only when asked for."""
    if handler_name not in _HANDLERS:
        raise ValueError(f"no handler named '{handler_name}'")
    module, name = _HANDLERS[handler_name]
    return getattr(importlib.import_module(module), name)


def import_ahead(handler_name: str) -> bool:
    """Import a handler's module and its framework before any model of it loads (a cold start's download still
    running); False where one cannot be imported here: the load then says why."""
    if handler_name not in _HANDLERS:
        return False
    try:
        importlib.import_module(_HANDLERS[handler_name][0])
        if handler_name in _FRAMEWORKS:
            importlib.import_module(_FRAMEWORKS[handler_name])
    except Exception:  # noqa: BLE001 - ahead of a load, which reports what is missing
        logger.debug("not imported ahead: the %s backend", handler_name, exc_info=True)
        return False
    return True
