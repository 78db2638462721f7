"""A Python model's own readiness check, ``TritonPythonModel.is_ready`` (python_backend 2.67, #430).

Asked whenever the model's or the server's readiness is (``/v2/models/<m>/ready``, ``/v2/health/ready``, gRPC's
ModelReady and ServerReady), through a socket of its own between the server and the worker: a thread of the worker
waits on it and calls ``is_ready`` (an ``async def`` one on the model's loop, or a loop of its own), so a probe is
answered while ``execute`` runs.  As python_backend: a check that does not answer within
:data:`READY_CHECK_TIMEOUT` seconds, raises or returns anything but a bool means not ready for that probe; one
check runs at a time per instance, and probes arriving meanwhile take its answer.  A model without ``is_ready`` has
no socket and no thread: it is ready while its worker is.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle
from typing import Any

logger = logging.getLogger(__name__)

READY_CHECK_TIMEOUT = 5.0
_ASK, _READY, _NOT_READY = b"?", b"\1", b"\0"


class ReadinessProbe:
    """The server's end: asks the worker's ``is_ready``, one check at a time; probes arriving while one runs take
    its answer, even one asked past another probe's bound (which answered not ready meanwhile), as python_backend."""

    def __init__(self, sock: socket.socket) -> None:
        self._socket = sock
        self._socket.setblocking(True)
        self._lock = threading.Lock()
        self._in_flight: Future | None = None
        threading.Thread(target=self._read_answers, daemon=True, name="is-ready-answers").start()

    def ask(self, timeout: float = READY_CHECK_TIMEOUT) -> bool:
        """What ``is_ready`` answers (False past ``timeout``, or once the worker is gone)."""
        with self._lock:
            in_flight = self._in_flight
            if in_flight is None:
                in_flight = self._in_flight = Future()
                try:
                    self._socket.sendall(_ASK)
                except OSError:
                    self._in_flight = None
                    return False
        try:
            return in_flight.result(timeout)
        except TimeoutError:
            return False

    def _read_answers(self) -> None:
        while True:
            try:
                answer = self._socket.recv(1)
            except OSError:
                answer = b""
            with self._lock:
                in_flight, self._in_flight = self._in_flight, None
            if in_flight is not None:
                in_flight.set_result(answer == _READY)
            if not answer:  # the worker is gone, or the probe closed
                return

    def close(self) -> None:
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._socket.close()


def ask_in_thread(check: Callable[[], Any] | None, timeout: float = READY_CHECK_TIMEOUT) -> bool:
    """A model run in the server's process: its check in a thread of its own, bounded as a worker's is."""
    if check is None:
        return True
    answer: Future = Future()

    def run() -> None:
        try:
            answer.set_result(check())
        except Exception as exc:  # noqa: BLE001
            answer.set_exception(exc)

    threading.Thread(target=run, daemon=True, name="is-ready").start()
    try:
        outcome = answer.result(timeout)
    except Exception as exc:  # noqa: BLE001 - past the bound or raised: not ready
        logger.warning("is_ready did not answer: %s", exc or type(exc).__name__)
        return False
    return outcome is True


def open_readiness(connection: Connection, worker_pid: int) -> ReadinessProbe:
    """Hand the worker its end of a new readiness socket (the caller holds the connection's send lock)."""
    from handlers.python.transport import send_pickled

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        send_pickled(connection, ("readiness",))
        send_handle(connection, theirs.fileno(), worker_pid)
    finally:
        theirs.close()
    return ReadinessProbe(ours)


def serve_readiness(fd: int, check: Callable[[], Any]) -> None:
    """The worker's end: answer each probe on ``fd`` with ``check()``, in a thread of its own."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)

    def serve() -> None:
        with sock:
            while sock.recv(1) == _ASK:
                try:
                    outcome = check()
                except Exception as exc:  # noqa: BLE001 - a failing check means not ready
                    logger.warning("is_ready raised %s: %s", type(exc).__name__, exc)
                    outcome = False
                if not isinstance(outcome, bool):
                    logger.warning("is_ready must return a bool, not %s: not ready", type(outcome).__name__)
                    outcome = False
                try:
                    sock.sendall(_READY if outcome else _NOT_READY)
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True, name="is-ready").start()
