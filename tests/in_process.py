"""The core built in process, as the composition root builds it, for tests that need no process and no port: the
service over a repository, and the REST app over it through ``httpx.ASGITransport``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from handlers import handler_class
from handlers.auto_complete import complete_config
from runtime.adapter_settings import AdapterSettings
from runtime.core import InferenceService
from runtime.http.app import create_http_app
from runtime.server import Server, ServerOptions


@asynccontextmanager
async def core(repository: Path, **options) -> AsyncIterator[InferenceService]:
    """The inference core over ``repository``, its models loaded, unloaded on the way out."""
    server = Server(ServerOptions(model_repository=repository, adapters=AdapterSettings(http_port=None, grpc_port=None),
                                  metrics_port=None, use_gpu=False, handlers=handler_class, completer=complete_config,
                                  **options))
    await server.service.load_initial_models()
    try:
        yield server.service
    finally:
        await server.manager.unload_all(time.monotonic() + 10)


@asynccontextmanager
async def rest(service: InferenceService) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the REST app over ``service``, in process."""
    transport = httpx.ASGITransport(app=create_http_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://in-process") as client:
        yield client
