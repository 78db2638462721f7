"""Runs the servers over one inference core until told to stop, then drains."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config as HypercornConfig

from runtime.auth import TokenAuth
from runtime.control import ModelControl, RepositorySource
from runtime.core import InferenceService
from runtime.grpc.server import DEFAULT_MAX_MESSAGE_BYTES, create_grpc_server
from runtime.http.app import create_http_app, create_metrics_app
from runtime.http.body import DEFAULT_MAX_BODY_BYTES
from runtime.manager import ModelManager
from runtime.repository import ModelRepository
from runtime.scheduler import DEFAULT_MAX_QUEUE_SIZE

logger = logging.getLogger(__name__)


@dataclass
class ServerOptions:
    """What the servers need; bootstrap builds it from function.yaml and flags."""

    model_repository: Path
    host: str = "0.0.0.0"
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    metrics_port: int | None = 8002
    use_gpu: bool = True
    default_max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    grpc_max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    auth_token: str | None = None
    auth_exempt_health: bool = True
    shutdown_timeout: float = 30.0
    model_control: str = "none"  # none | poll | explicit
    poll_interval: float = 5.0
    idle_timeout: float = 0.0  # exit after this long without requests (0: never)
    source: RepositorySource | None = None  # e.g. the object-storage sync; None: a local folder


def _hypercorn_config(options: ServerOptions, port: int) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [f"{options.host}:{port}"]
    config.graceful_timeout = options.shutdown_timeout
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 75
    return config


class Server:
    """The inference core plus its protocol endpoints."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.manager = ModelManager(
            ModelRepository(options.model_repository),
            use_gpu=options.use_gpu,
            drain_timeout=options.shutdown_timeout,
            max_queue_size=options.default_max_queue_size,
        )
        self.control = ModelControl(self.manager, options.model_control, options.poll_interval, options.source)
        self.service = InferenceService(self.manager, self.control)
        self.exit_code = 0

    async def run(self, stop: asyncio.Event) -> int:
        """Serve, load the repository, wait for ``stop``, then drain and finalize; returns the exit code."""
        options = self.options
        auth = TokenAuth(options.auth_token) if options.auth_token else None
        if auth is None:
            logger.warning("no auth token configured: every endpoint is open to anyone who can reach it")
        tasks: list[asyncio.Task] = []
        servers_stop = asyncio.Event()
        grpc_server = None
        if options.grpc_port is not None:
            address = f"{options.host}:{options.grpc_port}"
            try:
                grpc_server = create_grpc_server(self.service, address, options.grpc_max_message_bytes, auth)
            except OSError as exc:
                logger.error("%s", exc)
                return 1
            await grpc_server.start()
            logger.info("gRPC endpoint on %s", address)
        if options.http_port is not None:
            app = create_http_app(self.service, options.max_body_bytes, auth, options.auth_exempt_health)
            config = _hypercorn_config(options, options.http_port)
            tasks.append(asyncio.create_task(hypercorn_serve(app, config, shutdown_trigger=servers_stop.wait)))
            logger.info("HTTP endpoint on %s:%d (HTTP/1.1 and h2c)", options.host, options.http_port)
        if options.metrics_port is not None:
            metrics = create_metrics_app(self.service, auth)
            config = _hypercorn_config(options, options.metrics_port)
            tasks.append(asyncio.create_task(hypercorn_serve(metrics, config, shutdown_trigger=servers_stop.wait)))
            logger.info("metrics on %s:%d/metrics", options.host, options.metrics_port)
        background = [asyncio.create_task(self._initial_load(stop))]
        if options.idle_timeout > 0:
            background.append(asyncio.create_task(self._exit_when_idle(stop)))
        stopped = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopped and task.exception() is not None:
                logger.error("a server stopped unexpectedly: %s", task.exception())
                self.exit_code = 1
        logger.info("shutting down: draining in-flight requests")
        self.service.shutting_down = True
        servers_stop.set()
        for task in background:
            task.cancel()
        if grpc_server is not None:
            tasks.append(asyncio.create_task(grpc_server.stop(options.shutdown_timeout)))
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*background, return_exceptions=True)
        await self.manager.unload_all()
        logger.info("stopped")
        return self.exit_code

    async def _initial_load(self, stop: asyncio.Event) -> None:
        try:
            await self.control.initial_load()
        except Exception as exc:  # noqa: BLE001 - a cold start that cannot list its models is fatal
            logger.error("cold start failed: %s", exc)
            self.exit_code = 1
            stop.set()
            return
        self.service.initial_load_done = True
        ready = sum(1 for row in self.manager.index() if row.get("state") == "READY")
        logger.info("initial load finished: %d model version(s) ready", ready)
        if self.options.model_control == "poll":
            await self.control.poll_forever()

    async def _exit_when_idle(self, stop: asyncio.Event) -> None:
        timeout = self.options.idle_timeout
        while True:
            await asyncio.sleep(min(1.0, timeout))
            idle = time.monotonic() - self.service.last_activity
            if self.service.in_flight == 0 and idle >= timeout:
                logger.info("idle for %.0fs: stopping", idle)
                stop.set()
                return
