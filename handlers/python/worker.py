"""A Python-backend worker process: hosts one model instance and answers messages over a pipe.

The worker runs in a session of its own, so signals meant for the server's process group
(Ctrl-C in a terminal, ``timeout``) reach only the server, which drains and then asks each
worker to finalize.  A worker whose server is gone exits on its own, even while user code is
busy: it never outlives the server.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from handlers.python.runner import ModelRunner, RunnerSpec
from runtime.errors import ModelLoadError

_PARENT_CHECK_SECONDS = 0.5


class WorkerProcess:
    """The server's handle on one worker process."""

    def __init__(self, spec: RunnerSpec) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=worker_main, args=(child, spec, os.getpid()), daemon=True,
                                       name=f"triton-python-{spec.model_name}")
        self.process.start()
        child.close()

    def wait_ready(self, timeout: float) -> None:
        """Wait for the model to load; ModelLoadError with the reason if it does not."""
        try:
            if not self.connection.poll(timeout):
                raise ModelLoadError(f"the worker did not start within {timeout:.0f}s")
            kind, detail = self.connection.recv()
        except (EOFError, OSError):
            raise ModelLoadError(f"the worker process {self.exit_description()} while loading") from None
        if kind != "ready":
            raise ModelLoadError(detail)

    @property
    def alive(self) -> bool:
        return self.process.exitcode is None and self.process.is_alive()

    def call(self, message: tuple, timeout: float) -> Any:
        """Send a message and wait for the answer; raises ConnectionError or TimeoutError."""
        try:
            self.connection.send(message)
            if self.connection.poll(timeout):
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
        """Kill the process (if alive) and release its pipe; safe to call more than once."""
        if self.process.exitcode is None:
            self.process.kill()
        self.process.join(timeout=5)
        self.connection.close()


def _exit_when_orphaned(parent_pid: int) -> None:
    while True:
        time.sleep(_PARENT_CHECK_SECONDS)
        if os.getppid() != parent_pid:
            os._exit(0)


def worker_main(connection: Connection, spec: RunnerSpec, parent_pid: int) -> None:
    """The worker process: load the model, then answer execute/finalize messages."""
    os.setsid()
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True, name="parent-watch").start()
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
