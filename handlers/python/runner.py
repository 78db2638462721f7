"""Runs a TritonPythonModel: import, initialize, execute, finalize (in whichever process hosts it)."""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
from dataclasses import dataclass
from types import ModuleType

import numpy as np

import triton_python_backend_utils as pb_utils
from runtime.errors import ModelLoadError, Status
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

# A request as it crosses the process boundary: (inputs, id, requested outputs, parameters).
RequestPayload = tuple[list[tuple[str, np.ndarray]], str, list[str], dict]
# A result: ("ok", {name: array}) or ("error", message, status value).
ResultPayload = tuple


@dataclass(frozen=True)
class RunnerSpec:
    model_name: str
    version: int
    instance_index: int
    model_path: str
    version_dir: str
    args: dict[str, str]


def request_payload(request: InferRequest) -> RequestPayload:
    return (
        [(t.name, t.data) for t in request.inputs],
        request.id,
        [o.name for o in request.outputs],
        dict(request.parameters),
    )


def _error(message: str, status: Status = Status.INTERNAL) -> ResultPayload:
    return ("error", message, status.value)


class ModelRunner:
    """The user's model object and the Triton calling conventions around it."""

    def __init__(self, spec: RunnerSpec) -> None:
        self.spec = spec
        self.model = None

    def _import(self) -> ModuleType:
        spec = self.spec
        module_name = f"_triton_model_{spec.model_name}_{spec.version}_{spec.instance_index}"
        module_spec = importlib.util.spec_from_file_location(module_name, spec.model_path)
        if module_spec is None or module_spec.loader is None:
            raise ModelLoadError("cannot import model.py")
        module = importlib.util.module_from_spec(module_spec)
        with _import_lock:  # sys.path is process-wide
            sys.path.insert(0, spec.version_dir)
            try:
                module_spec.loader.exec_module(module)
            except BaseException as exc:  # noqa: BLE001 - user code can raise anything, SystemExit too
                raise ModelLoadError(f"Internal: {type(exc).__name__}: {exc}") from None
            finally:
                sys.path.remove(spec.version_dir)
        return module

    def load(self) -> None:
        model_class = getattr(self._import(), "TritonPythonModel", None)
        if model_class is None:
            raise ModelLoadError("Internal: AttributeError: module 'model' has no attribute 'TritonPythonModel'")
        try:
            self.model = model_class()
            if hasattr(self.model, "initialize"):
                self.model.initialize(dict(self.spec.args))
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"Internal: {type(exc).__name__}: {exc}") from None

    def execute(self, payloads: list[RequestPayload]) -> list[ResultPayload]:
        name = self.spec.model_name
        requests = [
            pb_utils.InferenceRequest(
                inputs=[pb_utils.Tensor(n, a) for n, a in inputs],
                request_id=request_id,
                requested_output_names=outputs,
                parameters=parameters,
                model_name=name,
                model_version=self.spec.version,
            )
            for inputs, request_id, outputs, parameters in payloads
        ]
        try:
            responses = self.model.execute(requests)
        except Exception as exc:  # noqa: BLE001 - user code
            logger.warning("model '%s' execute raised %s: %s", name, type(exc).__name__, exc)
            instance = self.spec.args.get("model_instance_name", name)
            message = (f"Failed to process the request(s) for model '{instance}', message: "
                       f"{type(exc).__name__}: {exc}")
            return [_error(message)] * len(requests)
        if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
            count = len(responses) if isinstance(responses, (list, tuple)) else type(responses).__name__
            return [_error(f"model '{name}' execute returned {count} responses for {len(requests)} requests")] * len(
                requests
            )
        return [self._result(response) for response in responses]

    def _result(self, response: object) -> ResultPayload:
        if not isinstance(response, pb_utils.InferenceResponse):
            return _error(f"model '{self.spec.model_name}' returned a {type(response).__name__}, "
                          "not an InferenceResponse")
        if response.has_error():
            error = response.error()
            return _error(error.message(), _STATUS_BY_TRITON_CODE.get(error.code(), Status.INTERNAL))
        return ("ok", {tensor.name(): np.asarray(tensor.as_numpy()) for tensor in response.output_tensors()})

    def finalize(self) -> None:
        if self.model is not None and hasattr(self.model, "finalize"):
            try:
                self.model.finalize()
            except Exception as exc:  # noqa: BLE001
                logger.warning("model '%s' finalize raised %s: %s", self.spec.model_name, type(exc).__name__, exc)
        self.model = None
