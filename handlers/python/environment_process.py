"""A worker run by a model's own interpreter (``EXECUTION_ENV_PATH``, ``environment.py``).

multiprocessing cannot start it: its spawn hands the child the server's ``sys.path`` (the server's site-packages,
built for the server's Python) and its fork server is the server's Python.  So the worker is started as
``<env>/bin/python -m handlers.python.environment_worker``, given its end of a socket pair (a multiprocessing
``Connection`` on both sides, as a forked worker's) and a memfd for the progress a forked worker keeps in a shared
array; the first message on the connection is what the worker needs to start.  :class:`EnvironmentProcess` is the
part of ``multiprocessing.Process`` the link and the supervisor use.
"""

from __future__ import annotations

import mmap
import os
import socket
import subprocess
from multiprocessing.connection import Connection
from typing import Any

from handlers.python.environment import PythonEnvironment

ENTRY_MODULE = "handlers.python.environment_worker"
PROGRESS_BYTES = 16  # two int64: (batch id, index), as the forked worker's RawArray("q", 2)


class EnvironmentProcess:
    """A worker process started with ``subprocess``, seen as a ``multiprocessing.Process`` is: ``pid``,
    ``sentinel`` (readable once it has ended: a pidfd), ``exitcode`` (negative: the signal), ``join``, ``kill``,
    ``is_alive``."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.sentinel = os.pidfd_open(popen.pid)

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def kill(self) -> None:
        if self._popen.poll() is None:
            self._popen.kill()

    def __del__(self) -> None:
        try:
            os.close(self.sentinel)
        except OSError:
            pass


def start_in_environment(environment: PythonEnvironment, mode: str, first_message: Any,
                         name: str) -> tuple[EnvironmentProcess, Connection, Any]:
    """Start ``mode`` ("worker" or "auto_complete") under ``environment``'s interpreter; its process, the
    server's end of its connection (``first_message`` already sent) and the progress array it writes."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    progress_fd = os.memfd_create("worker-progress", os.MFD_CLOEXEC)
    try:
        os.ftruncate(progress_fd, PROGRESS_BYTES)
        progress = memoryview(mmap.mmap(progress_fd, PROGRESS_BYTES)).cast("q")
        command = [str(environment.interpreter), "-m", ENTRY_MODULE, mode, str(theirs.fileno()), str(progress_fd),
                   str(os.getpid()), name]
        popen = subprocess.Popen(command, pass_fds=(theirs.fileno(), progress_fd),
                                 env=environment.process_environment(), stdin=subprocess.DEVNULL, close_fds=True)
    finally:
        theirs.close()
        os.close(progress_fd)
    connection = Connection(ours.detach())
    process = EnvironmentProcess(popen)
    try:
        connection.send(first_message)
    except OSError:
        pass  # it ended already: the caller learns it from the connection and the exit code
    return process, connection, progress
