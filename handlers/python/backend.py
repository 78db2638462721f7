"""Triton-compatible Python backend: ``model.py`` with ``class TritonPythonModel``.

By default each instance runs in its own worker process (``parameters { key: "isolation" value
{ string_value: "process" } }``), tensors travelling through shared memory: a crash, ``os._exit`` or
hang in user code fails only the requests it was executing, and the worker is restarted in the
background, with backoff while ``initialize`` keeps failing.  While an instance has no worker it
reports itself unavailable, with the reason.  ``"thread"`` runs the model in the server process.

Decoupled models (``model_transaction_policy { decoupled: true }``) send their responses through
each request's sender, from ``execute`` or any thread; they reach the request's ResponseStream.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from typing import Any

import numpy as np

import triton_python_backend_utils as pb_utils
from handlers.base import RESCHEDULE, HandlerContext, ModelHandler, RequestResult, StartedExecution
from handlers.python import bls, memory_watch
from handlers.python.link import WorkerGone, WorkerLink
from handlers.python.on_loop import start_on_loop
from handlers.python.runner import (
    BLS_ORIGIN,
    TRITON_CODE_BY_STATUS,
    BlsOrigin,
    ModelRunner,
    RequestData,
    Result,
    RunnerSpec,
    error_result,
    response_result,
)
from handlers.python.transport import DEFAULT_GROWTH_BYTES, DEFAULT_INITIAL_BYTES
from handlers.python.worker import encode_result
from runtime.datatypes import as_bytes_array
from runtime.errors import InternalError, ModelLoadError, ServingError, Status, Unavailable
from runtime.types import InferRequest, ModelOutputs, StreamItem

logger = logging.getLogger(__name__)

START_TIMEOUT = 120.0
FINALIZE_TIMEOUT = 30.0
RESTART_BACKOFF = (0.5, 30.0)  # first delay, largest delay (seconds); doubles after each failure


def to_result(result: Result | None) -> RequestResult:
    """A worker's result for one request as the scheduler takes it."""
    if result is None:
        return RESCHEDULE
    if result[0] == "ok":
        arrays = {name: as_bytes_array(a) if a.dtype == np.object_ else a for name, a in result[1]}
        return ModelOutputs(arrays, json.loads(result[2]) if result[2] and result[2] != "{}" else {})
    _, message, status = result
    return ServingError(message, Status(status))


def _stream_item(result: Result | None, flags: int) -> StreamItem:
    """A response a decoupled model sent (None: only the final flag)."""
    final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    outputs = None if result is None else to_result(result)
    if isinstance(outputs, ServingError):
        outputs.executed = True  # the model's own error response
    return StreamItem(outputs, final)


