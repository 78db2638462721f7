"""Per-model-version scheduling: a bounded queue, one consumer per instance, each taking what ``batch_forming.py``
decides (a request alone, a dynamic batch, or queued requests to execute each alone) and running it.

Tensor models get one concatenated batch; Python-backend models get the list of requests.  A batch runs in a worker
thread, except where handing it over costs more than running it (``run_placement.py``) or the instance begins it on
the event loop itself (a model in another process).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from runtime.config.spec import ModelSpec, QueuePolicy
from runtime.errors import InternalError, Unavailable
from runtime.handler import REQUEUE, ExecutionTiming, ModelHandler, RequestResult, Reschedule, TensorHandler
from runtime.scheduling.batch_forming import BatchForming, QueuedRequest, batch_signature
from runtime.scheduling.batch_run import BatchExecution, trace_compute
from runtime.scheduling.idle_watch import IdleWatch
from runtime.scheduling.priority_queue import PriorityQueues
from runtime.scheduling.rate_limiter import RateLimiter
from runtime.scheduling.request_parameters import queue_timeout, requested_priority
from runtime.scheduling.run_placement import INLINE_SECONDS
from runtime.scheduling.stats import ModelStatistics
from runtime.scheduling.wait_graph import WaitGraph
from runtime.types import InferRequest

logger = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE_SIZE = 1024
# While every instance is down (Python workers restarting), queued requests wait this long for one
# to come back before they fail with the instances' reasons.
ALL_DOWN_GRACE_SECONDS = 5.0
_DOWN_POLL_SECONDS = 0.05


class Scheduler:
    """Queues requests for one model version and runs them on its instances."""

    def __init__(
        self,
        spec: ModelSpec,
        instances: list[ModelHandler],
        executor: ThreadPoolExecutor,
        stats: ModelStatistics,
        default_max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
        batch_always: bool = False,  # batch what is queued even without dynamic_batching (sequence batching)
        max_delay: float | None = None,  # the sequence batcher's own wait and preferred sizes (not dynamic_batching's)
        preferred_sizes: tuple[int, ...] | None = None,
        waits: WaitGraph | None = None,  # the server's, shared by every scheduler (BLS cycles are refused through it)
        rate_limiter: RateLimiter | None = None,  # the server's, when --rate-limit=execution_count
    ) -> None:
        self.spec = spec
        self.stats = stats
        batching = spec.dynamic_batching
        self.batching = (batching is not None or batch_always) and spec.max_batch_size > 0
        self.concatenate = self.batching and all(isinstance(i, TensorHandler) for i in instances)
        max_batch = spec.max_batch_size if self.batching else 0
        if preferred_sizes is None:
            preferred_sizes = tuple(batching.preferred_batch_sizes) if batching else ()
        preferred = [p for p in preferred_sizes if 0 < p <= max_batch]
        if max_delay is None:
            max_delay = (batching.max_queue_delay_microseconds / 1e6) if batching else 0.0
        # each priority level's queue policy and bound (a policy without max_queue_size: the server's default)
        policies = [batching.queue_policy_of(level) if batching else QueuePolicy()
                    for level in range(1, max(batching.priority_levels if batching else 0, 1) + 1)]
        self._policies = [(policy, policy.max_queue_size if policy.max_queue_size > 0 else default_max_queue_size)
                          for policy in policies]
        self.queue: PriorityQueues[QueuedRequest] = PriorityQueues(batching.priority_levels if batching else 0,
                                                            batching.default_priority_level if batching else 0)
        self._instances = instances
        self._running: dict[ModelHandler, float] = {}  # instance -> when its current execution began (monotonic)
        self._waits = waits if waits is not None else WaitGraph()
        self._waits.add_node(self, f"'{spec.name}'", len(instances))
        self._all_down_since: float | None = None
        self.rate_limiter = rate_limiter
        needs = spec.instance_needs()
        # each instance's rate-limiter resources and priority (instances are created in the config's order)
        self._needs = dict(zip(instances, needs, strict=True)) if rate_limiter and len(needs) == len(instances) \
            else {}
        # queued requests handed over together: to one instance (with more, it could leave another idle) that
        # acquires no resources per execution, and not a sequence's (the sequence batcher orders those)
        lone = instances[0] if len(instances) == 1 and not (self._needs or self.batching or batch_always) else None
        self.execution = BatchExecution(spec, executor, self.batching, self.concatenate)
        self.placement = self.execution.placement  # tensor models: each batch on the loop or in a worker thread
        self.forming = BatchForming(self.queue, self.batching, self.concatenate, max_batch,
                                    max(preferred) if preferred else max_batch, max_delay,
                                    None if lone is None else lambda: self._takes_separate(lone))
        self._consumers = [asyncio.create_task(self._consume(i)) for i in instances]
        self._loop: asyncio.AbstractEventLoop | None = None  # a request's loop, asked once: in 3.11 each asking
        # costs a getpid system call
        self.idle = IdleWatch(lambda: not self.queue and not self._running)

    def _takes_separate(self, instance: ModelHandler) -> bool:
        """Whether queued requests go to ``instance`` together now: not where each runs on the loop (no hand-off
        there to share)."""
        if not instance.takes_separate_executions:
            return False
        estimate = self.placement.run_seconds
        return not (isinstance(instance, TensorHandler) and instance.device == "cpu" and estimate is not None
                    and estimate < INLINE_SECONDS)

    @property
    def pending(self) -> int:
        return len(self.queue)

    def is_overdue(self, instance: ModelHandler) -> bool:
        """Whether ``instance`` is executing past its ``execute_timeout`` (asked on every request: no dict built)."""
        began = self._running.get(instance)
        return began is not None and time.monotonic() - began > instance.execute_timeout

    def overdue(self) -> dict[ModelHandler, float]:
        """Instances executing past their ``execute_timeout``, with the seconds they have run (they cannot serve)."""
        now = time.monotonic()
        return {instance: now - began for instance, began in self._running.items()
                if now - began > instance.execute_timeout}

    async def submit(self, request: InferRequest, batch_size: int) -> tuple[RequestResult, int]:
        """Queue a request; returns its result and the nanoseconds it spent queued."""
        level = self.queue.index_of(requested_priority(request)) if self.queue.levels > 1 else 0
        policy, bound = self._policies[level]
        if self.queue.size(level) >= bound:
            raise Unavailable(f"Exceeds maximum queue size ({bound}) of model '{self.spec.name}'")
        timeout = queue_timeout(request, policy)
        caller = request.caller_execution
        if caller:
            self._waits.wait(caller, self)  # refused here if the caller could only wait forever
        signature = (self.spec.fixed_input_signature or batch_signature(request, self.batching)) if self.concatenate \
            else ()
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        item = QueuedRequest(request, batch_size, signature, loop.create_future(), level)
        self.forming.note_arrival(batch_size)
        if request.trace is not None:
            request.trace.event("QUEUE_START", item.enqueued_ns)
        self.queue.append(item)
        self.forming.arrival.set()
        if self.idle.watchers:
            self.idle.busy()
        try:
            if timeout:
                try:
                    result = await asyncio.wait_for(asyncio.shield(item.future), timeout)
                except TimeoutError:
                    if not item.dispatched_ns:  # still queued: it never runs
                        self._abandon(item)
                        raise Unavailable("Request timeout expired") from None
                    result = await item.future  # already running: the timeout covers only the queue
            else:
                result = await item.future
        except asyncio.CancelledError:
            self._abandon(item)  # the client went away: never run it, or tell the model it left
            if item.instance is not None:
                item.instance.cancel(item.request)
            raise
        finally:
            if caller:
                self._waits.done(caller, self)
        return result, item.dispatched_ns - item.enqueued_ns

    def _abandon(self, item: QueuedRequest) -> None:
        """Cancel a request and free its queue slot at once (no-op if a consumer already took it)."""
        item.future.cancel()
        self.queue.remove(item)
        if self.idle.watchers:
            self.idle.check()

    async def close(self) -> None:
        self._waits.remove_node(self)
        for consumer in self._consumers:
            consumer.cancel()
        await asyncio.gather(*self._consumers, return_exceptions=True)
        for item in self.queue.drain():
            if not item.future.done():
                item.future.set_exception(Unavailable(f"model '{self.spec.name}' is unloading"))

    async def _wait_for_instance(self, instance: ModelHandler) -> None:
        """Sleep while ``instance`` is down; fail the queue if every instance stays down past the grace."""
        while not instance.available:
            if any(i.available for i in self._instances):
                self._all_down_since = None
            elif self._all_down_since is None:
                self._all_down_since = time.monotonic()
            elif time.monotonic() - self._all_down_since > ALL_DOWN_GRACE_SECONDS and self.queue:
                reasons = "; ".join(dict.fromkeys(i.unavailable_reason for i in self._instances))
                error = Unavailable(f"model '{self.spec.name}' has no instance that can serve: {reasons}")
                for item in self.queue.drain():
                    if not item.future.done():
                        item.future.set_result(error)
            await asyncio.sleep(_DOWN_POLL_SECONDS)

    async def _consume(self, instance: ModelHandler) -> None:
        loop = asyncio.get_running_loop()  # asked once, not a batch: in 3.11 each asking costs a system call
        while True:
            await self._serve_next(loop, instance)

    async def _serve_next(self, loop: asyncio.AbstractEventLoop, instance: ModelHandler) -> None:
        """Take the next batch and run it on ``instance``.  A method of its own so that nothing of a finished
        batch (requests, their tensors, views of client shared memory) stays referenced while the next is
        awaited."""
        if not instance.available:
            await self._wait_for_instance(instance)
        batch = await self.forming.next_batch()
        batch = [item for item in batch if not item.future.done()]
        if not batch:
            return
        if self.idle.holds and (held := self.idle.held()) is not None:  # a request served past the scheduler
            self.queue.put_back(batch)  # runs on the instance: what came meanwhile waits in the queue, as it would
            await held
            self.forming.arrival.set()
            return
        if not instance.available:  # went down while this consumer waited: another instance may serve
            self.queue.put_back(batch)
            self.forming.arrival.set()
            return
        needs, priority = self._needs.get(instance, ((), 0))
        limiter = self.rate_limiter
        if needs:
            assert limiter is not None  # instances have needs only under a rate limiter
            try:
                await limiter.acquire(needs, priority)
            except asyncio.CancelledError:  # unloading: the queue's requests are answered by close()
                self.queue.put_back(batch)
                raise
        try:
            batch = [item for item in batch if not item.future.done()]  # some may have left while it waited
            if batch:
                await self._execute_batch(loop, instance, batch)
        finally:
            if needs and limiter is not None:
                limiter.release(needs)

    async def _execute_batch(self, loop: asyncio.AbstractEventLoop, instance: ModelHandler,
                             batch: list[QueuedRequest]) -> None:
        """Run a taken batch on ``instance`` and answer its requests."""
        now = time.perf_counter_ns()
        execution = self._waits.begin(self) if instance.sends_requests else 0
        for item in batch:
            item.dispatched_ns = item.dispatched_ns or now
            item.instance = instance
            item.request.execution = execution
        started = time.perf_counter_ns()
        self._running[instance] = time.monotonic()
        try:
            results = await self.execution.run(loop, instance, batch)
        except asyncio.CancelledError:  # unloading: nobody waits forever for this batch
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(Unavailable(f"model '{self.spec.name}' was unloaded"))
            raise
        except Exception as exc:  # noqa: BLE001 - a handler bug fails this batch only
            logger.exception("model '%s' execution failed", self.spec.name)
            results = [InternalError(f"execution failed: {type(exc).__name__}")] * len(batch)
        finally:
            self._waits.end(execution)
            del self._running[instance]
        elapsed = time.perf_counter_ns() - started
        timing = instance.timing
        if not (timing.input_ns or timing.infer_ns or timing.output_ns):
            timing = ExecutionTiming(infer_ns=elapsed)
        executed = batch
        if any(result is REQUEUE for result in results):  # requests the instance never reached were not executed
            executed = [item for item, result in zip(batch, results, strict=True) if result is not REQUEUE]
        if executed:
            self._record(executed, started, elapsed, timing)
        rescheduled = False
        for item, result in zip(batch, results, strict=True):
            item.instance = None
            if item.future.done():
                continue
            if isinstance(result, Reschedule):  # the model asked to see it again in a later batch, or never saw it
                self.queue.append(item)
                rescheduled = True
            else:
                item.future.set_result(result)
        if rescheduled:
            self.forming.arrival.set()
        if self.idle.watchers:
            self.idle.check()

    def _record(self, executed: list[QueuedRequest], started: int, elapsed: int, timing: ExecutionTiming) -> None:
        """The statistics, traces and timing estimate of the executions a batch's ``executed`` requests were."""
        executions = self.execution.executions(executed)
        if executions == 1:
            total = sum(item.batch_size for item in executed)
            self.stats.record_execution(total, timing.input_ns, timing.infer_ns, timing.output_ns, len(executed))
        else:
            for item in executed:  # each its share of the measured phases
                self.stats.record_execution(item.batch_size, timing.input_ns // executions,
                                            timing.infer_ns // executions, timing.output_ns // executions, 1)
        trace_compute(executed, started, elapsed, timing)
        self.forming.note_execution(elapsed / 1e9 / executions)
