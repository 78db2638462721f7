"""Triton-compatible Python backend: ``model.py`` with ``class TritonPythonModel``."""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
from types import ModuleType

import numpy as np

import triton_python_backend_utils as pb_utils
from handlers.base import HandlerContext, ModelHandler, RequestResult
from runtime.datatypes import as_bytes_array
from runtime.errors import InternalError, ModelLoadError, ServingError, Status
from runtime.types import InferRequest

logger = logging.getLogger(__name__)

_STATUS_BY_TRITON_CODE = {
    pb_utils.TritonError.INVALID_ARG: Status.INVALID_ARG,
    pb_utils.TritonError.NOT_FOUND: Status.NOT_FOUND,
    pb_utils.TritonError.UNAVAILABLE: Status.UNAVAILABLE,
    pb_utils.TritonError.UNSUPPORTED: Status.UNSUPPORTED,
    pb_utils.TritonError.ALREADY_EXISTS: Status.ALREADY_EXISTS,
    pb_utils.TritonError.CANCELLED: Status.CANCELLED,
}
_import_lock = threading.Lock()


def _import_model_module(context: HandlerContext) -> ModuleType:
    path = context.require_model_file()
    module_name = f"_triton_model_{context.spec.name}_{context.version}_{context.instance_index}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"cannot import '{context.spec.default_model_filename}'")
    module = importlib.util.module_from_spec(spec)
    version_dir = str(context.version_dir)
    with _import_lock:  # sys.path is process-wide
        sys.path.insert(0, version_dir)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001 - user code can raise anything
            raise ModelLoadError(f"model.py failed to import: {type(exc).__name__}: {exc}") from None
        finally:
            sys.path.remove(version_dir)
    return module


class PythonBackendHandler(ModelHandler):
    """Runs a user's TritonPythonModel in this process."""

    def __init__(self, context: HandlerContext) -> None:
        super().__init__(context)
        self.model = None
        self._lock = threading.Lock()  # Triton runs one execute at a time per instance

    def initialize_args(self) -> dict[str, str]:
        context = self.context
        return {
            "model_config": self.spec.to_json(),
            "model_instance_kind": "GPU" if self.device.startswith("cuda") else "CPU",
            "model_instance_name": f"{self.spec.name}_{context.instance_index}",
            "model_instance_device_id": str(context.device_id),
            "model_repository": str(context.model_dir),
            "model_version": str(context.version),
            "model_name": self.spec.name,
        }

    def load(self) -> None:
        module = _import_model_module(self.context)
        model_class = getattr(module, "TritonPythonModel", None)
        if model_class is None:
            raise ModelLoadError("model.py defines no class TritonPythonModel")
        try:
            self.model = model_class()
            if hasattr(self.model, "initialize"):
                self.model.initialize(self.initialize_args())
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"initialize failed: {type(exc).__name__}: {exc}") from None

    def _to_pb_request(self, request: InferRequest) -> pb_utils.InferenceRequest:
        return pb_utils.InferenceRequest(
            inputs=[pb_utils.Tensor(t.name, t.data) for t in request.inputs],
            request_id=request.id,
            requested_output_names=[o.name for o in request.outputs],
            parameters=request.parameters,
            model_name=self.spec.name,
            model_version=self.context.version,
        )

    def execute(self, requests: list[InferRequest]) -> list[RequestResult]:
        pb_requests = [self._to_pb_request(r) for r in requests]
        name = self.spec.name
        try:
            with self._lock:
                responses = self.model.execute(pb_requests)
        except Exception as exc:  # noqa: BLE001 - user code
            logger.warning("model '%s' execute raised %s: %s", name, type(exc).__name__, exc)
            error = InternalError(
                f"Failed to process the request(s) for model '{name}', message: {type(exc).__name__}: {exc}"
            )
            return [error] * len(requests)
        if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
            count = len(responses) if isinstance(responses, (list, tuple)) else type(responses).__name__
            error = InternalError(
                f"model '{name}' execute returned {count} responses for {len(requests)} requests"
            )
            return [error] * len(requests)
        return [self._result(response) for response in responses]

    def _result(self, response: object) -> RequestResult:
        if not isinstance(response, pb_utils.InferenceResponse):
            return InternalError(
                f"model '{self.spec.name}' returned a {type(response).__name__}, not an InferenceResponse"
            )
        if response.has_error():
            error = response.error()
            return ServingError(error.message(), _STATUS_BY_TRITON_CODE.get(error.code(), Status.INTERNAL))
        outputs: dict[str, np.ndarray] = {}
        for tensor in response.output_tensors():
            array = tensor.as_numpy()
            outputs[tensor.name()] = as_bytes_array(array) if array.dtype == np.object_ else array
        return outputs

    def unload(self) -> None:
        if self.model is not None and hasattr(self.model, "finalize"):
            try:
                self.model.finalize()
            except Exception as exc:  # noqa: BLE001
                logger.warning("model '%s' finalize raised %s: %s", self.spec.name, type(exc).__name__, exc)
        self.model = None


