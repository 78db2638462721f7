"""An ensemble's ``ensemble_scheduling { max_inflight_requests }`` (Triton 2.63, core #455; shared by every request
to the ensemble since 2.68, core #482): each step has at most that many requests in flight, across all of the
ensemble's requests, so that a fast producer step (a decoupled one, say) cannot pile up work before a slow one
without bound. A step request waits for a slot; after ``WAIT_SECONDS`` it goes anyway, logged, as Triton's does,
so that a wedged step never deadlocks the graph. 0 (the default): no limit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

logger = logging.getLogger(__name__)

WAIT_SECONDS = 300.0  # Triton's kMutexTimeoutSeconds


class StepSlots:
    """One slot pool per step of an ensemble; :meth:`held` around each step request."""

    def __init__(self, ensemble: str, steps: Sequence[object], limit: int) -> None:
        self.ensemble = ensemble
        self.limit = limit
        self._index = {id(step): index for index, step in enumerate(steps)}
        self._slots = [asyncio.Semaphore(limit) for _ in steps] if limit > 0 else []

    @contextlib.asynccontextmanager
    async def held(self, step: object) -> AsyncIterator[None]:
        """A slot of ``step``'s pool while the body runs (at once where there is no limit)."""
        if not self._slots:
            yield
            return
        index = self._index[id(step)]
        slots = self._slots[index]
        try:
            await asyncio.wait_for(slots.acquire(), WAIT_SECONDS)
            acquired = True
        except TimeoutError:
            acquired = False
            logger.error("ensemble '%s' could not schedule step %d (in flight: %d, the limit) for %.0f seconds: "
                         "proceeding, so as not to deadlock", self.ensemble, index, self.limit, WAIT_SECONDS)
        try:
            yield
        finally:
            if acquired:
                slots.release()
