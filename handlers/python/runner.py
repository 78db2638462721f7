"""Runs a TritonPythonModel: import, initialize, execute (sync or ``async def``, default or decoupled mode),
finalize, in whichever process hosts it.  Tensors arrive and leave as numpy arrays; how they travel is the
caller's business (shared memory for a worker process, nothing for a model run in the server process).
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.util
import inspect
import logging
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

import triton_python_backend_utils as pb_utils
from handlers.python import model_host
from runtime.errors import ModelLoadError, Status

logger = logging.getLogger(__name__)

STATUS_BY_TRITON_CODE = {
    pb_utils.TritonError.UNKNOWN: Status.INTERNAL,
    pb_utils.TritonError.INTERNAL: Status.INTERNAL,
    pb_utils.TritonError.INVALID_ARG: Status.INVALID_ARG,
    pb_utils.TritonError.NOT_FOUND: Status.NOT_FOUND,
    pb_utils.TritonError.UNAVAILABLE: Status.UNAVAILABLE,
    pb_utils.TritonError.UNSUPPORTED: Status.UNSUPPORTED,
    pb_utils.TritonError.ALREADY_EXISTS: Status.ALREADY_EXISTS,
    pb_utils.TritonError.CANCELLED: Status.CANCELLED,
}
TRITON_CODE_BY_STATUS = {status: code for code, status in STATUS_BY_TRITON_CODE.items()
                         if code != pb_utils.TritonError.UNKNOWN}
_import_lock = threading.Lock()


@dataclass(frozen=True)
class BlsOrigin:
    """Where the BLS calls of the batch being executed come from: the models whose executions wait on it
    (outermost first) and the execution itself (its wait-graph token), so that calls that could only wait forever
    are refused."""

    chain: tuple[str, ...] = ()
    execution: int = 0

    def call(self, model: str) -> dict[str, Any]:
        """The fields of a BLS call made by ``model`` from here."""
        return {"chain": (*self.chain, model), "execution": self.execution}


NO_ORIGIN = BlsOrigin()  # a client's request
# A context variable: it follows ``async def execute`` and ``async_exec`` across threads.
BLS_ORIGIN: contextvars.ContextVar[BlsOrigin] = contextvars.ContextVar("bls_origin", default=NO_ORIGIN)


async def _in_origin(coroutine: Any, origin: BlsOrigin) -> Any:
    BLS_ORIGIN.set(origin)
    return await coroutine


@dataclass(frozen=True)
class RunnerSpec:
    model_name: str
    version: int
    instance_index: int
    model_path: str
    version_dir: str
    args: dict[str, str]
    decoupled: bool = False
    batch_scheduled: bool = False  # the worker runs under SCHED_BATCH, as the server's threads (thread_policy.py)


@dataclass
class RequestData:
    """One request as the model sees it (tensors as arrays)."""

    key: Any
    inputs: list[tuple[str, np.ndarray]]
    request_id: str = ""
    outputs: list[str] = field(default_factory=list)
    parameters: str = "{}"
    correlation_id: int | str = 0
    flags: int = 0
    timeout: int = 0


# A model's answer for one request: ("ok", [(name, array)], parameters json) or ("error", message, status value)
Result = tuple


def error_result(message: str, status: Status = Status.INTERNAL) -> Result:
    return ("error", message, status.value)


def response_result(response: pb_utils.InferenceResponse, model: str) -> Result:
    """A pb_utils.InferenceResponse as a transportable result."""
    if not isinstance(response, pb_utils.InferenceResponse):
        return error_result(f"model '{model}' returned a {type(response).__name__}, not an InferenceResponse")
    if (error := response.error()) is not None:
        return error_result(error.message(), STATUS_BY_TRITON_CODE.get(error.code(), Status.INTERNAL))
    outputs = []
    for tensor in response.output_tensors():
        array = tensor.as_numpy()
        outputs.append((tensor.name(), np.asarray(array)))
    return ("ok", outputs, response.parameters())


def import_model(spec: RunnerSpec) -> ModuleType:
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


def model_class(spec: RunnerSpec) -> type:
    cls = getattr(import_model(spec), "TritonPythonModel", None)
    if cls is None:
        raise ModelLoadError("Internal: AttributeError: module 'model' has no attribute 'TritonPythonModel'")
    return cls


def auto_complete(spec: RunnerSpec, config: dict) -> dict:
    """Run the model's ``auto_complete_config`` on its config; the config it returns."""
    cls = model_class(spec)
    completer = getattr(cls, "auto_complete_config", None)
    if completer is None:
        return config
    try:
        result = completer(pb_utils.ModelConfig(config))
    except Exception as exc:  # noqa: BLE001 - user code
        raise ModelLoadError(f"Internal: {type(exc).__name__}: {exc}") from None
    if not isinstance(result, pb_utils.ModelConfig):
        raise ModelLoadError("auto_complete_config must return the pb_utils.ModelConfig it was given")
    return result.as_dict()


