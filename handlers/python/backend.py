"""Triton-compatible Python backend: ``model.py`` with ``class TritonPythonModel``.

By default each instance runs in its own worker process (``parameters { key: "isolation"
value { string_value: "process" } }``): a crash, ``os._exit`` or hang in user code fails only
the requests it was executing, and the worker is restarted in the background, with backoff
while ``initialize`` keeps failing.  While an instance has no worker it reports itself
unavailable, with the reason.  ``"thread"`` runs the model in the server process instead.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from handlers.base import HandlerContext, ModelHandler, RequestResult
from handlers.python.runner import ModelRunner, RunnerSpec, request_payload
from handlers.python.worker import WorkerProcess
from runtime.datatypes import as_bytes_array
from runtime.errors import InternalError, ModelLoadError, ServingError, Status, Unavailable
from runtime.types import InferRequest

logger = logging.getLogger(__name__)

DEFAULT_EXECUTE_TIMEOUT = 600.0
START_TIMEOUT = 120.0
FINALIZE_TIMEOUT = 30.0
RESTART_BACKOFF = (0.5, 30.0)  # first delay, largest delay (seconds); doubles after each failure


def _to_result(payload: tuple) -> RequestResult:
    if payload[0] == "ok":
        return {name: as_bytes_array(a) if a.dtype == np.object_ else a for name, a in payload[1].items()}
    _, message, status = payload
    return ServingError(message, Status(status))


class PythonBackendHandler(ModelHandler):
    """Runs a user's TritonPythonModel, in a supervised worker process or in this process."""

    def __init__(self, context: HandlerContext) -> None:
        super().__init__(context)
        params = self.spec.parameters
        self.isolation = params.get("isolation", "process")
        self._timeout_text = params.get("execute_timeout_seconds", str(DEFAULT_EXECUTE_TIMEOUT))
        self.execute_timeout = DEFAULT_EXECUTE_TIMEOUT
        self._worker: WorkerProcess | None = None
        self._runner: ModelRunner | None = None
        self._lock = threading.Lock()  # Triton runs one execute at a time per instance
        self._closing = threading.Event()
        self._down_reason = ""
        self._restarter: threading.Thread | None = None

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
        )

    # -- lifecycle -------------------------------------------------------------------
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
        spec = self._runner_spec()
        if self.isolation == "thread":
            self._runner = ModelRunner(spec)
            self._runner.load()
        else:
            self._worker = self._start_worker(spec)

    @staticmethod
    def _start_worker(spec: RunnerSpec) -> WorkerProcess:
        worker = WorkerProcess(spec)
        try:
            worker.wait_ready(START_TIMEOUT)
        except ModelLoadError:
            worker.kill()
            raise
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
                worker.kill()  # the blocked execute sees the pipe close and returns
            self._lock.acquire()
        try:
            worker, self._worker = self._worker, None
            if worker is None:
                return
            budget = FINALIZE_TIMEOUT if deadline is None else min(FINALIZE_TIMEOUT, deadline - time.monotonic())
            if worker.alive and budget > 0:
                try:
                    worker.call(("finalize",), budget)
                except (TimeoutError, ConnectionError):
                    logger.warning("%s: the worker did not finalize cleanly", self.label)
            worker.kill()
        finally:
            self._lock.release()

    # -- execution ---------------------------------------------------------------------
    def execute(self, requests: list[InferRequest]) -> list[RequestResult]:
        started = time.perf_counter_ns()
        payload = [request_payload(r) for r in requests]
        with self._lock:
            prepared = time.perf_counter_ns()
            self.timing.input_ns += prepared - started
            if self._runner is not None:
                answers = self._runner.execute(payload)
                return self._results(answers, prepared)
            worker = self._live_worker()
            if worker is None:
                error = Unavailable(f"{self.label} is not available: {self._down_reason}")
                return [error] * len(requests)
            try:
                answers = worker.call(("execute", payload), self.execute_timeout)
            except TimeoutError:
                what = f"execute did not finish within {self.execute_timeout:g}s"
                self._lose_worker(what)
                return [InternalError(f"{self.label}: {what}; its worker is being restarted")] * len(requests)
            except ConnectionError:
                what = f"worker process {worker.exit_description()}"
                self._lose_worker(what)
                return [InternalError(f"{self.label}: {what}; it is being restarted")] * len(requests)
            return self._results(answers, prepared)

    def _results(self, answers: list[tuple], prepared: int) -> list[RequestResult]:
        answered = time.perf_counter_ns()
        results = [_to_result(answer) for answer in answers]
        self.timing.infer_ns += answered - prepared
        self.timing.output_ns += time.perf_counter_ns() - answered
        return results

    def _live_worker(self) -> WorkerProcess | None:
        """The worker, replaced first (once, synchronously) if it died while idle; None if there is none."""
        worker = self._worker
        if worker is None or worker.alive or self._closing.is_set():
            return worker
        what = f"worker process {worker.exit_description()} while idle"
        logger.warning("%s: %s; restarting it before dispatching", self.label, what)
        worker.kill()
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
