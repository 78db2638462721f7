"""Runs the servers over one inference core until told to stop, then drains."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.adapter_settings import AdapterSettings
from runtime.allocator import keep_giving_back_free_memory
from runtime.core import InferenceService
from runtime.dataclass_code import release_compiled_code
from runtime.devices import gpu_count
from runtime.extensions.response_cache import ResponseCache
from runtime.extensions.tracing import Tracer, TraceSettings, trace_exporter
from runtime.handler import DEFAULT_EXECUTE_TIMEOUT_SECONDS, HandlerRegistry
from runtime.idle_timers import aligned_delay
from runtime.models.control import ModelControl, RepositorySource
from runtime.models.manager import ModelManager
from runtime.models.on_demand import OnDemandLoader, OnDemandSettings
from runtime.models.repository import ConfigCompleter, ModelRepository
from runtime.openai.restrictions import restriction_guard
from runtime.scheduling.rate_limiter import RateLimiter
from runtime.scheduling.scheduler import DEFAULT_MAX_QUEUE_SIZE
from runtime.scheduling.sequence import DEFAULT_SLOT_TIMEOUT_SECONDS
from runtime.startup_gc import resume_collection
from runtime.tensor_pool import DEFAULT_MAX_BYTES as DEFAULT_POOL_BYTES
from runtime.tensor_pool import TensorPool
from runtime.thread_policy import batch_threads

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from runtime.adapters import ProtocolAdapters
    from runtime.frontends.pool import FrontEndPool
    from runtime.http.server import HttpServer

logger = logging.getLogger(__name__)

# Exit codes of `bootstrap run` (2, invalid settings, is the CLI's).
EXIT_OK = 0  # stopped and drained cleanly
EXIT_FAILED = 1  # could not start (port taken, storage unreachable) or a server stopped unexpectedly
EXIT_CUT_OFF = 3  # stopped at the shutdown deadline: in-flight work was cut off, busy workers killed
# How long after the cold start's models are ready the start-up work that waits for them begins.
AFTER_LOAD_SECONDS = 1.0
# How long past the shutdown deadline the process may take to wind down before it is ended outright.
EXIT_GRACE_SECONDS = 5.0


@dataclass
class ServerOptions:
    """What the servers need; bootstrap builds it from function.yaml and flags."""

    model_repository: Path
    adapters: AdapterSettings = field(default_factory=AdapterSettings)  # the HTTP and gRPC endpoints
    metrics_port: int | None = 8002
    metrics_histograms: bool = False  # --metrics-config histogram_latencies=true: Triton's latency histograms
    use_gpu: bool = True
    default_max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    sequence_slot_timeout: float = DEFAULT_SLOT_TIMEOUT_SECONDS
    execute_timeout: float = DEFAULT_EXECUTE_TIMEOUT_SECONDS
    server_name: str = "triton"
    strict_readiness: bool = True
    allow_client_shm: bool = False  # clients may register shared-memory regions (Triton's --allow-client-shm)
    auto_complete_config: bool = True  # config-less Python and ONNX models; Triton's auto-complete runs
    shutdown_timeout: float = 30.0
    trace: TraceSettings = field(default_factory=TraceSettings)  # --trace-config
    rate_limit_resources: dict[str, int] | None = None  # --rate-limit=execution_count's counts (None: off)
    model_control: str = "none"  # none | poll | explicit | on_demand
    on_demand: OnDemandSettings | None = None  # model control on_demand: keep-warm time, memory budget, ...
    startup_models: tuple[str, ...] = ()  # explicit mode: models loaded at start ("*": all)
    model_load_concurrency: int = 4  # models loading at once (--model-load-thread-count)
    poll_interval: float = 5.0
    idle_timeout: float = 0.0  # exit after this long without requests (0: never)
    source: RepositorySource | None = None  # e.g. the object-storage sync; None: a local folder
    cache_size_bytes: int = 0  # the response cache's budget (0: no cache)
    tensor_pool_bytes: int = DEFAULT_POOL_BYTES  # shared memory large tensors are received into (0: none)
    environments_dir: Path | None = None  # private folder Python models' packed environments are unpacked into
    frontend_processes: int = 0  # >0: that many processes serve HTTP and gRPC, this one the models (frontends/)
    batch_scheduled_threads: bool = True  # every thread, the loop's too, and the workers under SCHED_BATCH
    # From the composition root (bootstrap), so that runtime never imports a backend: the backends' registry, and
    # the auto-complete that fills in configs (Triton's), used unless auto_complete_config is off.
    handlers: HandlerRegistry | None = None
    completer: ConfigCompleter | None = None


def _import_adapters(grpc: bool) -> None:
    """Import what serving the protocols needs (the caller's thread then finds it imported)."""
    import runtime.adapters  # noqa: F401 - imported for its side effect: the HTTP stack loaded

    if grpc:
        import runtime.grpc.server  # noqa: F401


def _end_process_after(seconds: float, code: int) -> None:
    """Last resort: end the process if winding down blocks past ``seconds`` (a thread stuck in a model)."""

    def watchdog() -> None:
        time.sleep(seconds)
        logger.error("shutdown did not finish %.0fs after its deadline: exiting now", EXIT_GRACE_SECONDS)
        logging.shutdown()
        os._exit(code)

    threading.Thread(target=watchdog, daemon=True, name="exit-watchdog").start()


class Server:
    """The inference core plus its protocol endpoints."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.manager = ModelManager(
            ModelRepository(options.model_repository, gpu_count() if options.use_gpu else 0,
                            completer=options.completer if options.auto_complete_config else None),
            use_gpu=options.use_gpu,
            load_concurrency=options.model_load_concurrency,
            drain_timeout=options.shutdown_timeout,
            max_queue_size=options.default_max_queue_size,
            sequence_slot_timeout=options.sequence_slot_timeout,
            execute_timeout=options.execute_timeout,
            rate_limiter=RateLimiter(options.rate_limit_resources) if options.rate_limit_resources is not None
            else None,
            handlers=options.handlers,
            environments_dir=options.environments_dir,
        )
        self.control = ModelControl(self.manager, options.model_control, options.poll_interval, options.source,
                                    options.startup_models)
        cache = ResponseCache(options.cache_size_bytes) if options.cache_size_bytes > 0 else None
        on_demand = None
        if options.model_control == "on_demand":
            on_demand = OnDemandLoader(self.manager, options.on_demand or OnDemandSettings(),
                                       self.control.refresh if options.source is not None else None)
        self.service = InferenceService(self.manager, self.control, options.server_name, options.strict_readiness,
                                        cache, Tracer(options.trace, export=trace_exporter(options.trace)),
                                        on_demand, TensorPool(options.tensor_pool_bytes) if options.tensor_pool_bytes
                                        else None, allow_client_shm=options.allow_client_shm,
                                        latency_histograms=options.metrics_histograms)
        self.exit_code = 0

    async def run(self, stop: asyncio.Event) -> int:
        """Serve, load the repository, wait for ``stop``, then drain and finalize; returns the exit code.

        Shutdown is bounded: listeners stop accepting and in-flight requests drain while models
        unload, all within ``shutdown_timeout``; what still runs then is cut off (exit code 3).
        """
        options, endpoints = self.options, self.options.adapters
        auth = endpoints.auth()
        if auth is None:
            logger.warning("no auth token configured: every endpoint is open to anyone who can reach it")
        listeners: list[HttpServer] = []  # this process's own: metrics
        adapters: ProtocolAdapters | FrontEndPool | None = None
        after_load: list[Callable[[], None]] = []  # start-up work that waits until the cold start's models are loaded
        listening = asyncio.Event()
        # Models load while the protocol stacks import and the listeners start (nothing is served before they are
        # up anyway): a Python model's worker comes up meanwhile on another core.
        batching = batch_threads() if options.batch_scheduled_threads else None  # before any worker starts
        background = [asyncio.create_task(self._initial_load(stop, listening, after_load)),
                      asyncio.create_task(keep_giving_back_free_memory(
                          last_activity=lambda: self.service.last_activity))]  # a burst's memory goes back
        if batching is not None:
            background.append(batching)
        try:
            # in a thread, the loop going on with the load meanwhile (starlette, granian, grpc: a third of a start)
            await asyncio.to_thread(_import_adapters, grpc=endpoints.grpc_port is not None)
            from runtime.adapters import ProtocolAdapters
            from runtime.http.app import create_metrics_app
            from runtime.http.server import HttpServer

            if options.frontend_processes > 0:
                adapters = self._frontend_pool()
            else:
                adapters = ProtocolAdapters(self.service, endpoints)
            await adapters.start()
            if options.metrics_port is not None:
                metrics = create_metrics_app(self._metrics_registry, auth,
                                             restriction_guard(options.adapters.openai.restrictions))
                after_load.append(metrics.state.prepare_metrics)
                listeners.append(HttpServer(metrics, endpoints.host, options.metrics_port, endpoints.http_limits))
            for listener in listeners:
                await listener.start()
        except OSError as exc:
            logger.error("%s", exc)
            self.exit_code = EXIT_FAILED
            await self._shutdown(listeners, adapters, background)
            return EXIT_FAILED
        listening.set()
        if options.metrics_port is not None:
            logger.info("metrics on %s:%d/metrics", endpoints.host, options.metrics_port)
        if options.idle_timeout > 0:
            background.append(asyncio.create_task(self._exit_when_idle(stop)))
        stopped = asyncio.create_task(stop.wait())
        serving = [*adapters.tasks, *(listener.task for listener in listeners if listener.task is not None)]
        done, _ = await asyncio.wait([stopped, *serving], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopped:
                logger.error("a server stopped unexpectedly: %s", task.exception() if not task.cancelled() else "")
                self.exit_code = EXIT_FAILED
        stopped.cancel()
        await self._shutdown(listeners, adapters, background)
        self.service.shared_memory.close()  # unmap every region clients registered
        self.service.tracer.close()  # traces not yet written go to the trace file
        logger.info("stopped")
        return self.exit_code

    def _metrics_registry(self) -> CollectorRegistry:
        """The registry /metrics renders: the core's models, cache and on-demand loader, and what Python models
        define (pb_utils.MetricFamily)."""
        from runtime.extensions.metrics import metrics_registry

        service = self.service
        registry = metrics_registry(service.manager, service.cache, service.on_demand, self.options.metrics_histograms)
        registry.register(service.custom_metrics)
        return registry

    def _frontend_pool(self) -> FrontEndPool:
        from runtime.frontends.pool import FrontEndPool, FrontEndSettings

        options = self.options
        settings = FrontEndSettings(index=0, adapters=options.adapters, shutdown_timeout=options.shutdown_timeout,
                                    log_level=logging.getLogger().getEffectiveLevel(),
                                    batch_scheduled_threads=options.batch_scheduled_threads)
        return FrontEndPool(self.service, options.frontend_processes, settings)

    async def _shutdown(self, listeners: list[HttpServer], adapters: ProtocolAdapters | FrontEndPool | None,
                        background: list[asyncio.Task]) -> None:
        timeout = self.options.shutdown_timeout
        deadline = time.monotonic() + timeout
        _end_process_after(timeout + EXIT_GRACE_SECONDS, EXIT_CUT_OFF)
        logger.info("shutting down: draining in-flight requests (at most %gs)", timeout)
        self.service.begin_shutdown()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        stops = [listener.stop(timeout) for listener in listeners]
        if adapters is not None:
            stops.extend(adapters.stops(timeout))
        results = await asyncio.gather(*stops, self.manager.unload_all(deadline), return_exceptions=True)
        if any(result is False for result in results) or self.manager.drain_incomplete:
            logger.warning("shutdown deadline reached: in-flight work was cut off")
            if self.exit_code == EXIT_OK:
                self.exit_code = EXIT_CUT_OFF

    async def _initial_load(self, stop: asyncio.Event, listening: asyncio.Event,
                            after_load: list[Callable[[], None]]) -> None:
        try:
            await self.service.load_initial_models()
        except Exception as exc:  # noqa: BLE001 - a cold start that cannot list its models is fatal
            logger.error("cold start failed: %s", exc)
            self.exit_code = EXIT_FAILED
            stop.set()
            return
        ready = sum(1 for row in self.manager.index() if row.get("state") == "READY")
        logger.info("initial load finished: %d model version(s) ready", ready)
        await listening.wait()

        def start_after_load() -> None:
            resume_collection()  # paused by bootstrap for the start (runtime/startup_gc.py)
            release_compiled_code()  # loaded by bootstrap for the start (runtime/dataclass_code.py)
            for prepare in after_load:  # in a thread: the first requests may be arriving now
                threading.Thread(target=prepare, daemon=True, name="after-load").start()

        # a little later: the platform's readiness probes and first requests come first (the work takes tens of
        # milliseconds of the loop's interpreter)
        asyncio.get_running_loop().call_later(AFTER_LOAD_SECONDS, start_after_load)
        if self.options.model_control == "poll":
            await self.control.poll_forever()

    async def _exit_when_idle(self, stop: asyncio.Event) -> None:
        timeout = self.options.idle_timeout
        while True:
            await asyncio.sleep(aligned_delay(min(1.0, timeout)))
            idle = time.monotonic() - self.service.last_activity
            if self.service.in_flight == 0 and idle >= timeout:
                logger.info("idle for %.0fs: stopping", idle)
                stop.set()
                return