class ModelRunner:
    """The user's model object and the Triton calling conventions around it."""

    def __init__(self, spec: RunnerSpec, host: pb_utils.Host, thread_only: bool = False) -> None:
        self.spec = spec
        self.host = host
        self.thread_only = thread_only  # several models share this process (in-process isolation)
        self.model: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None  # runs async execute coroutines

    @property
    def name(self) -> str:
        return self.spec.args.get("model_instance_name") or self.spec.model_name

    def load(self) -> None:
        model_host.install(self.host, self.thread_only, self.spec.version_dir)
        cls = model_class(self.spec)
        try:
            self.model = cls()
            if hasattr(self.model, "initialize"):
                self.model.initialize(dict(self.spec.args))
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"Internal: {type(exc).__name__}: {exc}") from None
        if inspect.iscoroutinefunction(getattr(self.model, "execute", None)):
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, daemon=True, name="async-execute").start()

    def readiness_check(self) -> Any:
        """The model's ``is_ready`` as a call returning what it answers (awaited when it is ``async def``), or
        None when the model has none (python_backend 2.67)."""
        method = getattr(self.model, "is_ready", None)
        if not callable(method):
            return None

        def check() -> Any:
            outcome = method()
            if inspect.iscoroutine(outcome):
                if self.loop is not None:
                    return asyncio.run_coroutine_threadsafe(outcome, self.loop).result()
                return asyncio.run(outcome)
            return outcome

        return check

    def requests(self, batch: list[RequestData]) -> list[pb_utils.InferenceRequest]:
        return [
            model_host.received_request(
                data.key, self.host, data.inputs, data.request_id, data.outputs, data.parameters,
                self.spec.model_name, self.spec.version, data.correlation_id, data.flags, data.timeout,
            )
            for data in batch
        ]

    def execute(self, batch: list[RequestData], origin: BlsOrigin = NO_ORIGIN) -> Sequence[Result | None] | None:
        """Default mode: one result per request.  Decoupled mode: None once ``execute`` returned (responses go
        through the requests' senders); an error result per request if it raised.  ``origin``: where the batch's
        BLS calls come from."""
        model_host.install(self.host, self.thread_only, self.spec.version_dir)
        BLS_ORIGIN.set(origin)
        requests = self.requests(batch)
        try:
            outcome = self.model.execute(requests)
            if inspect.iscoroutine(outcome) and self.loop is not None:
                if self.spec.decoupled:  # runs beside later requests on this instance's loop, as in Triton
                    future = asyncio.run_coroutine_threadsafe(_in_origin(outcome, origin), self.loop)
                    future.add_done_callback(lambda done: self._async_finished(done, requests))
                    return None
                outcome = asyncio.run_coroutine_threadsafe(_in_origin(outcome, origin), self.loop).result()
        except Exception as exc:  # noqa: BLE001 - user code
            return self._failed(exc, len(requests))
        if self.spec.decoupled:
            if outcome is not None:
                logger.warning("model '%s': a decoupled model's execute should return None", self.spec.model_name)
            return None
        return self._results(outcome, requests)

    def _failed(self, exc: Exception, count: int) -> list[Result]:
        logger.warning("model '%s' execute raised %s: %s", self.spec.model_name, type(exc).__name__, exc)
        message = f"Failed to process the request(s) for model '{self.name}', message: {type(exc).__name__}: {exc}"
        return [error_result(message)] * count

    def _async_finished(self, done: Any, requests: list[pb_utils.InferenceRequest]) -> None:
        exc = done.exception()
        if exc is None:
            return
        message = self._failed(exc, 1)[0][1]  # the coroutine failed: its requests end with that error
        for request in requests:
            try:
                request.get_response_sender().send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)),
                                                   pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except pb_utils.TritonModelException:
                pass  # it had already sent its final response

    def _results(self, responses: Any, requests: list[pb_utils.InferenceRequest]) -> list[Result | None]:
        name = self.spec.model_name
        if inspect.iscoroutine(responses):
            responses.close()
            return [error_result(f"model '{name}' execute returned a coroutine that was never awaited")] * len(
                requests)
        if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
            count = len(responses) if isinstance(responses, (list, tuple)) else type(responses).__name__
            return [error_result(f"model '{name}' execute returned {count} responses for {len(requests)} "
                                 "requests")] * len(requests)
        results: list[Result | None] = []
        reschedule = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
        for request, response in zip(requests, responses, strict=True):
            if response is None and model_host.release_flags(request) & reschedule:
                results.append(None)  # rescheduled: it comes back in a later batch
            elif response is None:
                results.append(error_result(f"model '{name}' returned None for a request it did not reschedule"))
            else:
                results.append(response_result(response, name))
        return results

    def finalize(self) -> None:
        if self.model is not None and hasattr(self.model, "finalize"):
            model_host.install(self.host, self.thread_only, self.spec.version_dir)
            try:
                self.model.finalize()
            except Exception as exc:  # noqa: BLE001
                logger.warning("model '%s' finalize raised %s: %s", self.spec.model_name, type(exc).__name__, exc)
        self.model = None
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)

