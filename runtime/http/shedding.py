"""Room for new clients when connections or file descriptors run out.

Granian serves every connection it accepts until its header timeout (30 s by default) passes; it has no cap on
connections and accepts nothing more once the process's descriptors are gone.  Under ``ulimit -n 256``, 252
connections trickling their headers shut out a fresh health probe for as long as they liked.  So this watch, in
each process that serves HTTP:

- every ``INTERVAL`` seconds (``IDLE_INTERVAL`` while they stay under a quarter of the cap) reads the TCP sockets
  in use (``/proc/net/sockstat``: a read of a file it keeps open, since the descriptors may all be gone when it
  matters);
- when they near the cap (``server.max_connections``, or the open-file limit less ``FD_RESERVE`` for models,
  files and pipes, whichever is lower), counts the HTTP port's connections (``/proc/net/tcp*``) and the open
  descriptors (listed, or, with none left to list them, ``fstat`` on each number), and closes the oldest
  connections that never completed a request (their headers are still coming) until ``headroom`` is free again.
  A connection that has sent a request is known by its peer's port, recorded as each request arrives; one is old
  enough to close once a scan saw it ``MIN_AGE_SECONDS`` before (TCP_DEFER_ACCEPT hands over only connections
  that sent data, so a real client has sent its headers by then).

A connection is closed by ``shutdown`` on granian's own descriptor, checked to hold that socket just before; granian
then sees its peer go and closes it.  Linux only (it reads ``/proc``); elsewhere it does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import stat
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import IO

from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.idle_timers import aligned_delay

logger = logging.getLogger(__name__)

INTERVAL = 0.25
IDLE_INTERVAL = 2.0  # while the sockets in use stay under a quarter of the cap: connections take time to pile up
FD_RESERVE = 64
MIN_AGE_SECONDS = 0.4
_ESTABLISHED = "01"


@dataclass(frozen=True)
class Connection:
    inode: int
    peer_port: int


class HeaderShedder:
    """Watches one HTTP listener's connections (see the module); ``wrap`` its ASGI app, ``run`` the watch."""

    def __init__(self, port: int, max_connections: int) -> None:
        self.port = port
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.fd_limit = soft if soft != resource.RLIM_INFINITY else 1 << 20
        self.max_connections = max_connections
        self.cap = min(max_connections, self.fd_limit - FD_RESERVE)
        self.headroom = max(8, self.cap // 16)
        self.served: dict[int, float] = {}  # peer port -> when a request last came from it
        self.first_seen: dict[int, float] = {}  # socket inode -> when a scan first saw it
        self.shed_total = 0
        self.min_age = MIN_AGE_SECONDS
        self._sockstats: list[IO[str]] = []  # /proc/net/sockstat*, read every round
        self._tables: list[IO[str]] = []  # /proc/net/tcp*, read under pressure

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app``, recording the peer of every request (one dict write).  A plain function that returns the
        app's coroutine: a coroutine of its own would be one more frame that every resumption of the request
        passes through."""
        served = self.served

        def recording(scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
            client = scope.get("client")
            if client:
                served[client[1]] = time.monotonic()
            return app(scope, receive, send)

        return recording

    def open(self) -> bool:
        """Open the tables the watch reads (held open: when it matters, no descriptor may be left to open them);
        False where there are none (not Linux).  The IPv6 ones are absent where IPv6 is off."""
        self._sockstats = _open_each("/proc/net/sockstat", "/proc/net/sockstat6")
        self._tables = _open_each("/proc/net/tcp", "/proc/net/tcp6")
        if not self._sockstats or not self._tables:
            self.close()
            return False
        return True

    async def run(self) -> None:
        """Watch until cancelled."""
        if not self.open():
            return
        try:
            while True:
                await asyncio.sleep(aligned_delay(INTERVAL if self.check() else IDLE_INTERVAL))
        finally:
            self.close()

    def close(self) -> None:
        for table in self._sockstats + self._tables:
            table.close()
        self._sockstats, self._tables = [], []

    def check(self) -> bool:
        """One round: close connections still sending their headers if descriptors or connections run short.
        Whether to look again soon (the sockets in use are past a quarter of the cap)."""
        in_use = _tcp_in_use([_reread(table) for table in self._sockstats])
        if in_use < self.cap - self.headroom:
            self.first_seen.clear()
            return in_use >= self.cap // 4
        connections = [c for table in self._tables for c in _connections(_reread(table), self.port)]
        sockets, descriptors = _descriptors(self.fd_limit)
        connections = [c for c in connections if c.inode in sockets]  # this process's, not a peer's on this host
        now = time.monotonic()
        self.first_seen = {c.inode: self.first_seen.get(c.inode, now) for c in connections}
        excess = max(descriptors - (self.fd_limit - self.headroom),
                     len(connections) - (self.max_connections - self.headroom))
        if excess <= 0:
            return True
        waiting = sorted((c for c in connections if c.peer_port not in self.served
                          and now - self.first_seen[c.inode] >= self.min_age),
                         key=lambda c: (self.first_seen[c.inode], c.inode))
        shed = sum(_shutdown(sockets[c.inode], c.inode) for c in waiting[:excess])
        if shed:
            self.shed_total += shed
            logger.warning("%d descriptors open (limit %d), %d connections on port %d: closed the %d oldest still "
                           "sending their headers", descriptors, self.fd_limit, len(connections), self.port, shed)
        live = {c.peer_port for c in connections}
        for port in [p for p in self.served if p not in live]:
            del self.served[port]
        return True


def _open_each(*names: str) -> list[IO[str]]:
    opened: list[IO[str]] = []
    for name in names:
        with contextlib.suppress(OSError):
            opened.append(open(name))  # noqa: SIM115 - the caller closes them
    return opened


def _reread(table: IO[str]) -> list[str]:
    table.seek(0)
    return table.read().splitlines()


def _tcp_in_use(tables: list[list[str]]) -> int:
    """TCP sockets in use in this network namespace (IPv4 and IPv6), from the sockstat tables."""
    return sum(int(line.split()[2]) for rows in tables for line in rows if line.startswith(("TCP:", "TCP6:")))


def _connections(rows: list[str], port: int) -> list[Connection]:
    """Established TCP connections to local ``port`` in a ``/proc/net/tcp*`` table."""
    found = []
    for row in rows:
        fields = row.split()
        if len(fields) > 9 and fields[3] == _ESTABLISHED and int(fields[1].rsplit(":", 1)[1], 16) == port:
            found.append(Connection(int(fields[9]), int(fields[2].rsplit(":", 1)[1], 16)))
    return found


def _descriptors(limit: int) -> tuple[dict[int, int], int]:
    """This process's sockets (inode -> descriptor) and how many descriptors are open: from a listing of
    /proc/self/fd, or, when no descriptor is left to list it with, ``fstat`` on every number below ``limit``."""
    try:
        numbers: Iterable[int] = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        numbers = range(limit)
    sockets = {}
    count = 0
    for descriptor in numbers:
        try:
            info = os.fstat(descriptor)
        except OSError:
            continue
        count += 1
        if stat.S_ISSOCK(info.st_mode):
            sockets[info.st_ino] = descriptor
    return sockets, count


def _shutdown(descriptor: int, inode: int) -> int:
    """Shut the socket down (granian then closes it); 0 if the descriptor no longer holds that socket."""
    with contextlib.suppress(OSError):
        if os.fstat(descriptor).st_ino != inode:
            return 0
        connection = socket.socket(fileno=descriptor)
        try:
            connection.shutdown(socket.SHUT_RDWR)
        finally:
            connection.detach()  # the descriptor stays granian's to close
        return 1
    return 0
