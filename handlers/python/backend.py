"""Triton-compatible Python backend: ``model.py`` with ``class TritonPythonModel``.

By default each instance runs in its own worker process (``parameters { key: "isolation" value
{ string_value: "process" } }``), tensors travelling through shared memory, supervised by ``supervisor.py``: a
crash, ``os._exit`` or hang in user code fails only the requests it was executing, and the worker is restarted.
Every batch takes one path to it (``batch.py``), begun on the event loop where it can be.  ``"thread"`` runs the
model in the server process (``in_process.py``).

Decoupled models (``model_transaction_policy { decoupled: true }``) send their responses through
each request's sender, from ``execute`` or any thread; they reach the request's ResponseStream
(``in_flight.py``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

from handlers.base import HandlerContext, ModelHandler, RequestResult, StartedExecution
from handlers.python import bls, memory_watch
from handlers.python.batch import ON_LOOP_INPUT_BYTES, WorkerBatch, input_bytes, request_timeout
from handlers.python.environment import PARAMETER as ENVIRONMENT_PARAMETER
from handlers.python.environment import PythonEnvironment, default_environments_dir, prepare_environment
from handlers.python.in_flight import RequestsInFlight, borrowed, stream_item
from handlers.python.in_process import InProcessHost, call_service, log_model
from handlers.python.link import WorkerLink
from handlers.python.readiness import ask_in_thread
from handlers.python.runner import BlsOrigin, ModelRunner, RequestData, RunnerSpec, error_result
from handlers.python.supervisor import WorkerSupervisor
from handlers.python.transport import DEFAULT_GROWTH_BYTES, DEFAULT_INITIAL_BYTES
from handlers.python.worker import encode_result
from runtime.direct_path import DIRECT_EXECUTION, DirectChannel
from runtime.errors import ModelLoadError, ServingError, Status, Unavailable
from runtime.thread_policy import threads_batched
from runtime.types import InferRequest

logger = logging.getLogger(__name__)
_BLS_REQUEST = re.compile(rb"InferenceRequest\s*\(")

# A direct path's buffer (runtime/direct_path.py): a request with more input bytes than this goes through the core.
# Its pages are taken only as inputs are written into it.
DIRECT_BUFFER_BYTES = 64 << 20


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
        self.in_flight = RequestsInFlight(self.label, self.spec.decoupled)
        self.supervisor = WorkerSupervisor(self.label, self._new_worker, self.in_flight.end_streams)
        self._runner: ModelRunner | None = None
        self._in_process_lock = threading.Lock()  # Triton runs one execute at a time per instance
        self._bls_calls: dict[tuple[int, int | None], InferRequest] = {}  # running BLS calls, by (link, call id)
        # the server's tensor pool: large inputs received there are read by the worker in place
        self._pool = context.services.tensor_pool if context.services is not None else None
        self._sends_bls = True  # whether the model may send BLS requests: no side door (direct_channel) then
        self._environment: PythonEnvironment | None = None  # the model's own interpreter (EXECUTION_ENV_PATH)

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
            batch_scheduled=threads_batched(),
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
        if self.isolation == "thread":
            if self.spec.parameters.get(ENVIRONMENT_PARAMETER):
                raise ModelLoadError(f"parameter {ENVIRONMENT_PARAMETER} needs isolation 'process': a model run in "
                                     "the server's own thread runs the server's Python")
            host = InProcessHost(self.spec.name, self.context.services, self.in_flight)
            self._runner = ModelRunner(self._runner_spec(), host, thread_only=True)
            self._runner.load()
            return
        self._sends_bls = mentions_bls(Path(self.context.version_dir))
        self._environment = self._own_environment()
        self.supervisor.start()
        if memory_limit:
            memory_watch.watch_memory(self.label, memory_limit, self.supervisor.worker_pid,
                                      self.supervisor.recycle_if_idle, self.supervisor.closing)

    def _own_environment(self) -> PythonEnvironment | None:
        """The model's own Python environment (``EXECUTION_ENV_PATH``), unpacked and tried; None without one."""
        named = self.spec.parameters.get(ENVIRONMENT_PARAMETER)
        if not named:
            return None
        return prepare_environment(named, self.context.model_dir,
                                   self.context.environments_dir or default_environments_dir())

    def _new_worker(self) -> WorkerLink:
        services = self.context.services
        return WorkerLink(self._runner_spec(), self, self.arena_bytes, self.growth_bytes,
                          services.loop if services is not None else None, self._pool, self._environment)

    @property
    def available(self) -> bool:
        return self._runner is not None or self.supervisor.worker is not None

    @property
    def unavailable_reason(self) -> str:
        return "" if self.available else self.supervisor.down_reason

    @property
    def worker_restarts(self) -> int:
        return self.supervisor.restarts

    @property
    def checks_readiness(self) -> bool:
        if self._runner is not None:
            return self._runner.readiness_check() is not None
        worker = self.supervisor.worker
        return worker is not None and worker.readiness is not None

    def check_ready(self) -> bool:
        """``is_ready`` of the worker (readiness.py), or of the model run in this process."""
        if self._runner is not None:
            return ask_in_thread(self._runner.readiness_check())
        worker = self.supervisor.worker
        if worker is None:
            return False
        return worker.readiness.ask() if worker.readiness is not None else True

    def unload(self, deadline: float | None = None) -> None:
        """Finalize the model; a worker still busy (hung) at ``deadline`` is killed instead."""
        if self._runner is not None:
            self._runner.finalize()
            self._runner = None
            return
        self.supervisor.stop(deadline)

    # -- execution -------------------------------------------------------------------------------------------
    def start_execute(self, requests: list[InferRequest]) -> StartedExecution | None:
        """The batch sent to its worker from the event loop, or None where it waits in a thread (``batch.py``)."""
        return self._begin(requests, separately=False)

    @property
    def takes_separate_executions(self) -> bool:
        return not self.spec.decoupled  # in the server's process too: one thread hand-off for several executes

    def start_separate_executions(self, requests: list[InferRequest]) -> StartedExecution | None:
        """The requests sent to the worker in one message that it executes one by one (``worker.py``)."""
        return self._begin(requests, separately=True)

    def _begin(self, requests: list[InferRequest], separately: bool) -> StartedExecution | None:
        if self._runner is not None or self.spec.decoupled or input_bytes(requests, self._pool) > ON_LOOP_INPUT_BYTES:
            return None
        worker = self.supervisor.hold_if_live()
        if worker is None:
            return None
        return self._batch(worker, requests, asyncio.get_running_loop(), separately)

    def execute(self, requests: list[InferRequest]) -> list[RequestResult]:
        if self._runner is not None:
            with self._in_process_lock:
                return self._execute_in_process(requests, time.perf_counter_ns())
        worker = self.supervisor.hold()
        if worker is None:
            self.supervisor.release()
            return [Unavailable(f"{self.label} is not available: {self.supervisor.down_reason}")] * len(requests)
        return self._batch(worker, requests).wait()

    def _batch(self, worker: WorkerLink, requests: list[InferRequest],
               loop: asyncio.AbstractEventLoop | None = None, separately: bool = False) -> WorkerBatch:
        try:
            return WorkerBatch(self.supervisor, worker, self.in_flight, requests, self.timing, self.execute_timeout,
                               loop, separately)
        except BaseException:
            self.supervisor.release()
            raise

    def direct_channel(self) -> DirectChannel | None:
        """The live worker's side door (``runtime/direct_path.py``); None for a model run in this process, a
        decoupled one, or while the worker is down."""
        worker = self.supervisor.worker
        if self._runner is not None or self.spec.decoupled or self._sends_bls or worker is None or not worker.alive:
            return None
        return worker.direct_channel(DIRECT_BUFFER_BYTES, self.execute_timeout, self._direct_failure)

    def _direct_failure(self, worker: WorkerLink, timed_out: bool) -> str:
        """A request sent through the side door failed with its worker: why, in the words a batch's failure has
        (``batch.py``); the worker is dropped and restarted now, as a batch's would be (no batch of the core's
        would notice a worker that died under a lane's request until the next one came)."""
        if timed_out:
            what = f"execute did not finish within {self.execute_timeout:g}s"
            self.supervisor.lose_if_current(worker, what)
            return f"{self.supervisor.label}: {what}; its worker is being restarted"
        what = f"worker process {worker.exit_description(5)}"
        self.supervisor.lose_if_current(worker, what)
        return f"{self.supervisor.label}: {what}; it is being restarted"

    def _found_bls(self) -> None:
        """The model sends BLS requests after all (the scan of its files missed them): its side door is no longer
        offered (the core could not see a cycle through an execution it does not know of); the request under way
        there finishes."""
        if not self._sends_bls:
            logger.warning("%s sends BLS requests: its requests go through the core from now on", self.label)
            self._sends_bls = True

    def cancel(self, request: InferRequest) -> None:
        key = self.in_flight.key_of(request)
        if key is None:
            return
        if not self.supervisor.send_cancel(key) and self._runner is not None:
            self.in_flight.cancelled.add(key)

    def _execute_in_process(self, requests: list[InferRequest], started: int) -> list[RequestResult]:
        in_flight = self.in_flight
        keys = in_flight.new_keys(len(requests))
        in_flight.track(keys, requests, [[] for _ in requests], None, in_flight.cancelled.add)
        batch = [RequestData(key=key, inputs=[(t.name, t.values()) for t in request.inputs], request_id=request.id,
                             outputs=[o.name for o in request.outputs],
                             parameters=bls.model_parameters(request.parameters), timeout=request_timeout(request))
                 for key, request in zip(keys, requests, strict=True)]
        prepared = time.perf_counter_ns()
        self.timing.input_ns += prepared - started
        origin = BlsOrigin(max((r.bls_chain for r in requests), key=len, default=()), requests[0].execution)
        runner = self._runner
        assert runner is not None  # a model run in this process
        try:
            answer = runner.execute(batch, origin)
        finally:
            in_flight.untrack(requests)
        answered = time.perf_counter_ns()
        self.timing.infer_ns += answered - prepared
        if answer is None:
            return in_flight.decoupled_results(keys)
        results = [in_flight.result(key, result) for key, result in zip(keys, answer, strict=True)]
        self.timing.output_ns += time.perf_counter_ns() - answered
        return results

    # -- what the worker asks of the server (LinkEvents) -------------------------------------------------------------
    def on_response(self, link: WorkerLink, key: Any, result: Any, flags: int) -> None:
        self.in_flight.deliver(key, stream_item(borrowed(result, link), flags))

    def on_reschedule(self, key: Any) -> None:
        self.in_flight.reschedule(key)

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
        assert services is not None  # on_call answered itself without
        if kind == "bls_cancel":  # the caller's ResponseIterator.cancel(): the model called is asked to stop
            running = self._bls_calls.get((id(link), message[1]))
            if running is not None:
                running.ask_cancel()
            return
        if kind == "bls":
            assert call_id is not None  # a BLS call waits for its reply
            request, decoupled = message[2], message[3]
            if request.get("execution") == DIRECT_EXECUTION:  # from a request served through the side door
                self._found_bls()
                request["execution"] = 0
            inputs = [(ref[0], link.memory.array(ref, copy=True)) for ref in request["inputs"]]
            link.release(request["inputs"])
            call = (id(link), call_id)
            try:
                async for result, final in bls.run(services, request, inputs, decoupled,
                                                   lambda built: self._bls_calls.__setitem__(call, built)):
                    try:
                        payload = encode_result(result, link.arena)
                    except MemoryError as exc:
                        payload = error_result(f"BLS response does not fit in shared memory: {exc}")
                    link.reply(call_id, payload, final)
            finally:
                self._bls_calls.pop(call, None)
            return
        try:
            value = await call_service(services, self.spec.name, kind, message[2], message[3])
            answer: Any = ("ok", value)
        except Exception as exc:  # noqa: BLE001 - the model's call fails, not the server
            answer = ("error", str(exc) if isinstance(exc, ServingError) else f"{type(exc).__name__}: {exc}")
        if call_id is not None:
            link.reply(call_id, answer)


def mentions_bls(folder: Path, most_files: int = 200) -> bool:
    """Whether any Python file of a model's version folder builds an ``InferenceRequest(`` (a model sends BLS
    requests so; Triton's templates name the class in docstrings only); True where the folder cannot be read, or
    has too many files to read them all."""
    try:
        for count, path in enumerate(folder.rglob("*.py")):
            if count >= most_files or _BLS_REQUEST.search(path.read_bytes()):
                return True
    except OSError:
        return True
    return False


def _byte_size(parameters: dict[str, str], key: str, default: int, lowest: int = 1, power: int = 34) -> int:
    text = parameters.get(key, str(default))
    if not text.strip().isdigit() or not lowest <= int(text) <= 1 << power:
        raise ModelLoadError(f"parameter {key} must be a number of bytes ({lowest} to 2**{power}), not '{text}'")
    return int(text)
