"""Triton's rate limiter (``--rate-limit=execution_count``): an instance executes only while it holds the resources
its ``instance_group { rate_limiter { resources [...] priority: N } }`` asks for.

Each resource has a count: the one ``--rate-limit-resource=<name>:<count>`` gives, else the largest count any loaded
instance asks for (as in Triton).  An instance asking for more than a given count cannot load (Triton's words).
An execution takes its instance's resources before it starts and gives them back when it ends; when resources
come back, the waiting executions are served by ``priority`` (lower first), then in arrival order.  This host has
one device, so device-specific and ``global`` resources are counted alike.  Off (Triton's default), ``rate_limiter``
settings are read and ignored, as Triton ignores them.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Iterable

from runtime.errors import ModelLoadError

Needs = tuple[tuple[str, int], ...]  # (resource, count) an instance holds while it executes


class RateLimiter:
    """The resources executions hold, shared by every model of the server."""

    def __init__(self, given: dict[str, int] | None = None) -> None:
        self.given = dict(given or {})  # --rate-limit-resource counts
        self.total: dict[str, int] = dict(self.given)
        self.in_use: dict[str, int] = {}
        self._waiting: list[tuple[int, int, Needs, asyncio.Future]] = []
        self._order = itertools.count()

    def admit(self, model: str, needs: Iterable[Needs]) -> None:
        """Check a model's instances' needs before it loads (ModelLoadError in Triton's words); resources nobody
        gave a count grow to the largest request."""
        needs = list(needs)
        for instance in needs:
            for name, count in instance:
                if name in self.given and count > self.given[name]:
                    raise ModelLoadError(f'Resource count for "{name}" is limited to {self.given[name]} which will '
                                         "prevent scheduling of one or more model instances, the minimum required "
                                         f"count is {count}")
        for instance in needs:
            for name, count in instance:
                if name not in self.given:
                    self.total[name] = max(self.total.get(name, 0), count)

    def _fits(self, needs: Needs) -> bool:
        return all(self.in_use.get(name, 0) + count <= self.total.get(name, count) for name, count in needs)

    def _take(self, needs: Needs) -> None:
        for name, count in needs:
            self.in_use[name] = self.in_use.get(name, 0) + count

    async def acquire(self, needs: Needs, priority: int = 0) -> None:
        """Wait until ``needs`` are free (behind waiters of higher priority, or earlier at the same one)."""
        if not needs:
            return
        if not self._waiting and self._fits(needs):
            self._take(needs)
            return
        waiter = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), needs, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(needs)  # granted as it was cancelled: give it back
            else:
                self._waiting = [entry for entry in self._waiting if entry[3] is not waiter]
                heapq.heapify(self._waiting)
            raise

    def release(self, needs: Needs) -> None:
        for name, count in needs:
            self.in_use[name] = self.in_use.get(name, 0) - count
        while self._waiting and self._fits(self._waiting[0][2]):
            _, _, granted, waiter = heapq.heappop(self._waiting)
            if not waiter.done():
                self._take(granted)
                waiter.set_result(None)
