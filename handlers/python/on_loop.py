"""A Python-backend batch sent to its worker from the event loop, without a thread in between.

The blocking path (``PythonBackendHandler.execute`` in one of the scheduler's threads) costs two thread hand-offs
per batch besides the worker's own: the loop wakes a thread that writes the batch and waits, and the
link wakes it again with the answer. Here the loop writes the inputs into the worker's arena and sends the batch
itself, and the answer, read on the loop, resolves the awaiting request's future directly.

Only the common case takes this path; the blocking one serves the rest unchanged: an in-process model, a
decoupled model, inputs over ``ON_LOOP_INPUT_BYTES`` (their copy would hold the loop; a BYTES element counts as
1 KiB), a worker that is not alive (restarting it blocks), and an instance another thread holds (unload, a
restart swapping the worker).
The instance's lock is held from the send until the answer is taken, as the blocking path holds it: unloading
still waits for (or cuts off) a running execute.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from handlers.base import RequestResult
from handlers.python.link import WorkerGone, WorkerLink
from runtime.errors import InternalError, ServingError, Unavailable
from runtime.types import InferRequest

if TYPE_CHECKING:
    from handlers.python.backend import PythonBackendHandler

ON_LOOP_INPUT_BYTES = 1 << 20


def start_on_loop(handler: PythonBackendHandler, requests: list[InferRequest]) -> WorkerExecution | None:
    """Send ``requests`` to the handler's worker now, or None when they need the blocking path."""
    if handler._runner is not None or handler.spec.decoupled:
        return None
    if _input_bytes(requests) > ON_LOOP_INPUT_BYTES:
        return None
    if not handler._lock.acquire(blocking=False):
        return None
    try:
        worker = handler._worker
        if worker is None or not worker.alive:
            handler._lock.release()
            return None
        return WorkerExecution(handler, worker, requests)
    except BaseException:
        handler._lock.release()
        raise


def _input_bytes(requests: list[InferRequest]) -> int:
    """What writing the inputs into the arena copies, at most (a BYTES element counts as 1 KiB: measuring the
    strings would cost as much as the copy)."""
    total = 0
    for request in requests:
        for tensor in request.inputs:
            if tensor.data is not None:
                total += tensor.data.size * 1024 if tensor.data.dtype == object else tensor.data.nbytes
    return total


class WorkerExecution:
    """One batch in flight to a worker, begun on the loop (the instance's lock held until it is settled)."""

    def __init__(self, handler: PythonBackendHandler, worker: WorkerLink, requests: list[InferRequest]) -> None:
        from handlers.python.backend import _message

        self.handler, self.worker, self.requests = handler, worker, requests
        self.started = time.perf_counter_ns()
        self.keys = [(next(handler._keys),) for _ in requests]
        self.refs: list[list] = []
        self.unsent: ServingError | None = None
        self.future: Future | None = None
        self.gone = ""
        messages = []
        try:
            for key, request in zip(self.keys, requests, strict=True):
                request_refs = [worker.arena.write(t.name, t.data, t.datatype) for t in request.inputs]
                self.refs.append(request_refs)
                messages.append(_message(key, request_refs, request))
        except MemoryError as exc:
            self._free_inputs()
            self.unsent = Unavailable(f"{handler.label}: {exc}")
            return
        handler._track(self.keys, requests, self.refs, worker)
        self.prepared = time.perf_counter_ns()
        handler.timing.input_ns += self.prepared - self.started
        try:
            self.future = worker.execute(messages)
        except WorkerGone as exc:
            self.gone = str(exc)

    async def results(self) -> list[RequestResult]:
        handler = self.handler
        if self.unsent is not None:
            handler._lock.release()
            return [self.unsent] * len(self.requests)
        future, self.future = self.future, None
        if future is None:  # the worker went away as the batch was sent
            return await asyncio.to_thread(self._fail, self.gone, "; it is being restarted")
        try:
            answer, gone = await _on_loop(future, handler.execute_timeout)
        except asyncio.CancelledError:  # unloading: the answer, when it comes, is taken and dropped
            future.add_done_callback(self._drop)
            raise
        except TimeoutError:
            what = f"execute did not finish within {handler.execute_timeout:g}s"
            return await asyncio.to_thread(self._fail, what, "; its worker is being restarted")
        if gone is not None:
            return await asyncio.to_thread(self._fail, gone, "; it is being restarted")
        answered = time.perf_counter_ns()
        try:
            results = handler._collect(self.worker, self.keys, self.refs, answer)
        finally:
            handler._untrack(self.requests)
            handler._lock.release()
        handler.timing.infer_ns += answered - self.prepared
        handler.timing.output_ns += time.perf_counter_ns() - answered
        return results

    def _fail(self, what: str, consequence: str) -> list[RequestResult]:
        """In a thread (killing a worker waits for it): drop the worker, fail the batch, free the instance."""
        handler = self.handler
        try:
            handler._lose_worker(what)
            return handler._failed(self.keys, self.requests, InternalError(f"{handler.label}: {what}{consequence}"))
        finally:
            handler._untrack(self.requests)
            handler._lock.release()

    def _drop(self, future: Future) -> None:
        """The answer of an abandoned batch (where the link reads): free what it holds, free the instance."""
        handler = self.handler
        try:
            if future.exception() is None:
                handler._collect(self.worker, self.keys, self.refs, future.result())
        finally:
            handler._untrack(self.requests)
            handler._lock.release()

    def _free_inputs(self) -> None:
        for request_refs in self.refs:
            self.worker.arena.free(request_refs)


def _on_loop(future: Future, timeout: float) -> asyncio.Future:
    """A loop future of (answer, None), or (None, why) when the worker went away, or TimeoutError past
    ``timeout`` seconds, that follows ``future`` without ever cancelling it (the link completes it, on the loop
    or in its reader thread: a cancelled one would fail there). A timer, not ``asyncio.wait_for``: that wraps
    each batch's wait in a future and callbacks of its own.

    The failure comes as a value, not raised: a raised one would tie the dead worker's link (its pipes and
    shared memory) into a traceback cycle until the cyclic collector ran.
    """
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    waiter = loop.create_future()

    def settle(done: Future) -> None:
        if waiter.done():  # cancelled, or timed out
            return
        timer.cancel()
        error = done.exception()
        waiter.set_result((None, str(error) or type(error).__name__) if error is not None else (done.result(), None))

    def follow(done: Future) -> None:
        if threading.get_ident() == loop_thread:  # the link reads on the loop: no wake-up needed
            settle(done)
        else:
            loop.call_soon_threadsafe(settle, done)

    def expire() -> None:
        if not waiter.done():
            waiter.set_exception(TimeoutError())

    timer = loop.call_later(timeout, expire)
    waiter.add_done_callback(lambda _: timer.cancel())  # a cancelled wait (unloading) stops the timer too
    future.add_done_callback(follow)
    return waiter
