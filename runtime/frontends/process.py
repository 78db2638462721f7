"""A front-end process: the HTTP and gRPC adapters over :class:`RemoteService`, until SIGTERM, then drained.

Started by :class:`runtime.frontends.pool.FrontEndPool` as ``python -m runtime.frontends.process LINK CONTROL``
with those two descriptors inherited; its settings arrive first on CONTROL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import socket
import sys

from runtime.adapters import ProtocolAdapters
from runtime.extensions.log_settings import redact_secrets, storage_secrets
from runtime.frontends.pool import HEARTBEAT_INTERVAL, FrontEndSettings
from runtime.frontends.remote import RemoteService
from runtime.frontends.wire import receive_blocking
from runtime.thread_policy import batch_threads

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _end_with_parent() -> None:
    """Linux: this process gets SIGTERM when the owner dies (no front end outlives its models)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


async def serve(link: socket.socket, control: socket.socket) -> int:
    settings: FrontEndSettings = receive_blocking(control)
    logging.getLogger().setLevel(settings.log_level)
    redact_secrets([settings.adapters.auth_token or "", *storage_secrets()])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    service = RemoteService(link, control, on_lost=stop.set)
    await service.connect()
    adapters = ProtocolAdapters(service, settings.adapters, reuse_port=True, direct_paths=False)  # remote: none
    try:
        await adapters.start()
    except OSError as exc:
        service.started(f"front end {settings.index}: {exc}")
        await asyncio.gather(*adapters.stops(0), return_exceptions=True)
        await service.close()
        return 1
    service.started(None)
    heartbeat = asyncio.create_task(service.beat(HEARTBEAT_INTERVAL))
    batching = batch_threads() if settings.batch_scheduled_threads else None
    await asyncio.wait([asyncio.create_task(stop.wait()), *adapters.tasks], return_when=asyncio.FIRST_COMPLETED)
    heartbeat.cancel()
    if batching is not None:
        batching.cancel()
    service.begin_shutdown()
    await asyncio.gather(*adapters.stops(settings.shutdown_timeout), return_exceptions=True)
    await service.close()
    return 0


def main(argv: list[str]) -> int:
    _end_with_parent()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s[front end]: %(message)s", stream=sys.stderr)
    link = socket.socket(fileno=int(argv[0]))
    control = socket.socket(fileno=int(argv[1]))
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(link, control))
    return uvloop.run(serve(link, control))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