class PythonBackendHandler(ModelHandler):
    """Runs a user's TritonPythonModel, in a supervised worker process or in this process."""

    sends_requests = True  # BLS

    def __init__(self, context: HandlerContext) -> None:
        super().__init__(context)
        params = self.spec.parameters
        self.isolation = params.get("isolation", "process")
        self._timeout_text = params.get("execute_timeout_seconds", str(context.execute_timeout))
        self.arena_bytes = DEFAULT_INITIAL_BYTES
        self.growth_bytes = DEFAULT_GROWTH_BYTES
        self._worker: WorkerLink | None = None
        self._runner: ModelRunner | None = None
        self._lock = threading.Lock()  # Triton runs one execute at a time per instance
        self._closing = threading.Event()
        self._down_reason = ""
        self._restarter: threading.Thread | None = None
        self._keys = itertools.count()
        self._streams: dict[Any, tuple[Any, Any, list]] = {}  # key -> (ResponseStream, arena, input refs)
        self._executing: dict[int, Any] = {}  # id(InferRequest) -> key, while it executes
        self._rescheduled: set[Any] = set()

    @property
    def bounds_own_executions(self) -> bool:
        return self.isolation == "process"  # a worker past execute_timeout is killed and restarted

    @property
    def label(self) -> str:
        return f"model '{self.spec.name}' instance {self.context.instance_index}"

    def _runner_spec(self) -> RunnerSpec:
        context = self.context
        return RunnerSpec(
            model_name=self.spec.name,
            version=context.version,
            instance_index=context.instance_index,
            model_path=str(context.require_model_file()),
            version_dir=str(context.version_dir),
            args={
                "model_config": self.spec.to_json(),
                "model_instance_kind": "GPU" if context.gpu_allowed and context.kind == "KIND_GPU" else "CPU",
                "model_instance_name": context.instance_name or f"{self.spec.name}_0_{context.instance_index}",
                "model_instance_device_id": str(context.device_id),
                "model_repository": str(context.model_dir),
                "model_version": str(context.version),
                "model_name": self.spec.name,
            },
            decoupled=self.spec.decoupled,
        )

    # -- lifecycle -------------------------------------------------------------------------------------------
    def load(self) -> None:
        if self.isolation not in ("process", "thread"):
            raise ModelLoadError(f"parameter isolation must be 'process' or 'thread', not '{self.isolation}'")
        try:
            self.execute_timeout = float(self._timeout_text)
        except ValueError:
            self.execute_timeout = 0.0
        if not self.execute_timeout > 0:
            raise ModelLoadError(f"parameter execute_timeout_seconds must be a positive number, "
                                 f"not '{self._timeout_text}'")
        self.arena_bytes = _byte_size(self.spec.parameters, "shm-default-byte-size", DEFAULT_INITIAL_BYTES)
        self.growth_bytes = _byte_size(self.spec.parameters, "shm-growth-byte-size", DEFAULT_GROWTH_BYTES)
        memory_limit = _byte_size(self.spec.parameters, memory_watch.PARAMETER, 0, lowest=0, power=44)
        spec = self._runner_spec()
        if self.isolation == "thread":
            self._runner = ModelRunner(spec, InProcessHost(self), thread_only=True)
            self._runner.load()
        else:
            self._worker = self._start_worker(spec)
            if memory_limit:
                memory_watch.watch_memory(self.label, memory_limit, self.worker_pid, self.recycle_if_idle,
                                          self._closing)

    def worker_pid(self) -> int | None:
        worker = self._worker
        return worker.process.pid if worker is not None else None

    def recycle_if_idle(self, why: str) -> bool:
        """Replace the worker now if it is idle (True), else leave it (False: asked again later)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._worker is None or self._closing.is_set():
                return False
            self._lose_worker(why)
            return True
        finally:
            self._lock.release()

    def _start_worker(self, spec: RunnerSpec) -> WorkerLink:
        services = self.context.services
        worker = WorkerLink(spec, self, self.arena_bytes, self.growth_bytes,
                            services.loop if services is not None else None)
        try:
            worker.wait_ready(START_TIMEOUT)
        except (ModelLoadError, WorkerGone) as exc:
            worker.kill()
            message = str(exc) if isinstance(exc, ModelLoadError) else f"{worker.gone} while loading"
            raise ModelLoadError(message) from None
        return worker

    @property
    def available(self) -> bool:
        return self._runner is not None or self._worker is not None

    @property
    def unavailable_reason(self) -> str:
        return "" if self.available else self._down_reason

    def unload(self, deadline: float | None = None) -> None:
        """Finalize the model; a worker still busy (hung) at ``deadline`` is killed instead."""
        self._closing.set()
        if self._restarter is not None:
            self._restarter.join()
        if self._runner is not None:
            self._runner.finalize()
            self._runner = None
            return
        wait = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._lock.acquire(timeout=wait):
            worker = self._worker
            if worker is not None:
                logger.warning("%s: still executing at the shutdown deadline: killing its worker", self.label)
                worker.kill()  # the blocked execute sees the worker gone and returns
            self._lock.acquire()
        try:
            worker, self._worker = self._worker, None
            if worker is None:
                return
            budget = FINALIZE_TIMEOUT if deadline is None else min(FINALIZE_TIMEOUT, deadline - time.monotonic())
            if worker.alive and budget > 0 and not worker.finalize(budget):
                logger.warning("%s: the worker did not finalize cleanly", self.label)
            worker.kill()
            self._end_streams("the model was unloaded")
        finally:
            self._lock.release()

    # -- execution -------------------------------------------------------------------------------------------
    def start_execute(self, requests: list[InferRequest]) -> StartedExecution | None:
        """The batch sent to the worker from the event loop (``on_loop``), where nothing needs the blocking path."""
        return start_on_loop(self, requests)

    def execute(self, requests: list[InferRequest]) -> list[RequestResult]:
        started = time.perf_counter_ns()
        with self._lock:
            if self._runner is not None:
                return self._execute_in_process(requests, started)
            worker = self._live_worker()
            if worker is None:
                return [Unavailable(f"{self.label} is not available: {self._down_reason}")] * len(requests)
            keys = [(next(self._keys),) for _ in requests]
            messages, refs = [], []
            try:
                for key, request in zip(keys, requests, strict=True):
                    request_refs = [worker.arena.write(t.name, t.data, t.datatype) for t in request.inputs]
                    refs.append(request_refs)
                    messages.append(_message(key, request_refs, request))
            except MemoryError as exc:
                for request_refs in refs:
                    worker.arena.free(request_refs)
                return [Unavailable(f"{self.label}: {exc}")] * len(requests)
            self._track(keys, requests, refs, worker)
            prepared = time.perf_counter_ns()
            self.timing.input_ns += prepared - started
            try:
                answer = worker.execute(messages).result(self.execute_timeout)
            except TimeoutError:
                what = f"execute did not finish within {self.execute_timeout:g}s"
                self._lose_worker(what)
                return self._failed(keys, requests, InternalError(f"{self.label}: {what}; its worker is being "
                                                                  "restarted"))
            except WorkerGone as exc:
                self._lose_worker(str(exc))
                return self._failed(keys, requests, InternalError(f"{self.label}: {exc}; it is being restarted"))
            finally:
                self._untrack(requests)
            answered = time.perf_counter_ns()
            results = self._collect(worker, keys, refs, answer)
            self.timing.infer_ns += answered - prepared
            self.timing.output_ns += time.perf_counter_ns() - answered
            return results

    def _track(self, keys: list, requests: list[InferRequest], refs: list[list], worker: WorkerLink) -> None:
        for key, request, request_refs in zip(keys, requests, refs, strict=True):
            self._executing[id(request)] = key
            if self.spec.decoupled and request.stream is not None:
                self._streams[key] = (request.stream, worker.arena, request_refs)
                request.stream.on_cancel = lambda key=key: self._cancel_key(key)

    def _untrack(self, requests: list[InferRequest]) -> None:
        for request in requests:
            self._executing.pop(id(request), None)

    def _collect(self, worker: WorkerLink, keys: list, refs: list[list], answer: Any) -> list[RequestResult]:
        if answer is None:  # a decoupled execute returned: responses come through the streams
            return self._decoupled_results(keys)
        results = []
        for key, request_refs, encoded in zip(keys, refs, answer, strict=True):
            result = _borrowed(encoded, worker)
            if key not in self._streams:
                worker.arena.free(request_refs)
            results.append(self._result(key, result))
        return results

    def _result(self, key: Any, result: Result | None) -> RequestResult:
        converted = to_result(result)
        if key in self._streams and converted is not RESCHEDULE:  # a decoupled model that raised
            self._deliver(key, StreamItem(converted, True))
        return converted

    def _decoupled_results(self, keys: list) -> list[RequestResult]:
        """After a decoupled execute returned: each request is done (its responses follow through its stream),
        or rescheduled (it runs again later, under a new key)."""
        results: list[RequestResult] = []
        for key in keys:
            if key in self._rescheduled:
                self._rescheduled.discard(key)
                self._forget(key)
                results.append(RESCHEDULE)
            else:
                results.append({})
        return results

    def _failed(self, keys: list, requests: list[InferRequest], error: ServingError) -> list[RequestResult]:
        for key in keys:
            if key in self._streams:
                self._deliver(key, StreamItem(error, True))
        return [error] * len(requests)

    def _deliver(self, key: Any, item: StreamItem) -> None:
        entry = self._streams.get(key)
        if entry is None:
            return  # a response after the final one, or for a request already ended: dropped
        if item.final:
            self._forget(key)
        entry[0].put(item)

    def _forget(self, key: Any) -> None:
        """A request that has ended (or is rescheduled): free its inputs."""
        entry = self._streams.pop(key, None)
        if entry is not None:
            _, arena, request_refs = entry
            if arena is not None:
                arena.free(request_refs)
        if self._runner is not None:
            self._runner.host.cancelled.discard(key)

    def _end_streams(self, why: str) -> None:
        for key in list(self._streams):
            self._deliver(key, StreamItem(Unavailable(f"{self.label}: {why}"), True))

    def cancel(self, request: InferRequest) -> None:
        key = self._executing.get(id(request))
        if key is not None:
            self._cancel_key(key)

    def _cancel_key(self, key: Any) -> None:
        worker = self._worker
        if worker is not None:
            try:
                worker.send(("cancel", key))
            except OSError:
                pass
        elif self._runner is not None:
            self._runner.host.cancelled.add(key)

    def _execute_in_process(self, requests: list[InferRequest], started: int) -> list[RequestResult]:
        host = self._runner.host
        keys = [(next(self._keys),) for _ in requests]
        for key, request in zip(keys, requests, strict=True):
            if self.spec.decoupled and request.stream is not None:
                self._streams[key] = (request.stream, None, [])
                request.stream.on_cancel = lambda key=key: host.cancelled.add(key)
        batch = [RequestData(key=key, inputs=[(t.name, t.data) for t in request.inputs], request_id=request.id,
                             outputs=[o.name for o in request.outputs],
                             parameters=bls.model_parameters(request.parameters), timeout=_timeout(request))
                 for key, request in zip(keys, requests, strict=True)]
        prepared = time.perf_counter_ns()
        self.timing.input_ns += prepared - started
        origin = BlsOrigin(max((r.bls_chain for r in requests), key=len, default=()), requests[0].execution)
        answer = self._runner.execute(batch, origin)
        answered = time.perf_counter_ns()
        self.timing.infer_ns += answered - prepared
        if answer is None:
            return self._decoupled_results(keys)
        results = [self._result(key, result) for key, result in zip(keys, answer, strict=True)]
        self.timing.output_ns += time.perf_counter_ns() - answered
        return results

    # -- what the worker asks of the server (LinkEvents) -------------------------------------------------------------
    def on_response(self, link: WorkerLink, key: Any, result: Any, flags: int) -> None:
        self._deliver(key, _stream_item(_borrowed(result, link), flags))

    def on_reschedule(self, key: Any) -> None:
        self._rescheduled.add(key)

    def on_log(self, level: str, message: str) -> None:
        log_model(self.spec.name, level, message)

    def on_call(self, link: WorkerLink, kind: str, call_id: int | None, message: tuple) -> None:
        services = self.context.services
        if services is None:
            if call_id is not None:
                link.reply(call_id, ("error", "the server offers no such call here", Status.UNAVAILABLE.value))
            return
        asyncio.run_coroutine_threadsafe(self._answer(link, kind, call_id, message), services.loop)

    async def _answer(self, link: WorkerLink, kind: str, call_id: int | None, message: tuple) -> None:
        services = self.context.services
        if kind == "bls":
            request, decoupled = message[2], message[3]
            inputs = [(ref.name, link.memory.array(ref, copy=True)) for ref in request["inputs"]]
            link.release(request["inputs"])
            async for result, final in bls.run(services, request, inputs, decoupled):
                try:
                    payload = encode_result(result, link.arena)
                except MemoryError as exc:
                    payload = error_result(f"BLS response does not fit in shared memory: {exc}")
                link.reply(call_id, payload, final)
            return
        try:
            value = await call_service(services, self.spec.name, kind, message[2], message[3])
            answer: Any = ("ok", value)
        except Exception as exc:  # noqa: BLE001 - the model's call fails, not the server
            answer = ("error", str(exc) if isinstance(exc, ServingError) else f"{type(exc).__name__}: {exc}")
        if call_id is not None:
            link.reply(call_id, answer)

    # -- supervision ---------------------------------------------------------------------------------------------
    def _live_worker(self) -> WorkerLink | None:
        """The worker, replaced first (once, synchronously) if it died while idle; None if there is none."""
        worker = self._worker
        if worker is None or worker.alive or self._closing.is_set():
            return worker
        what = f"worker process {worker.exit_description()} while idle"
        logger.warning("%s: %s; restarting it before dispatching", self.label, what)
        worker.kill()
        self._end_streams(what)
        try:
            self._worker = self._start_worker(self._runner_spec())
        except ModelLoadError as exc:
            self._worker = None
            self._down(f"{what}, and its restart failed: {exc}")
        return self._worker

    def _lose_worker(self, what: str) -> None:
        """Called with the lock held: drop the worker and restart it in the background (unless closing)."""
        if self._worker is not None:
            self._worker.kill()
            self._worker = None
        self._end_streams(what)
        self._down(what)

    def _down(self, what: str) -> None:
        self._down_reason = what
        if self._closing.is_set():
            return
        logger.warning("%s: %s; restarting its worker", self.label, what)
        if self._restarter is None or not self._restarter.is_alive():
            self._restarter = threading.Thread(target=self._restart_until_up, args=(what,), daemon=True,
                                               name=f"restart-{self.spec.name}-{self.context.instance_index}")
            self._restarter.start()

    def _restart_until_up(self, what: str) -> None:
        delay, longest = RESTART_BACKOFF
        attempt = 0
        while not self._closing.is_set():
            attempt += 1
            try:
                worker = self._start_worker(self._runner_spec())
            except ModelLoadError as exc:
                self._down_reason = (f"{what}; restart attempt {attempt} failed: {exc}; "
                                     f"next attempt in {delay:g}s")
                logger.error("%s: %s", self.label, self._down_reason)
                self._closing.wait(delay)
                delay = min(delay * 2, longest)
                continue
            with self._lock:
                if self._closing.is_set():
                    worker.kill()
                    return
                self._worker, self._down_reason = worker, ""
            logger.info("%s: worker restarted (attempt %d)", self.label, attempt)
            return


def _borrowed(encoded: Any, link: WorkerLink) -> Result | None:
    """A worker's result with its tensors read in place from the worker's memory (returned once unused)."""
    if encoded is None or encoded[0] != "ok":
        return encoded
    return ("ok", link.borrow(encoded[1]), encoded[2])


def _byte_size(parameters: dict[str, str], key: str, default: int, lowest: int = 1, power: int = 34) -> int:
    text = parameters.get(key, str(default))
    if not text.strip().isdigit() or not lowest <= int(text) <= 1 << power:
        raise ModelLoadError(f"parameter {key} must be a number of bytes ({lowest} to 2**{power}), not '{text}'")
    return int(text)


def _timeout(request: InferRequest) -> int:
    value = request.parameters.get("timeout", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _message(key: Any, refs: list, request: InferRequest) -> tuple:
    """One request as the worker receives it."""
    return (key, refs, request.id, [o.name for o in request.outputs], bls.model_parameters(request.parameters),
            request.correlation_id, request.flags, _timeout(request), request.bls_chain, request.execution)


def log_model(model: str, level: str, message: str) -> None:
    levels = {"INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR, "VERBOSE": logging.DEBUG}
    logging.getLogger("model").log(levels.get(level, logging.INFO), "model '%s': %s", model, message)


async def call_service(services: Any, model: str, kind: str, operation: str, arguments: tuple) -> Any:
    """A model's custom-metric or model-control call, on the server's loop."""
    if kind == "metric":
        return services.custom_metric(model, operation, *arguments)
    if operation == "load":
        name, config, files = arguments
        if files:
            raise ValueError("load_model takes models from the repository only: 'files' are not accepted")
        await services.load_model(name, {"config": config} if config else {})
        return None
    if operation == "unload":
        name, dependents = arguments
        await services.unload_model(name, {"unload_dependents": dependents} if dependents else {})
        return None
    if operation == "ready":
        return services.model_ready(*arguments)
    raise ValueError(f"unknown call '{operation}'")


class InProcessHost:
    """The host of a model run in the server process (isolation: thread)."""

    def __init__(self, handler: PythonBackendHandler) -> None:
        self.handler = handler
        self.cancelled: set[Any] = set()

    def _services(self) -> Any:
        services = self.handler.context.services
        if services is None:
            raise pb_utils.TritonModelException("the server offers no such call here")
        return services

    def _await(self, coroutine: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._services().loop).result(timeout)

    def infer(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        message = {"model_name": request.model_name(), "model_version": request.model_version(),
                   "outputs": request.requested_output_names(), "request_id": request.request_id(),
                   "parameters": request.parameters(), "timeout": request.timeout(),
                   **BLS_ORIGIN.get().call(self.handler.spec.name)}
        inputs = [(t.name(), t.as_numpy()) for t in request.inputs()]

        async def collect() -> list:
            return [pair async for pair in bls.run(self._services(), message, inputs, decoupled)]

        responses = [_response(result) for result, _ in self._await(collect()) if result is not None]
        return iter(responses) if decoupled else responses[0]

    def send(self, key: Any, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        result = None if response is None else response_result(response, self.handler.spec.name)
        self.handler._deliver(key, _stream_item(result, flags))

    def is_cancelled(self, key: Any) -> bool:
        return key in self.cancelled

    def reschedule(self, key: Any) -> None:
        self.handler._rescheduled.add(key)

    def log(self, level: str, message: str) -> None:
        log_model(self.handler.spec.name, level, message)

    def metric(self, operation: str, *arguments: Any) -> Any:
        return self._services().custom_metric(self.handler.spec.name, operation, *arguments)

    def control(self, operation: str, *arguments: Any) -> Any:
        try:
            return self._await(call_service(self._services(), self.handler.spec.name, "control", operation,
                                            arguments))
        except Exception as exc:
            raise pb_utils.TritonModelException(str(exc)) from None


def _response(result: Result) -> pb_utils.InferenceResponse:
    if result[0] == "ok":
        return pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in result[1]], parameters=result[2])
    code = TRITON_CODE_BY_STATUS.get(Status(result[2]), pb_utils.TritonError.INTERNAL)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(result[1], code))
