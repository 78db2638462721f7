"""The owner's front-end processes: started with their links and listening sockets, restarted if one dies,
stopped (each draining its requests) at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from runtime.adapter_settings import AdapterSettings
from runtime.frontends.endpoint import serve_link
from runtime.frontends.wire import send_blocking
from runtime.http.server import check_bindable

logger = logging.getLogger(__name__)

START_TIMEOUT = 60.0  # a front end that is not listening by then failed to start
RESTART_DELAY = 1.0
# A front end tells the owner every HEARTBEAT_INTERVAL seconds that its loop runs; one silent for HEARTBEAT_TIMEOUT
# (stopped, frozen, its loop blocked) is killed and replaced, since the kernel keeps routing connections to it.
HEARTBEAT_INTERVAL = 0.5
HEARTBEAT_TIMEOUT = 5.0
_WATCH_INTERVAL = 0.2


@dataclass
class FrontEndSettings:
    """What a front-end process serves, sent to it over its control socket as it starts."""

    index: int
    adapters: AdapterSettings
    shutdown_timeout: float = 30.0
    log_level: int = logging.INFO
    batch_scheduled_threads: bool = True  # its threads, the loop's too, under SCHED_BATCH (runtime/thread_policy.py)


@dataclass
class _FrontEnd:
    index: int
    process: subprocess.Popen
    links: list[asyncio.Task]
    started: asyncio.Future
    heard: float = field(default_factory=time.monotonic)  # its last heartbeat

    def silent_for(self, now: float) -> float:
        """Seconds since its last heartbeat, once it listens (0 before)."""
        listening = self.started.done() and self.started.result() is None
        return now - self.heard if listening else 0.0


class FrontEndPool:
    """``count`` front-end processes serving the HTTP and gRPC ports for the core ``service``.

    Each front end listens on the HTTP and gRPC ports with SO_REUSEPORT, so the kernel spreads connections
    evenly over them (one shared listening socket would let whichever accepts first take most of a burst); this
    process holds a bound socket in each group, so that nothing else can take a port between restarts.
    """

    def __init__(self, service: Any, count: int, settings: FrontEndSettings) -> None:
        self.service = service
        self.count = count
        self.settings = settings
        self.frontends: dict[int, _FrontEnd] = {}
        self.stopping = False
        self._held: list[socket.socket] = []
        self._watch: asyncio.Task | None = None

    async def start(self) -> None:
        """Bind the ports, start every front end and wait until each listens; OSError if one cannot."""
        settings = self.settings.adapters
        self._held = [_hold_port(settings.host, port, server) for port, server in
                      ((settings.http_port, "HTTP"), (settings.grpc_port, "gRPC")) if port is not None]
        starting = [self._spawn(index) for index in range(self.count)]
        failures = [f for f in await asyncio.gather(*(f.started for f in starting)) if f]
        if failures:
            raise OSError(failures[0])
        self._watch = asyncio.create_task(self._restart_failed())
        logger.info("%d front-end processes serving", self.count)

    def _spawn(self, index: int) -> _FrontEnd:
        link_owner, link_frontend = socket.socketpair()
        control_owner, control_frontend = socket.socketpair()
        passed = [link_frontend.fileno(), control_frontend.fileno()]
        process = subprocess.Popen(
            [sys.executable, "-m", "runtime.frontends.process", *map(str, passed)], pass_fds=passed,
        )
        link_frontend.close()
        control_frontend.close()
        send_blocking(control_owner, dataclasses.replace(self.settings, index=index))
        frontend = _FrontEnd(index, process, [], asyncio.get_running_loop().create_future())

        def on_started(failure: str | None) -> None:
            if not frontend.started.done():
                frontend.heard = time.monotonic()
                frontend.started.set_result(failure)

        def on_heartbeat() -> None:
            frontend.heard = time.monotonic()

        frontend.links = [asyncio.create_task(serve_link(self.service, link_owner, on_started, on_heartbeat)),
                          asyncio.create_task(serve_link(self.service, control_owner))]
        self.frontends[index] = frontend
        asyncio.get_running_loop().call_later(START_TIMEOUT, on_started, f"front end {index} did not start")
        frontend.links[0].add_done_callback(lambda _: on_started(f"front end {index} exited while starting"))
        return frontend

    async def _restart_failed(self) -> None:
        """A front end that exits while the server runs is started again (its in-flight requests are lost); one
        that stops sending heartbeats is killed first."""
        tick = time.monotonic()
        while not self.stopping:
            await asyncio.sleep(_WATCH_INTERVAL)
            now = time.monotonic()
            if now - tick > HEARTBEAT_INTERVAL * 4:  # this loop was stalled itself: heartbeats wait unread
                for frontend in self.frontends.values():
                    frontend.heard = now
            tick = now
            self._kill_silent(now)
            for index, frontend in list(self.frontends.items()):
                code = frontend.process.poll()
                if code is None or self.stopping:
                    continue
                logger.error("front-end process %d exited with code %s: starting it again", index, code)
                for link in frontend.links:
                    link.cancel()
                await asyncio.sleep(RESTART_DELAY)
                if not self.stopping:
                    replacement = self._spawn(index)
                    failure = await replacement.started
                    if failure:
                        logger.error("%s", failure)

    def _kill_silent(self, now: float) -> None:
        for frontend in self.frontends.values():
            silent = frontend.silent_for(now)
            if silent > HEARTBEAT_TIMEOUT and frontend.process.poll() is None:
                logger.error("front-end process %d sent no heartbeat for %.1fs (stopped or frozen): killing it",
                             frontend.index, silent)
                with contextlib.suppress(ProcessLookupError):
                    frontend.process.kill()
                frontend.process.wait()

    @property
    def tasks(self) -> list[asyncio.Task]:
        """None to watch here: a front end that stops is restarted."""
        return []

    def stops(self, timeout: float) -> list:
        return [self.stop(timeout)]

    async def stop(self, timeout: float) -> bool:
        """Each front end stops accepting and drains its requests; False if one had to be killed."""
        self.stopping = True
        if self._watch is not None:
            self._watch.cancel()
        deadline = time.monotonic() + timeout
        for frontend in self.frontends.values():
            with contextlib.suppress(ProcessLookupError):
                frontend.process.send_signal(signal.SIGTERM)
        clean = True
        for frontend in self.frontends.values():
            while frontend.process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if frontend.process.poll() is None:
                frontend.process.kill()
                clean = False
            frontend.process.wait()
            for link in frontend.links:
                link.cancel()
        for held in self._held:
            held.close()
        return clean


def _hold_port(host: str, port: int, server: str) -> socket.socket:
    """A socket bound to ``host:port`` in an SO_REUSEPORT group (not listening: it takes no connections)."""
    check_bindable(f"{host}:{port}", server)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    held = socket.socket(family, socket.SOCK_STREAM)
    try:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind((host.strip("[]"), port))
    except OSError as exc:
        held.close()
        raise OSError(f"cannot bind the {server} server to {host}:{port}: {exc.strerror}") from None
    return held

