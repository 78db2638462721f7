"""Deadlines that almost never fire, kept in one timer wheel per event loop instead of a loop timer each.

Every inference request carried two deadlines of its own: its body must arrive within ``body_timeout``, and a
request still running after 50 ms starts watching for its client leaving.  Under uvloop each was a libuv timer
handle, allocated, started, stopped and closed per request: 5-10 us of a small request's ~75 us (measured in
process, ``scripts.bench_http_app``), for deadlines that fire for almost no request.  (The HTTP infer route now
keeps those two with one sweep, ``runtime/http/request_watch.py``; other bodies, a Python batch's execute deadline
and the scheduler's overdue runs stay here.)

Here a deadline is an entry in the bucket of its ``RESOLUTION``-wide slot (a dict insert, and a dict removal when
cancelled); one loop timer wakes at the earliest slot that has a bucket and runs what is due.  A deadline fires
up to ``RESOLUTION`` late (never early by more than the loop's clock granularity), which suits timeouts of tens
of milliseconds and more, not a batcher's queue delay of microseconds.  Loop thread only.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable
from types import TracebackType

from runtime.loop_local import LoopLocal

RESOLUTION = 0.01  # seconds per slot
_EARLY = 0.002  # a slot this close to due runs now (loop timers fire to the millisecond, not the microsecond)


class WheelTimer:
    """One deadline; :meth:`cancel` removes it (safe after it fired, and more than once)."""

    __slots__ = ("_bucket", "callback")

    def __init__(self, bucket: dict[WheelTimer, None], callback: Callable[[], object]) -> None:
        self._bucket = bucket
        self.callback = callback

    def cancel(self) -> None:
        self._bucket.pop(self, None)


class DeadlineWheel:
    """The deadlines of one event loop (see the module)."""

    def __init__(self, resolution: float = RESOLUTION) -> None:
        self.resolution = resolution
        self._buckets: dict[int, dict[WheelTimer, None]] = {}  # slot -> its timers (a dict as an ordered set)
        self._slots: list[int] = []  # heap of the slots in _buckets
        self._alarm: asyncio.TimerHandle | None = None
        self._alarm_slot = 0

    def __len__(self) -> int:
        """Deadlines not yet fired nor cancelled."""
        return sum(len(bucket) for bucket in self._buckets.values())

    def call_later(self, delay: float, callback: Callable[[], object]) -> WheelTimer:
        """Run ``callback`` on the loop once ``delay`` seconds have passed (up to ``resolution`` later).  Time is
        read from the monotonic clock the loops keep time by (asyncio's and uvloop's alike): the running loop
        is looked up only to arm its timer, since each lookup is a ``getpid`` system call."""
        slot = math.ceil((time.monotonic() + delay) / self.resolution)
        bucket = self._buckets.get(slot)
        if bucket is None:
            # An emptied bucket stays until its slot passes, so that a request after request in the same slot
            # reuses it instead of pushing the slot again.
            bucket = self._buckets[slot] = {}
            heapq.heappush(self._slots, slot)
            if self._alarm is None or slot < self._alarm_slot:
                self._arm(asyncio.get_running_loop(), slot)
        timer = WheelTimer(bucket, callback)
        bucket[timer] = None
        return timer

    def timeout(self, delay: float) -> WheelTimeout:
        """``with wheel.timeout(s):`` raises TimeoutError if the block (in a task) runs past ``delay`` seconds."""
        return WheelTimeout(self, delay)

    def _arm(self, loop: asyncio.AbstractEventLoop, slot: int) -> None:
        if self._alarm is not None:
            self._alarm.cancel()
        self._alarm_slot = slot
        self._alarm = loop.call_at(slot * self.resolution, self._ring)

    def _ring(self) -> None:
        self._alarm = None
        loop = asyncio.get_running_loop()
        due = time.monotonic() + _EARLY
        while self._slots and self._slots[0] * self.resolution <= due:
            bucket = self._buckets.pop(heapq.heappop(self._slots), {})
            for timer in list(bucket):
                if bucket.pop(timer, 0) is not None:
                    continue  # cancelled by a callback before it
                try:
                    timer.callback()
                except Exception as exc:  # noqa: BLE001 - one failing callback must not stop the others
                    loop.call_exception_handler({"message": "a deadline's callback failed", "exception": exc})
        if self._slots:
            self._arm(loop, self._slots[0])


class WheelTimeout:
    """A synchronous context manager (nothing to await) that cancels the current task when its deadline passes
    and turns that cancellation into TimeoutError, as ``asyncio.timeout`` does."""

    __slots__ = ("_wheel", "_delay", "_task", "_cancelling", "_timer", "expired")

    def __init__(self, wheel: DeadlineWheel, delay: float) -> None:
        self._wheel = wheel
        self._delay = delay
        self._task: asyncio.Task | None = None
        self._cancelling = 0
        self._timer: WheelTimer | None = None
        self.expired = False

    def __enter__(self) -> WheelTimeout:
        self._task = asyncio.current_task()
        if self._task is None:
            raise RuntimeError("a WheelTimeout is used inside a task")
        self._cancelling = self._task.cancelling()
        self._timer = self._wheel.call_later(self._delay, self._expire)
        return self

    def _expire(self) -> None:
        self.expired = True
        assert self._task is not None
        self._task.cancel()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        assert self._timer is not None and self._task is not None
        self._timer.cancel()
        # as asyncio.timeout: its own cancellation taken back, TimeoutError unless someone else cancelled too
        if self.expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


_WHEELS: LoopLocal[DeadlineWheel] = LoopLocal(DeadlineWheel)


def deadline_wheel() -> DeadlineWheel:
    """The running loop's wheel (made on first use; it holds no reference to the loop)."""
    return _WHEELS.get(asyncio.get_running_loop())
