"""The order of a ModelStreamInfer stream's responses, as Triton 2.51 writes them (checked against it): responses
to requests of models in default mode go out in the order the requests came, each after those of every earlier
such request; a decoupled model's responses go out as they come."""

from __future__ import annotations

import asyncio
import itertools


class ResponseOrder:
    """Turns for a stream's default-mode requests: a request's responses wait for every earlier turn to end."""

    def __init__(self) -> None:
        self._tickets = itertools.count()
        self._next = 0  # the oldest turn not yet ended
        self._ended: set[int] = set()
        self._changed = asyncio.Event()

    def take(self) -> int:
        """A turn for a request, in arrival order."""
        return next(self._tickets)

    async def wait(self, turn: int) -> None:
        """Until every earlier turn has ended."""
        while turn > self._next:
            self._changed.clear()
            await self._changed.wait()

    def end(self, turn: int) -> None:
        """A request answered (or gone): later turns may go on."""
        self._ended.add(turn)
        while self._next in self._ended:
            self._ended.discard(self._next)
            self._next += 1
        self._changed.set()
