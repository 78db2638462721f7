"""Coroutines run on the serving event loop for threads that wait for their results.

grpcio's thread-pool server answers each call in a thread of its own; the core lives on one asyncio loop. A thread
queues its coroutine here and sleeps on a lock; the loop is woken once (``call_soon_threadsafe``) for every call
queued since it last looked, starts them as tasks, and releases each caller's lock as its task ends. That is one
wake-up each way per call, and fewer when calls arrive together.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Coroutine
from typing import Any


class BridgedCall:
    """One coroutine on its way to the loop and back: the caller waits on ``finished``."""

    __slots__ = ("coroutine", "finished", "ended", "result", "error", "task", "cancelled")

    def __init__(self, coroutine: Coroutine) -> None:
        self.coroutine = coroutine
        self.finished = threading.Lock()
        self.finished.acquire()
        self.ended = False  # set on the loop before ``finished`` is released
        self.result: Any = None
        self.error: BaseException | None = None
        self.task: asyncio.Task | None = None
        self.cancelled = False

    def settle(self, task: asyncio.Future) -> None:
        """The task's outcome, handed to the waiting thread (a task's done callback, on the loop)."""
        if task.cancelled():
            self.error = asyncio.CancelledError()
        else:
            self.error = task.exception()
            if self.error is None:
                self.result = task.result()
        self.ended = True
        self.finished.release()


class LoopBridge:
    """Runs coroutines on ``loop`` for other threads, waking it once per burst of calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._queued: deque[BridgedCall] = deque()
        self._lock = threading.Lock()
        self._wake_pending = False

    def submit(self, coroutine: Coroutine) -> BridgedCall:
        """Queue ``coroutine`` for the loop; :meth:`wait` for its outcome, :meth:`cancel` to stop it."""
        call = BridgedCall(coroutine)
        with self._lock:
            self._queued.append(call)
            wake, self._wake_pending = not self._wake_pending, True
        if wake:
            try:
                self.loop.call_soon_threadsafe(self._start_queued)
            except RuntimeError:  # the loop is closed: nothing will run it
                with self._lock:
                    self._queued.clear()
                    self._wake_pending = False
                coroutine.close()
                call.error = asyncio.CancelledError()
                call.ended = True
                call.finished.release()
        return call

    def run(self, coroutine: Coroutine) -> Any:
        """``coroutine``'s result, computed on the loop (its exception raised here)."""
        return self.wait(self.submit(coroutine))

    @staticmethod
    def wait(call: BridgedCall) -> Any:
        call.finished.acquire()
        if call.error is not None:
            raise call.error
        return call.result

    def cancel(self, call: BridgedCall) -> None:
        """Cancel ``call``'s task (from any thread); one that already ended is left alone."""
        if call.ended:
            return
        try:
            self.loop.call_soon_threadsafe(self._cancel, call)
        except RuntimeError:  # the loop is closed
            pass

    @staticmethod
    def _cancel(call: BridgedCall) -> None:
        call.cancelled = True
        if call.task is not None:
            call.task.cancel()

    def _start_queued(self) -> None:
        with self._lock:
            calls = list(self._queued)
            self._queued.clear()
            self._wake_pending = False
        for call in calls:
            call.task = task = self.loop.create_task(call.coroutine)
            if call.cancelled:
                task.cancel()
            task.add_done_callback(call.settle)
