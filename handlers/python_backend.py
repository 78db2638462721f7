"""Triton-compatible Python backend: ``model.py`` with ``class TritonPythonModel``.

By default each instance runs in its own worker process (``parameters { key: "isolation"
value { string_value: "process" } }``): a crash, ``os._exit`` or hang in user code fails only
the requests it was executing, and the worker is restarted.  ``"thread"`` runs the model in
the server process instead.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
from typing import Any

import numpy as np

from handlers.base import HandlerContext, ModelHandler, RequestResult
from handlers.python_runner import ModelRunner, RunnerSpec, request_payload
from runtime.datatypes import as_bytes_array
from runtime.errors import InternalError, ModelLoadError, ServingError, Status, Unavailable
from runtime.types import InferRequest

logger = logging.getLogger(__name__)

DEFAULT_EXECUTE_TIMEOUT = 600.0
_START_TIMEOUT = 120.0


def _to_result(payload: tuple) -> RequestResult:
    if payload[0] == "ok":
        return {name: as_bytes_array(a) if a.dtype == np.object_ else a for name, a in payload[1].items()}
    _, message, status = payload
    return ServingError(message, Status(status))


class _Worker:
    """One worker process running a ModelRunner, spoken to over a pipe."""

    def __init__(self, spec: RunnerSpec) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, spec), daemon=True,
                                       name=f"triton-python-{spec.model_name}")
        self.process.start()
        child.close()

    def call(self, message: tuple, timeout: float) -> Any:
        """Send a message and wait for the answer; raises ConnectionError or TimeoutError."""
        try:
            self.connection.send(message)
            answered = self.connection.poll(timeout)
            if answered:
                return self.connection.recv()
        except (EOFError, OSError) as exc:
            raise ConnectionError(str(exc) or type(exc).__name__) from None
        raise TimeoutError(f"no answer within {timeout:g}s")

    def exit_description(self) -> str:
        self.process.join(timeout=1)
        code = self.process.exitcode
        if code is None:
            return "did not answer"
        return f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.connection.close()
        self.process.close()


def _worker_main(connection, spec: RunnerSpec) -> None:
    """The worker process: load the model, then answer execute/finalize messages.

    Signals that reach the whole process group (Ctrl-C in a terminal, ``timeout``) are the
    server's to handle: it drains, then asks each worker to finalize.  A worker whose server
    is gone sees the pipe close and exits.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        runner = ModelRunner(spec)
        runner.load()
    except ModelLoadError as exc:
        connection.send(("error", str(exc)))
        return
    connection.send(("ready", None))
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message[0] == "execute":
            connection.send(runner.execute(message[1]))
        elif message[0] == "finalize":
            runner.finalize()
            connection.send(("done", None))
            return


class PythonBackendHandler(ModelHandler):
    """Runs a user's TritonPythonModel, in a worker process or in this process."""

    def __init__(self, context: HandlerContext) -> None:
        super().__init__(context)
        params = self.spec.parameters
        self.isolation = params.get("isolation", "process")
        self._timeout_text = params.get("execute_timeout_seconds", str(DEFAULT_EXECUTE_TIMEOUT))
        self.execute_timeout = DEFAULT_EXECUTE_TIMEOUT
        self._worker: _Worker | None = None
        self._runner: ModelRunner | None = None
        self._restart_error = ""
        self._lock = threading.Lock()  # Triton runs one execute at a time per instance

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
                "model_instance_kind": "CPU",
                "model_instance_name": f"{self.spec.name}_{context.instance_index}",
                "model_instance_device_id": str(context.device_id),
                "model_repository": str(context.model_dir),
                "model_version": str(context.version),
                "model_name": self.spec.name,
            },
        )

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

    def _start_worker(self, spec: RunnerSpec) -> _Worker:
        worker = _Worker(spec)
        try:
            if not worker.connection.poll(_START_TIMEOUT):
                raise ModelLoadError(f"the worker did not start within {_START_TIMEOUT:.0f}s")
            kind, detail = worker.connection.recv()
        except (EOFError, OSError):
            description = worker.exit_description()
            worker.kill()
            raise ModelLoadError(f"the worker process {description} while loading") from None
        except ModelLoadError:
            worker.kill()
            raise
        if kind != "ready":
            worker.kill()
            raise ModelLoadError(detail)
        return worker

    def execute(self, requests: list[InferRequest]) -> list[RequestResult]:
        payload = [request_payload(r) for r in requests]
        with self._lock:
            if self._runner is not None:
                return [_to_result(p) for p in self._runner.execute(payload)]
            if self._worker is None:
                error = Unavailable(f"model '{self.spec.name}' worker is not running: {self._restart_error}")
                return [error] * len(requests)
            try:
                answers = self._worker.call(("execute", payload), self.execute_timeout)
            except TimeoutError:
                self._replace_worker()
                message = (f"model '{self.spec.name}' execute did not finish within {self.execute_timeout:g}s: "
                           "the worker was restarted")
                return [InternalError(message)] * len(requests)
            except ConnectionError:
                description = self._worker.exit_description()
                self._replace_worker()
                message = f"model '{self.spec.name}' worker process {description}: the worker was restarted"
                return [InternalError(message)] * len(requests)
        return [_to_result(answer) for answer in answers]

    def _replace_worker(self) -> None:
        logger.warning("model '%s' instance %d: restarting its worker", self.spec.name, self.context.instance_index)
        self._worker.kill()
        self._worker = None
        try:
            self._worker = self._start_worker(self._runner_spec())
            self._restart_error = ""
        except ModelLoadError as exc:
            self._restart_error = str(exc)
            logger.error("model '%s': worker restart failed: %s", self.spec.name, exc)

    def unload(self) -> None:
        if self._runner is not None:
            self._runner.finalize()
            self._runner = None
        if self._worker is not None:
            try:
                self._worker.call(("finalize",), 30.0)
            except (TimeoutError, ConnectionError):
                logger.warning("model '%s' worker did not finalize cleanly", self.spec.name)
            self._worker.kill()
            self._worker = None
