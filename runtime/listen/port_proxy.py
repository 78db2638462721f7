"""One port for h2c REST and gRPC side by side at the two-port mode's cost: HAProxy takes the port's HTTP/2
connections that are not a gRPC client's (those the native edge takes whole, and HTTP/1.1 ones this process serves
itself: ``port_acceptor.py``) and hands each request (each HTTP/2 stream: a platform's proxy, Knative's queue-proxy
among them, may carry a client's REST and gRPC streams on one connection) to the two-port mode's own listeners on
private addresses, by content type: ``application/grpc`` to the native gRPC edge on a unix socket (HTTP/2),
everything else to granian on loopback (HTTP/1.1). The gRPC calls keep everything the edge gives them (metadata and
auth, restricted protocols, deadlines, compression, message-size limits, status in trailers, streaming with its
bounds, the lanes), and REST keeps granian's.

HAProxy is a C proxy: a request through it cost 26-43 µs of CPU under load on the 2-core VM (c=32) and about 200 at
concurrency 1 (a wake-up each way), where hypercorn, the pure-Python listener this replaces where HAProxy is
installed (``single_port.py``), cost 2-3x the two-port mode's whole request (docs/benchmarks.md, "One port against
two", which also says why HAProxy over nghttpx, measured alike). A 600 KB request through it costs 400-700 µs more
(docs/benchmarks.md, "HTTP/1.1 on the one port"): which is why HTTP/1.1, the REST clients' protocol, no longer goes
through it. It runs as a child of the server and is handed its connections over a unix socket pair (``bind
sockpair@``) by the port's acceptor, which owns the listening socket, with its limits taken from ``server.http``:
``maxconn`` the connections served at once (within the open-file limit), the header timeout for a request's headers
and an idle keep-alive connection, the body timeout for a client gone silent mid-request. It is stopped softly: it
stops accepting, finishes the requests under way (the server's drain), then exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from runtime.http.limits import HttpLimits

logger = logging.getLogger(__name__)

SERVER_TIMEOUT = "24h"  # a model may run long, and a gRPC stream stays open between its messages
CONNECT_TIMEOUT = "5s"  # to the private listeners, which are up before HAProxy starts
# A 600 KB tensor through HAProxy cost 1.0-1.8 ms of CPU a request more than on the two ports with its default 16 KiB
# buffers; 64 KiB ones cost a little less (larger ones did not help, and a larger HTTP/2 window stalled calls). A
# buffer is held only while data moves: at most two per connection, so maxconn x 128 KiB (512 MiB at the default
# 4,096 connections, all of them sending at once)
BUFFER_BYTES = 65536
FD_RESERVE = 64


def haproxy_executable() -> str | None:
    """HAProxy's path, or None where it is not installed (the one port then falls back to hypercorn)."""
    return shutil.which("haproxy")


def haproxy_config(channel_fd: int, grpc_socket: Path, http_address: str, limits: HttpLimits) -> str:
    """The configuration: the port's connections (passed over the socket pair ``channel_fd``), routed per request by
    content type."""
    header_ms = max(1, int(limits.header_timeout * 1000))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    # two descriptors a connection (the client's, the listener's behind), two a pipe (splice-auto: up to maxpipes,
    # a quarter of maxconn), and HAProxy's own: it refuses to start where maxconn would need more than the open-file
    # limit gives (a container run with nofile 4096 met it)
    max_connections = max(1, min(limits.max_connections, (soft - FD_RESERVE) * 2 // 5))
    body_ms = max(header_ms, int(limits.body_timeout * 1000))
    return f"""global
    nbthread 1
    maxconn {max_connections}
    maxpipes {max(1, max_connections // 4)}
    tune.h2.max-concurrent-streams {limits.max_concurrent_streams}
    tune.bufsize {BUFFER_BYTES}

defaults
    mode http
    option splice-auto
    timeout connect {CONNECT_TIMEOUT}
    timeout http-request {header_ms}ms
    timeout http-keep-alive {header_ms}ms
    timeout client {body_ms}ms
    timeout client-fin {header_ms}ms
    timeout server {SERVER_TIMEOUT}
    timeout tunnel {SERVER_TIMEOUT}

frontend port
    bind sockpair@{channel_fd}
    use_backend grpc if {{ req.hdr(content-type) -m beg application/grpc }}
    default_backend rest

backend grpc
    http-reuse always
    server edge {grpc_socket} proto h2

backend rest
    http-reuse always
    server granian {http_address}
"""


class PortProxy:
    """HAProxy taking connections over the socket pair end ``channel_fd`` (see the module), started by
    :meth:`start`."""

    def __init__(self, executable: str, channel_fd: int, grpc_socket: Path, http_address: str,
                 limits: HttpLimits) -> None:
        self.executable = executable
        self.channel_fd = channel_fd
        self.folder = Path(tempfile.mkdtemp(prefix="serverless-triton-port-"))
        self.config = self.folder / "haproxy.cfg"
        self.config.write_text(haproxy_config(channel_fd, grpc_socket, http_address, limits))
        self.process: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task | None = None
        self._stopping = False

    async def start(self) -> None:
        """Check the configuration, then start HAProxy; RuntimeError with HAProxy's words if either fails."""
        checked = subprocess.run([self.executable, "-c", "-q", "-f", str(self.config)], capture_output=True,
                                 text=True, pass_fds=(self.channel_fd,))
        if checked.returncode != 0:
            raise RuntimeError(f"HAProxy refused its configuration: {checked.stderr.strip() or checked.stdout}")
        self.process = await asyncio.create_subprocess_exec(
            self.executable, "-db", "-f", str(self.config), pass_fds=(self.channel_fd,),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.task = asyncio.create_task(self._watch())
        with contextlib.suppress(OSError):
            os.close(self.channel_fd)  # HAProxy holds its end now
        self.channel_fd = -1

    async def _watch(self) -> None:
        """HAProxy's messages, logged; returns when it exits (an exit not asked for ends the server)."""
        assert self.process is not None and self.process.stderr is not None
        async for line in self.process.stderr:
            text = line.decode(errors="replace").rstrip()
            if not text:
                continue
            if "stopped (cumulated conns" in text or "Stopping " in text:  # its soft stop, step by step
                logger.debug("haproxy: %s", text)
            else:
                logger.log(logging.ERROR if "[ALERT]" in text else logging.WARNING, "haproxy: %s", text)
        code = await self.process.wait()
        if not self._stopping:
            logger.error("haproxy, which serves the port, exited with code %s", code)

    async def stop(self, timeout: float) -> bool:
        """Stop accepting, let the requests under way finish for ``timeout`` seconds, then end HAProxy; False if
        some had not finished."""
        self._stopping = True
        clean = True
        process = self.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGUSR1)  # soft stop: no new connections, the streams under way finish
            try:
                await asyncio.wait_for(process.wait(), timeout)
            except TimeoutError:
                clean = False
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if self.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.task, 5)
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.channel_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.channel_fd)
        return clean
