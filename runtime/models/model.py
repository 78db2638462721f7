"""A loaded model version: its handler instances, its scheduler and its statistics."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from runtime.config.spec import ModelSpec
from runtime.errors import ModelLoadError, ServingError, Unavailable
from runtime.handler import HandlerContext, HandlerRegistry, ModelHandler, first_load_alone
from runtime.models.labels import load_labels
from runtime.models.warmup import run_warmup
from runtime.scheduling.rate_limiter import RateLimiter
from runtime.scheduling.scheduler import DEFAULT_MAX_QUEUE_SIZE, Scheduler
from runtime.scheduling.sequence import DEFAULT_SLOT_TIMEOUT_SECONDS, SequenceScheduler
from runtime.scheduling.stats import FailureReason, LatencyHistogram, ModelStatistics, configured_buckets
from runtime.scheduling.wait_graph import WaitGraph
from runtime.types import InferRequest

logger = logging.getLogger(__name__)


UNLOADED = "unloaded"


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass
class ModelVersion:
    """One version of one model, with ``instance_count`` handler instances."""

    spec: ModelSpec
    version: int
    state: ModelState = ModelState.LOADING
    reason: str = ""
    signature: str = ""  # what the version folder held when loaded (detects changes on disk)
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    sequence_slot_timeout: float = DEFAULT_SLOT_TIMEOUT_SECONDS  # sequence batching: a new sequence's wait for a slot
    waits: WaitGraph | None = field(default=None, repr=False)  # the server's (its manager's): executions and waits
    rate_limiter: RateLimiter | None = field(default=None, repr=False)  # the server's, when rate limiting is on
    handlers: HandlerRegistry | None = field(default=None, repr=False)  # the backends, from the composition root
    instances: list[ModelHandler] = field(default_factory=list)
    stats: ModelStatistics = field(default_factory=ModelStatistics)
    labels: dict[str, list[str]] = field(default_factory=dict)  # output -> its class labels (label_filename)
    model_dir: Path | None = None  # the model's folder (label files are read from it)
    load_seconds: float = 0.0  # how long its load took (Triton 2.52's nv_model_load_duration_secs)
    scheduler: Scheduler | SequenceScheduler | None = field(default=None, repr=False)
    _executor: ThreadPoolExecutor | None = field(default=None, repr=False)
    _in_flight: int = 0
    _drained: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def __post_init__(self) -> None:
        self._drained.set()  # nothing in flight until the first request
        proto = self.spec.proto
        buckets = configured_buckets(proto.model_metrics, self.spec.name) if proto is not None else None
        if buckets is not None:
            self.stats.first_response = LatencyHistogram(buckets)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def in_service(self) -> bool:
        """Loaded and routed to (even while its instances are being restarted)."""
        return self.state is ModelState.READY

    @property
    def retired(self) -> bool:
        """Unloading or unloaded on purpose (replaced, removed, or unloaded on request)."""
        return self.state is ModelState.UNLOADING or self.reason == UNLOADED

    @property
    def ready(self) -> bool:
        """READY, and at least one instance can serve now (available, and not stuck past its execute timeout)."""
        if self.state is not ModelState.READY:
            return False
        scheduler = self.scheduler
        for instance in self.instances:  # a loop, not any(): asked two or three times per request
            if instance.available and (scheduler is None or not scheduler.is_overdue(instance)):
                return True
        return False

    def status(self) -> tuple[str, str]:
        """(state, reason) as the repository index shows them: a READY version none of whose instances can serve
        (a Python worker being restarted, an execution stuck past its timeout) shows UNAVAILABLE with why."""
        if self.state is ModelState.READY and not self.ready:
            overdue = self.scheduler.overdue() if self.scheduler is not None else {}
            reasons = [f"instance {instance.context.instance_index} has been executing for {overdue[instance]:.0f}s, "
                       f"past its {instance.execute_timeout:g}s execute timeout" if instance in overdue
                       else instance.unavailable_reason for instance in self.instances]
            return ModelState.UNAVAILABLE.value, "; ".join(dict.fromkeys(reasons))
        return self.state.value, self.reason

    @property
    def device(self) -> str:
        return self.instances[0].device if self.instances else "-"

    @property
    def pending(self) -> int:
        return self.scheduler.pending if self.scheduler else 0

    @property
    def busy(self) -> bool:
        """Requests in flight or queued: unloading it now would cut them off."""
        return self._in_flight > 0 or self.pending > 0

    def load(self, contexts: list[HandlerContext]) -> None:
        """Create, load and warm up every instance (blocking: call from a worker thread)."""
        if self.handlers is None:
            raise RuntimeError("a model version loads through the handler registry its manager was given")
        cls = self.handlers(self.spec.handler)
        try:
            if self.rate_limiter is not None:
                self.rate_limiter.admit(self.name, [needs for needs, _ in self.spec.instance_needs()])
            self.load_labels()
            for context in contexts:
                instance = cls(context)
                self.instances.append(instance)
                with first_load_alone(cls):
                    instance.load()
                    run_warmup(self.spec, context.model_dir, instance)
        except ModelLoadError as exc:
            self._unload_instances()
            self.state, self.reason = ModelState.UNAVAILABLE, str(exc)
            return
        except Exception as exc:  # noqa: BLE001 - a handler bug must not take the server down
            logger.exception("unexpected error loading model '%s' version %d", self.name, self.version)
            self._unload_instances()
            self.state, self.reason = ModelState.UNAVAILABLE, f"load failed: {type(exc).__name__}: {exc}"
            return
        self._executor = ThreadPoolExecutor(
            max_workers=len(self.instances), thread_name_prefix=f"{self.name}-v{self.version}"
        )

    def load_labels(self) -> None:
        """Read the label files the outputs name (the classification extension); ModelLoadError if one fails."""
        for output in self.spec.outputs:
            if output.label_filename and self.model_dir is not None:
                self.labels[output.name] = load_labels(self.model_dir, output.label_filename, output.name)

    def start(self) -> None:
        """Start scheduling on the running event loop; the version is READY from here on."""
        assert self._executor is not None  # made by load()
        if self.spec.sequence is not None:
            self.scheduler = SequenceScheduler(self.spec, self.instances, self._executor, self.stats,
                                               self.max_queue_size, self.sequence_slot_timeout, self.waits)
        else:
            self.scheduler = Scheduler(self.spec, self.instances, self._executor, self.stats, self.max_queue_size,
                                       waits=self.waits, rate_limiter=self.rate_limiter)
        self.state, self.reason = ModelState.READY, ""

    @property
    def loaded(self) -> bool:
        return self._executor is not None and bool(self.instances)

    async def infer(self, request: InferRequest, batch_size: int) -> dict[str, np.ndarray]:
        """Run one request through the scheduler; its outcome and timings go into :attr:`stats`.  The core found
        the version :attr:`ready` (``ModelManager.get``) just before, so only its state is checked again here (an
        instance lost since then holds the request in the queue until it is back, as for a queued one)."""
        if self.state is not ModelState.READY or self.scheduler is None:
            raise Unavailable(f"model '{self.name}' version {self.version} is not ready")
        started = time.perf_counter_ns()
        failure: FailureReason | None = FailureReason.OTHER
        queue_ns = 0
        self._in_flight += 1
        if self._in_flight == 1:
            self._drained.clear()
        try:
            try:
                result, queue_ns = await self.scheduler.submit(request, batch_size)
            except Unavailable:  # the queue was full, or the request timed out in it
                failure = FailureReason.REJECTED
                raise
            except asyncio.CancelledError:  # the client went away
                failure = FailureReason.CANCELED
                raise
            if isinstance(result, ServingError):
                result.executed = True
                failure = FailureReason.BACKEND
                raise result
            failure = None
            return cast(dict[str, np.ndarray], result)  # a scheduler's result for one request: its outputs
        finally:
            self.stats.record_request(failure, time.perf_counter_ns() - started, queue_ns, batch_size)
            self._in_flight -= 1
            if self._in_flight == 0:
                self._drained.set()

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait for in-flight requests to finish; False on timeout."""
        try:
            await asyncio.wait_for(self._drained.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def stop(self, deadline: float | None = None) -> None:
        """Stop scheduling (queued requests get UNAVAILABLE), then unload in a worker thread.

        ``deadline`` (``time.monotonic()``) bounds finalize: instances still busy then are killed.
        """
        if self.scheduler is not None:
            await self.scheduler.close()
            self.scheduler = None
        await asyncio.to_thread(self.unload, deadline)

    def unload(self, deadline: float | None = None) -> None:
        """Release every instance (blocking: finalize may run user code)."""
        self._unload_instances(deadline)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        if self.state is not ModelState.UNAVAILABLE:
            self.state = ModelState.UNAVAILABLE
            self.reason = UNLOADED

    def _unload_instances(self, deadline: float | None = None) -> None:
        for instance in self.instances:
            try:
                instance.unload(deadline)
            except Exception:  # noqa: BLE001
                logger.exception("error unloading model '%s' version %d", self.name, self.version)
        self.instances.clear()
