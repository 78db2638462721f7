"""The two deadlines of every HTTP infer request, swept together instead of timed one by one.

An infer request's body must arrive within ``body_timeout``, and a request that has run ``WATCH_AFTER_SECONDS``
starts a task that watches for its client leaving (a queued request whose client is gone never runs).  Both almost
never matter, and as two deadline-wheel timers, with the task lookups and context managers around them, they cost
about 10 us of a small request's ~115 us of server CPU under load (``scripts/profile_floors.py``: the timers'
Python runs cache-cold between the listener's threads and the worker).  Here a request is one entry in an
insertion-ordered dict, put in when it arrives and taken out when it is answered; one sweep every
``SWEEP_SECONDS``, armed only while requests are in flight, looks at the oldest entries only: a request past
``WATCH_AFTER_SECONDS`` is watched for its client leaving, or, still reading its body, checked against its body
deadline at each sweep.  Deadlines are therefore kept to within ``SWEEP_SECONDS`` (a body timeout shorter than
``WATCH_AFTER_SECONDS`` fires at the first sweep after it).  Event loop thread only.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType

from starlette.types import Receive

from runtime.errors import Cancelled, ServingError
from runtime.http.body import BodyTimeout
from runtime.loop_local import LoopLocal

WATCH_AFTER_SECONDS = 0.05  # how long an infer request runs before a client that leaves is watched for
SWEEP_SECONDS = 0.025



class WatchedRequest:
    """One request under a :class:`RequestWatch`, used as ``with watch_request(...) as watched:`` around reading
    its body (then :meth:`body_read`) and running it: the block's CancelledError becomes BodyTimeout or Cancelled
    when the watch cancelled it, and leaving the block takes the request out of the watch."""

    __slots__ = ("watch", "task", "receive", "since", "body_deadline", "reading", "aged", "timed_out", "left",
                 "watcher")

    def __init__(self, watch: RequestWatch, task: asyncio.Task, receive: Receive, body_timeout: float) -> None:
        self.watch = watch
        self.task = task
        self.receive = receive
        self.since = time.monotonic()
        self.body_deadline = self.since + body_timeout
        self.reading = True  # the body is still being received
        self.aged = False  # past the young entries: watched (or, still reading, held to its body deadline)
        self.timed_out = False
        self.left = False
        self.watcher: asyncio.Task | None = None

    def body_read(self) -> None:
        """The body is in: from here the client leaving cancels the request (watched now if already aged)."""
        self.reading = False
        if self.aged:
            self.watch.stop_reading(self)
            self.start_watching()

    def __enter__(self) -> WatchedRequest:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        """Out of the watch, its watcher stopped; a cancellation of the watch's own raised as its reason."""
        if self.aged:
            self.watch.stop_reading(self)
        else:
            self.watch.forget(self)
        if self.watcher is not None:
            self.watcher.cancel()
        if exc_type is asyncio.CancelledError:
            error = self._cancellation_error()
            if error is not None:
                raise error from None

    def _cancellation_error(self) -> ServingError | None:
        """Why the watch cancelled this request's task (BodyTimeout, Cancelled), that cancellation taken back;
        None when it did not, or when someone else cancelled the task too (the CancelledError then stands)."""
        if not (self.timed_out or self.left):
            return None
        if self.task.uncancel() > 0:
            return None
        if self.timed_out:
            return BodyTimeout(f"the request body did not arrive within {self.body_deadline - self.since:g}s")
        return Cancelled("the client disconnected")

    def start_watching(self) -> None:
        if self.watcher is None and not self.left:
            self.watcher = self.task.get_loop().create_task(self._watch_for_leaving())

    def expire(self) -> None:
        """The body deadline passed while reading: the task is cancelled, to raise BodyTimeout."""
        if not self.timed_out:
            self.timed_out = True
            self.task.cancel()

    async def _watch_for_leaving(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.left = True
        self.task.cancel()


class RequestWatch:
    """The requests in flight on one event loop (see the module)."""

    def __init__(self, watch_after: float = WATCH_AFTER_SECONDS, sweep_every: float = SWEEP_SECONDS) -> None:
        self.watch_after = watch_after
        self.sweep_every = sweep_every
        self._young: dict[WatchedRequest, None] = {}  # in arrival order
        self._reading: dict[WatchedRequest, None] = {}  # aged, still reading their bodies
        self._sweep: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        """Requests in flight under the watch, not yet watched for leaving (young, or still reading)."""
        return len(self._young) + len(self._reading)

    @property
    def sweeping(self) -> bool:
        """Whether a sweep is armed (only while requests are in flight)."""
        return self._sweep is not None

    def enter(self, task: asyncio.Task, receive: Receive, body_timeout: float) -> WatchedRequest:
        """Watch the request ``task`` serves; ``receive``: its ASGI receive (read for a disconnect once its body
        is in)."""
        request = WatchedRequest(self, task, receive, body_timeout)
        self._young[request] = None
        if self._sweep is None:
            self._sweep = task.get_loop().call_later(self.sweep_every, self._run_sweep)
        return request

    def forget(self, request: WatchedRequest) -> None:
        self._young.pop(request, None)

    def stop_reading(self, request: WatchedRequest) -> None:
        self._reading.pop(request, None)

    def _run_sweep(self) -> None:
        now = time.monotonic()
        aged_since = now - self.watch_after
        young = self._young
        while young:
            request = next(iter(young))
            if request.since > aged_since:
                break
            del young[request]
            request.aged = True
            if request.reading:
                self._reading[request] = None
            else:
                request.start_watching()
        for request in [r for r in self._reading if r.body_deadline <= now]:
            del self._reading[request]
            request.expire()
        self._sweep = None
        if young or self._reading:
            self._sweep = asyncio.get_running_loop().call_later(self.sweep_every, self._run_sweep)


_WATCHES: LoopLocal[RequestWatch] = LoopLocal(RequestWatch)


def watch_request(receive: Receive, body_timeout: float) -> WatchedRequest:
    """Put the current task's request under its loop's watch (made on first use)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("a request is watched from inside its task")
    return _WATCHES.get(task.get_loop()).enter(task, receive, body_timeout)
