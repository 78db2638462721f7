"""What a model version's free instance takes off its queue next.

Without ``dynamic_batching`` each request runs alone.  With it, a free instance takes the oldest request and every
compatible queued one (same non-batch shapes) up to ``max_batch_size``; it waits for more only when the measured
arrival rate can fill the batch sooner than one execution takes, and never past ``max_queue_delay_microseconds``.

Without ``dynamic_batching``, a lone instance that can (a Python model's worker, a tensor model in worker threads)
is handed the requests already queued, up to ``SEPARATE_EXECUTIONS``, in one go: it still executes each alone, as
Triton does, but the per-batch path (the hand-off to its process or thread and back, the collection: about 200 µs of
the event loop a request of resnet50's size) is paid once for them, while their executions together are expected to
take at most ``SEPARATE_SECONDS``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.handler import ModelHandler
from runtime.scheduling.priority_queue import PriorityQueues
from runtime.types import InferRequest

_EWMA = 0.2
SEPARATE_EXECUTIONS = 8  # requests, each executed alone, handed to an instance together at most
SEPARATE_SECONDS = 0.02  # what their executions may be expected to take together (the last one's wait)


@dataclass(eq=False)  # identity: queue removal must never compare request tensors
class QueuedRequest:
    """A request waiting in a model version's queue, with what batching needs to know of it."""

    request: InferRequest
    batch_size: int
    signature: tuple
    future: asyncio.Future
    level: int = 0  # its priority level's queue
    enqueued_ns: int = field(default_factory=time.perf_counter_ns)
    dispatched_ns: int = 0
    instance: ModelHandler | None = None  # the instance executing it, while it executes


def batch_signature(request: InferRequest, batched: bool) -> tuple:
    """Requests with equal signatures can be concatenated along the batch dim."""
    return tuple(sorted((t.name, t.datatype, tuple(t.shape[1:] if batched else t.shape)) for t in request.inputs))


class BatchForming:
    """The decisions over one queue (see the module), and the estimates they are made from: public, so that a test
    can set up a queue and a load and check them (``take_compatible``, ``wait_window``, ``next_batch``).

    ``batching``: dynamic batching (or the sequence batcher's), else requests run alone; ``concatenate``: only
    requests of one signature share a batch; ``separately``: whether the instance can take queued requests
    together now (None: never, as with several instances, which taking them could leave idle)."""

    def __init__(self, queue: PriorityQueues[QueuedRequest], batching: bool, concatenate: bool, max_batch: int,
                 target_batch: int, max_delay: float, separately: Callable[[], bool] | None = None) -> None:
        self.queue = queue
        self.batching, self.concatenate = batching, concatenate
        self.max_batch, self.target_batch, self.max_delay = max_batch, target_batch, max_delay
        self.separately = separately
        self.arrival = asyncio.Event()
        self.mean_gap = float("inf")  # EWMA of seconds between arrivals
        self.mean_request_batch = 1.0
        self.last_arrival = 0.0
        self.exec_seconds: float | None = None  # EWMA of one execution

    def note_arrival(self, batch_size: int) -> None:
        now = time.monotonic()
        if self.last_arrival:
            gap = now - self.last_arrival
            self.mean_gap = gap if self.mean_gap == float("inf") else (1 - _EWMA) * self.mean_gap + _EWMA * gap
        self.last_arrival = now
        self.mean_request_batch = (1 - _EWMA) * self.mean_request_batch + _EWMA * batch_size

    def note_execution(self, seconds: float) -> None:
        """One execution took ``seconds``."""
        self.exec_seconds = seconds if self.exec_seconds is None else (
            (1 - _EWMA) * self.exec_seconds + _EWMA * seconds)

    def wait_window(self, batched: int) -> float:
        """How long to hold a batch of ``batched`` for more requests (0: run now)."""
        if self.max_delay <= 0 or batched >= self.target_batch or self.exec_seconds is None:
            return 0.0
        if self.mean_gap == float("inf") or time.monotonic() - self.last_arrival > self.max_delay:
            return 0.0  # nothing arriving: waiting only adds latency
        missing_requests = (self.target_batch - batched) / max(self.mean_request_batch, 1.0)
        fill_seconds = missing_requests * self.mean_gap
        if fill_seconds > self.exec_seconds:
            return 0.0  # the queue cannot fill it before an execution would finish: run now
        return min(self.max_delay, fill_seconds)

    def pop_next(self) -> QueuedRequest | None:
        while (item := self.queue.pop()) is not None:
            if not item.future.done():
                return item
        return None

    def take_compatible(self, batch: list[QueuedRequest], total: int) -> int:
        """Add to ``batch`` the queued requests that fit it, highest priority and oldest first."""
        if not self.queue:
            return total
        signature = batch[0].signature
        taken = total

        def wanted(item: QueuedRequest) -> bool | None:
            nonlocal taken
            if item.future.done():
                return None
            fits = taken + item.batch_size <= self.max_batch and taken < self.target_batch
            if fits and (not self.concatenate or item.signature == signature):
                batch.append(item)
                taken += item.batch_size
                return True
            return False

        self.queue.sift(wanted, lambda: taken >= self.target_batch)
        return taken

    async def next_batch(self) -> list[QueuedRequest]:
        """The next batch, waited for; without batching, more than one request only to be executed each alone."""
        while (first := self.pop_next()) is None:
            self.arrival.clear()
            await self.arrival.wait()
        batch = [first]
        if not self.batching:
            return self.take_separate(batch)
        total = self.take_compatible(batch, first.batch_size)
        deadline = time.monotonic() + self.wait_window(total)
        while total < self.target_batch and (remaining := deadline - time.monotonic()) > 0:
            self.arrival.clear()
            # A timer that sets the event, rather than wait_for (a task and a timer per wait): waiting to fill
            # a batch happens at every batch under load.
            timer = asyncio.get_running_loop().call_later(remaining, self.arrival.set)
            try:
                await self.arrival.wait()
            finally:
                timer.cancel()
            total = self.take_compatible(batch, total)
        return batch

    def take_separate(self, batch: list[QueuedRequest]) -> list[QueuedRequest]:
        """``batch``'s one request and the queued ones to hand over with it, each to be executed alone."""
        if (self.separately is None or self.exec_seconds is None
                or self.exec_seconds * SEPARATE_EXECUTIONS > SEPARATE_SECONDS or not self.separately()):
            return batch
        while len(batch) < SEPARATE_EXECUTIONS and (item := self.pop_next()) is not None:
            batch.append(item)
        return batch
