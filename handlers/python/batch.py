"""One Python-backend batch sent to its worker process and answered: the one path every batch takes.

The inputs are written into the worker's arena, the batch is sent, and the answer is collected, whether the batch
is begun on the event loop (:meth:`WorkerBatch.results`, awaited there: the answer, read on the loop, resolves it
without a thread in between) or in one of the scheduler's threads (:meth:`WorkerBatch.wait`).  The loop takes it
in the common case: a live, free worker, a model that is not decoupled, and inputs to copy up to
``ON_LOOP_INPUT_BYTES`` (their copy would hold the loop; a BYTES element counts as 1 KiB; inputs received into the
server's tensor pool are not copied).  Everything else waits in a thread: a decoupled model, large inputs to copy,
a worker that is busy (unloading, being replaced) or dead (restarting it blocks).

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
from handlers.python.transport import pool_ref
from runtime.deadline_wheel import deadline_wheel
from runtime.errors import InternalError, ServingError, Unavailable
from runtime.tensor_pool import TensorPool
from runtime.types import InferRequest

ON_LOOP_INPUT_BYTES = 1 << 20


def input_bytes(requests: list[InferRequest], pool: TensorPool | None = None) -> int:
    """What writing the inputs into the arena copies, at most (a BYTES element counts as 1 KiB: measuring the
    strings would cost as much as the copy). A large input received into ``pool`` is read there, not copied: it is
    looked for only where the inputs together pass ON_LOOP_INPUT_BYTES (4 µs a request of resnet50's size)."""
    total = 0
    in_pool = []  # the inputs that may lie in the pool (pool_ref decides)
    for request in requests:
        for tensor in request.inputs:
            data = tensor.data
            if data is None:
                continue
            if data.dtype == object:
                total += data.size * 1024
            else:
                total += data.nbytes
                if pool is not None:
                    in_pool.append(tensor)
    if total <= ON_LOOP_INPUT_BYTES or pool is None:
        return total
    return total - sum(t.values().nbytes for t in in_pool
                       if pool_ref(pool, t.name, t.values(), t.datatype) is not None)


def request_timeout(request: InferRequest) -> int:
    """The request's ``timeout`` parameter (microseconds) as the model sees it, 0 when absent."""
    value = request.parameters.get("timeout", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def batch_message(key: Any, refs: list, request: InferRequest) -> tuple:
    """One request as the worker receives it."""
    return (key, refs, request.id, [o.name for o in request.outputs], bls.model_parameters(request.parameters),
            request.correlation_id, request.flags, request_timeout(request), request.bls_chain, request.execution)


class WorkerBatch:
    """One batch sent to a held worker (see the module); the supervisor is released once it is settled.

    Begun with ``loop`` (the running loop, where :meth:`results` will await it), its answer resolves a loop future:
    directly where the link reads on that loop, the common case, else through ``call_soon_threadsafe``.  Without,
    :meth:`wait` waits for it in this thread.  ``separately``: the worker executes each request alone, one after
    another, and answers them together (a model without dynamic batching)."""

    def __init__(self, supervisor: WorkerSupervisor, worker: WorkerLink, in_flight: RequestsInFlight,
                 requests: list[InferRequest], timing: ExecutionTiming, execute_timeout: float,
                 loop: asyncio.AbstractEventLoop | None = None, separately: bool = False) -> None:
        self.supervisor, self.worker, self.in_flight, self.requests = supervisor, worker, in_flight, requests
        self.timing, self.execute_timeout = timing, execute_timeout
        self.started = time.perf_counter_ns()
        self.keys = in_flight.new_keys(len(requests))
        self.refs: list[list] = []
        self.unsent: ServingError | None = None
        self.gone = ""
        self.loop = loop
        self._loop_thread = threading.get_ident()
        # an asyncio future where the batch is awaited on the loop, else a thread's future (wait())
        self._waiter: Any = loop.create_future() if loop is not None else Future()
        self._answer: tuple[Any, str | None] | None = None
        self._abandoned = False
        self.separately = separately
        self.batch_id = 0  # the link's, once sent
        messages = []
        arena, input_ref = worker.arena, worker.input_ref
        in_place = not in_flight.decoupled  # a decoupled request's inputs outlive the batch: they are copied
        try:
            for key, request in zip(self.keys, requests, strict=True):
                request_refs = [input_ref(t.name, t.values(), t.datatype, in_place) for t in request.inputs]
                self.refs.append(request_refs)
                messages.append(batch_message(key, request_refs, request))
        except MemoryError as exc:
            for request_refs in self.refs:
                arena.free(request_refs)
            self.unsent = Unavailable(f"{supervisor.label}: {exc}")
            return
        in_flight.track(self.keys, requests, self.refs, arena, supervisor.send_cancel)
        self.prepared = time.perf_counter_ns()
        timing.input_ns += self.prepared - self.started
        try:
            self.batch_id = worker.execute(messages, self._settled, separately)
        except WorkerGone as exc:
            self.gone = str(exc) or "the worker went away"

    def _settled(self, answer: Any, gone: str | None) -> None:
        """The link's word on this batch: its answer, or why its worker went away (wherever the link reads)."""
        if self.loop is None:
            self._waiter.set_result((answer, gone))
        elif threading.get_ident() == self._loop_thread:
            self._settled_on_loop(answer, gone)
        else:
            self.loop.call_soon_threadsafe(self._settled_on_loop, answer, gone)

    def _settled_on_loop(self, answer: Any, gone: str | None) -> None:
        self._answer = (answer, gone)
        if self._abandoned:  # unloading stopped waiting: take the answer and drop it
            self._drop(answer, gone)
        elif not self._waiter.done():  # done: timed out, and failed by results()
            self._waiter.set_result(None)

    # -- settled on the loop -----------------------------------------------------------------------------------------
    async def results(self) -> list[RequestResult]:
        """The batch's results, awaited on the loop it was begun on.  A deadline on the loop's wheel bounds the wait
        (not ``asyncio.wait_for``: a task and callbacks of its own per batch).  Failures are described in a thread
        (killing a worker waits for it)."""
        if self.unsent is not None:
            self.supervisor.release()
            return [self.unsent] * len(self.requests)
        if self.gone:  # the worker went away as the batch was sent
            return await asyncio.to_thread(self._fail, self.gone, "; it is being restarted")
        waiter = self._waiter
        timer = deadline_wheel().call_later(self.execute_timeout, self._expire)
        try:
            await waiter
        except asyncio.CancelledError:  # unloading: the answer, when it comes, is taken and dropped
            self._abandoned = True
            if self._answer is not None:
                self._drop(*self._answer)
            raise
        except TimeoutError:
            what = f"execute did not finish within {self.execute_timeout:g}s"
            return await asyncio.to_thread(self._fail, what, "; its worker is being restarted")
        finally:
            timer.cancel()
        assert self._answer is not None  # the waiter was settled with it
        answer, gone = self._answer
        if gone is not None:
            return await asyncio.to_thread(self._fail, gone, "; it is being restarted")
        return self._answered(answer)

    def _expire(self) -> None:
        if not self._waiter.done():
            self._waiter.set_exception(TimeoutError())

    # -- settled in a thread ---------------------------------------------------------------------------------------
    def wait(self) -> list[RequestResult]:
        """The batch's results, waited for in this (non-loop) thread."""
        if self.unsent is not None:
            self.supervisor.release()
            return [self.unsent] * len(self.requests)
        if self.gone:
            return self._fail(self.gone, "; it is being restarted")
        try:
            answer, gone = self._waiter.result(self.execute_timeout)
        except TimeoutError:
            return self._fail(f"execute did not finish within {self.execute_timeout:g}s",
                              "; its worker is being restarted")
        if gone is not None:
            return self._fail(gone, "; it is being restarted")
        return self._answered(answer)

    # -- either way --------------------------------------------------------------------------------------------------
    def _answered(self, answer: Any) -> list[RequestResult]:
        answered = time.perf_counter_ns()
        try:
            results = self.in_flight.collect(self.worker, self.keys, self.refs, answer, self.requests)
        finally:
            self.in_flight.untrack(self.requests)
            self.supervisor.release()
        self.timing.infer_ns += answered - self.prepared
        self.timing.output_ns += time.perf_counter_ns() - answered
        return results

    def _fail(self, what: str, consequence: str) -> list[RequestResult]:
        """Not on the loop (killing a worker waits for it): drop the worker, fail the batch, free the instance.
        Of requests handed over to be executed separately, those the worker never began (after the one it was
        executing, or all where it never got them) go back to the queue instead, once."""
        try:
            self.supervisor.lose(what)
            error = InternalError(f"{self.supervisor.label}: {what}{consequence}")
            begun = len(self.requests)
            if self.separately:
                begun = self.worker.begun(self.batch_id) if self.batch_id else 0
            return self.in_flight.failed(self.keys, self.requests, error, begun)
        finally:
            self.in_flight.untrack(self.requests)
            self.supervisor.release()

    def _drop(self, answer: Any, gone: str | None) -> None:
        """The answer of an abandoned batch: free what it holds, free the instance."""
        try:
            if gone is None:
                self.in_flight.collect(self.worker, self.keys, self.refs, answer, self.requests)
        finally:
            self.in_flight.untrack(self.requests)
            self.supervisor.release()
