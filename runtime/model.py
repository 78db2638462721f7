"""A loaded model version: its handler instances and the way requests reach them."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from handlers import HandlerContext, ModelHandler, RequestResult, handler_class
from runtime.config import ModelSpec
from runtime.errors import InternalError, ModelLoadError, ServingError, Unavailable
from runtime.stats import ModelStatistics
from runtime.types import InferRequest
from runtime.warmup import run_warmup

logger = logging.getLogger(__name__)


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
    instances: list[ModelHandler] = field(default_factory=list)
    stats: ModelStatistics = field(default_factory=ModelStatistics)
    _idle: asyncio.Queue | None = field(default=None, repr=False)
    _executor: ThreadPoolExecutor | None = field(default=None, repr=False)
    _in_flight: int = 0
    _drained: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    @property
    def device(self) -> str:
        return self.instances[0].device if self.instances else "-"

    def load(self, contexts: list[HandlerContext]) -> None:
        """Create and load every instance (blocking: call from a worker thread)."""
        cls = handler_class(self.spec.handler)
        try:
            for context in contexts:
                instance = cls(context)
                instance.load()
                self.instances.append(instance)
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
        self.state, self.reason = ModelState.READY, ""

    def bind_loop(self) -> None:
        """Create the idle-instance queue on the running event loop."""
        self._idle = asyncio.Queue()
        for instance in self.instances:
            self._idle.put_nowait(instance)
        self._drained.set()

    async def infer(self, request: InferRequest, batch_size: int) -> dict[str, np.ndarray]:
        """Run one request; its outcome and timings go into :attr:`stats`."""
        started = time.perf_counter_ns()
        ok, queue_ns = False, 0
        try:
            results, queue_ns = await self.execute([request], batch_size)
            (result,) = results
            if isinstance(result, ServingError):
                raise result
            ok = True
            return result
        finally:
            self.stats.record_request(ok, time.perf_counter_ns() - started, queue_ns, batch_size)

    async def execute(self, requests: list[InferRequest], batch_size: int) -> tuple[list[RequestResult], int]:
        """Run requests together on the next idle instance, in a worker thread.

        Returns one result per request and the nanoseconds spent waiting for an instance.
        """
        if not self.ready or self._idle is None:
            raise Unavailable(f"model '{self.name}' version {self.version} is not ready")
        self._in_flight += 1
        self._drained.clear()
        try:
            queued = time.perf_counter_ns()
            instance = await self._idle.get()
            queue_ns = time.perf_counter_ns() - queued
            try:
                loop = asyncio.get_running_loop()
                started = time.perf_counter_ns()
                results = await loop.run_in_executor(self._executor, instance.execute, requests)
                self.stats.record_execution(batch_size, 0, time.perf_counter_ns() - started, 0, len(requests))
            finally:
                self._idle.put_nowait(instance)
            if len(results) != len(requests):
                error = InternalError(f"model '{self.name}' returned {len(results)} results for {len(requests)}")
                results = [error] * len(requests)
            return results, queue_ns
        finally:
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

    def unload(self) -> None:
        """Release every instance (blocking: finalize may run user code)."""
        self._unload_instances()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        if self.state is not ModelState.UNAVAILABLE:
            self.state = ModelState.UNAVAILABLE
            self.reason = "unloaded"

    def _unload_instances(self) -> None:
        for instance in self.instances:
            try:
                instance.unload()
            except Exception:  # noqa: BLE001
                logger.exception("error unloading model '%s' version %d", self.name, self.version)
        self.instances.clear()
