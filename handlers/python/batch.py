"""One Python-backend batch sent to its worker process and answered: the one path every batch takes.

The inputs are written into the worker's arena, the batch is sent, and the answer is collected, whether the batch
is begun on the event loop (:meth:`WorkerBatch.results`, awaited there: the answer, read on the loop, resolves it
without a thread in between) or in one of the scheduler's threads (:meth:`WorkerBatch.wait`).  The loop takes it
in the common case: a live, free worker, a model that is not decoupled, and inputs up to ``ON_LOOP_INPUT_BYTES``
(their copy would hold the loop; a BYTES element counts as 1 KiB).  Everything else waits in a thread: a decoupled
model, large inputs, a worker that is busy (unloading, being replaced) or dead (restarting it blocks).

The batch holds the instance's worker from the send until its answer is taken, so unloading waits for (or cuts off)
a running execute.  A worker that times out or goes away is lost (and restarted by its supervisor); the batch's
requests fail with the reason.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from typing import Any

from handlers.base import ExecutionTiming, RequestResult
from handlers.python import bls
from handlers.python.in_flight import RequestsInFlight
from handlers.python.link import WorkerGone, WorkerLink
from handlers.python.supervisor import WorkerSupervisor
from runtime.deadline_wheel import deadline_wheel
from runtime.errors import InternalError, ServingError, Unavailable
from runtime.types import InferRequest

ON_LOOP_INPUT_BYTES = 1 << 20


def input_bytes(requests: list[InferRequest]) -> int:
    """What writing the inputs into the arena copies, at most (a BYTES element counts as 1 KiB: measuring the
    strings would cost as much as the copy)."""
    total = 0
    for request in requests:
        for tensor in request.inputs:
            if tensor.data is not None:
                total += tensor.data.size * 1024 if tensor.data.dtype == object else tensor.data.nbytes
    return total


def request_timeout(request: InferRequest) -> int:
    """The request's ``timeout`` parameter (microseconds) as the model sees it, 0 when absent."""
    value = request.parameters.get("timeout", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def batch_message(key: Any, refs: list, request: InferRequest) -> tuple:
    """One request as the worker receives it."""
    return (key, refs, request.id, [o.name for o in request.outputs], bls.model_parameters(request.parameters),
            request.correlation_id, request.flags, request_timeout(request), request.bls_chain, request.execution)


class WorkerBatch:
    """One batch sent to a held worker (see the module); the supervisor is released once it is settled."""

    def __init__(self, supervisor: WorkerSupervisor, worker: WorkerLink, in_flight: RequestsInFlight,
                 requests: list[InferRequest], timing: ExecutionTiming, execute_timeout: float) -> None:
        self.supervisor, self.worker, self.in_flight, self.requests = supervisor, worker, in_flight, requests
        self.timing, self.execute_timeout = timing, execute_timeout
        self.started = time.perf_counter_ns()
        self.keys = in_flight.new_keys(len(requests))
        self.refs: list[list] = []
        self.unsent: ServingError | None = None
        self.future: Future | None = None
        self.gone = ""
        messages = []
        try:
            for key, request in zip(self.keys, requests, strict=True):
                request_refs = [worker.arena.write(t.name, t.data, t.datatype) for t in request.inputs]
                self.refs.append(request_refs)
                messages.append(batch_message(key, request_refs, request))
        except MemoryError as exc:
            for request_refs in self.refs:
                worker.arena.free(request_refs)
            self.unsent = Unavailable(f"{supervisor.label}: {exc}")
            return
        in_flight.track(self.keys, requests, self.refs, worker.arena, supervisor.send_cancel)
        self.prepared = time.perf_counter_ns()
        timing.input_ns += self.prepared - self.started
        try:
            self.future = worker.execute(messages)
        except WorkerGone as exc:
            self.gone = str(exc)

    # -- settled on the loop -----------------------------------------------------------------------------------------
    async def results(self) -> list[RequestResult]:
        """The batch's results, awaited on the event loop."""
        if self.unsent is not None:
            self.supervisor.release()
            return [self.unsent] * len(self.requests)
        future, self.future = self.future, None
        if future is None:  # the worker went away as the batch was sent
            return await asyncio.to_thread(self._fail, self.gone, "; it is being restarted")
        try:
            answer, gone = await _on_loop(future, self.execute_timeout)
        except asyncio.CancelledError:  # unloading: the answer, when it comes, is taken and dropped
            future.add_done_callback(self._drop)
            raise
        except TimeoutError:
            what = f"execute did not finish within {self.execute_timeout:g}s"
            return await asyncio.to_thread(self._fail, what, "; its worker is being restarted")
        if gone is not None:
            return await asyncio.to_thread(self._fail, gone, "; it is being restarted")
        return self._answered(answer)

    # -- settled in a thread ---------------------------------------------------------------------------------------
    def wait(self) -> list[RequestResult]:
        """The batch's results, waited for in this (non-loop) thread."""
        if self.unsent is not None:
            self.supervisor.release()
            return [self.unsent] * len(self.requests)
        future, self.future = self.future, None
        if future is None:
            return self._fail(self.gone, "; it is being restarted")
        try:
            answer = future.result(self.execute_timeout)
        except TimeoutError:
            return self._fail(f"execute did not finish within {self.execute_timeout:g}s",
                              "; its worker is being restarted")
        except WorkerGone as exc:
            return self._fail(str(exc), "; it is being restarted")
        return self._answered(answer)

    # -- either way --------------------------------------------------------------------------------------------------
    def _answered(self, answer: Any) -> list[RequestResult]:
        answered = time.perf_counter_ns()
        try:
            results = self.in_flight.collect(self.worker, self.keys, self.refs, answer)
        finally:
            self.in_flight.untrack(self.requests)
            self.supervisor.release()
        self.timing.infer_ns += answered - self.prepared
        self.timing.output_ns += time.perf_counter_ns() - answered
        return results

    def _fail(self, what: str, consequence: str) -> list[RequestResult]:
        """Not on the loop (killing a worker waits for it): drop the worker, fail the batch, free the instance."""
        try:
            self.supervisor.lose(what)
            error = InternalError(f"{self.supervisor.label}: {what}{consequence}")
            return self.in_flight.failed(self.keys, self.requests, error)
        finally:
            self.in_flight.untrack(self.requests)
            self.supervisor.release()

    def _drop(self, future: Future) -> None:
        """The answer of an abandoned batch (where the link reads): free what it holds, free the instance."""
        try:
            if future.exception() is None:
                self.in_flight.collect(self.worker, self.keys, self.refs, future.result())
        finally:
            self.in_flight.untrack(self.requests)
            self.supervisor.release()


def _on_loop(future: Future, timeout: float) -> asyncio.Future:
    """A loop future of (answer, None), or (None, why) when the worker went away, or TimeoutError past
    ``timeout`` seconds, that follows ``future`` without ever cancelling it (the link completes it, on the loop
    or in its reader thread: a cancelled one would fail there). A deadline on the loop's wheel, not
    ``asyncio.wait_for`` (a future and callbacks of its own per batch) nor a loop timer (a libuv handle each).

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

    timer = deadline_wheel().call_later(timeout, expire)
    waiter.add_done_callback(lambda _: timer.cancel())  # a cancelled wait (unloading) stops the timer too
    future.add_done_callback(follow)
    return waiter
