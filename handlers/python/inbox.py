"""What a Python worker process is sent: its connection to the server, and a direct path's socket once the server
opens one (``runtime/direct_path.py``: batches a front end sends past the core, and their cancellations)."""

from __future__ import annotations

import os
import select
import threading
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from handlers.python.transport import UnreadableFrame, recv_direct, recv_pickled


class Inbox:
    """What the server sends, read by whichever thread waits for something (leader and followers): the main
    thread while it waits for work, a thread waiting for a reply while a model executes, nobody otherwise.

    A reader thread of its own cost a thread hand-off per batch (the reader woke, queued the batch, woke the main
    thread); here the main thread's read is the batch's only wake-up.  Whoever reads routes each message (work is
    queued, replies delivered, memory released, cancellations noted) and wakes the waiters to look again.
    """

    def __init__(self, connection: Connection, route: Callable[[tuple | None], None]) -> None:
        self.connection = connection
        self.work: deque[tuple] = deque()
        self._route = route
        self._condition = threading.Condition()
        self._reading = False
        # Connection.poll builds a selector per call (about 10 us); one poll object is a single syscall
        self._arrivals = select.poll()
        self._arrivals.register(connection.fileno(), select.POLLIN)
        self.direct: int | None = None  # a direct path's socket (runtime/direct_path.py), once the server opens one
        self._either: Any = None  # a poll of both
        self._direct_alone: Any = None  # a poll of the direct path's socket

    def add_direct(self, fd: int) -> None:
        """Batches come on ``fd`` too from now on, read while waiting for work, answered there."""
        if self.direct is not None:
            os.close(self.direct)
        self.direct = fd
        self._either = select.poll()
        self._either.register(self.connection.fileno(), select.POLLIN)
        self._either.register(fd, select.POLLIN)
        self._direct_alone = select.poll()
        self._direct_alone.register(fd, select.POLLIN)

    def wait(self, ready: Callable[[], bool]) -> None:
        """Read and route messages until ``ready()`` holds (a routed EOF makes every wait ready)."""
        condition = self._condition
        while True:
            with condition:
                while not ready():
                    if not self._reading:
                        self._reading = True
                        break
                    condition.wait()
                else:
                    return
            self._read_one()

    def take_arrived(self) -> None:
        """Route whatever has already arrived, without waiting, unless another thread is reading."""
        with self._condition:
            if self._reading:
                return
            self._reading = True
        try:
            while self._arrivals.poll(0) and self._read_one(release=False):
                pass
            while self.direct is not None and self._direct_alone.poll(0) and self._read_direct():
                pass
        except (EOFError, OSError):
            pass  # the connection is gone: the next wait reads its end
        finally:
            self._release()

    def _read_one(self, release: bool = True) -> bool:
        """Called holding the reading role: one message (a segment's descriptors follow it on the connection, so
        it is routed before the role is given up); False when the connection has closed."""
        try:
            if release and self.direct is not None and self._take_direct():
                return True
            try:
                message = recv_pickled(self.connection)
            except (EOFError, OSError):
                message = None
            self._route(message)
            return message is not None
        finally:
            if release:
                self._release()

    def _take_direct(self) -> bool:
        """Waiting for either: what the direct path sent, if that came first (True)."""
        if any(fd == self.connection.fileno() for fd, _ in self._either.poll()):
            return False
        self._read_direct()
        return True

    def _read_direct(self) -> bool:
        """Called holding the reading role: a batch (queued as work) or a cancellation from the direct path; its
        end is forgotten (False)."""
        direct = self.direct
        assert direct is not None  # called only while the direct path is open
        try:
            message = recv_direct(direct)
        except (EOFError, OSError):
            self._either.unregister(direct)
            os.close(direct)
            self.direct = None
            return False
        except UnreadableFrame as exc:  # read whole but not understood: the batch it carried fails, no more
            self.work.append(("unreadable", str(exc)))
            return True
        if message[0] == "direct" and len(message) == 4:
            self.work.append(message)
        elif message[0] == "cancel" and len(message) == 2:
            self._route(message)
        else:
            self.work.append(("unreadable", f"a {message[0]!r} message of {len(message)} items"))
        return True

    def _release(self) -> None:
        with self._condition:
            self._reading = False
            self._condition.notify_all()
