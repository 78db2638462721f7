"""Model control ``on_demand``: a model loads at its first call, stays warm while used, and makes way for others
under a memory budget.

The first inference to a model of the repository that is not loaded syncs it (object storage), loads it and is
answered, all within ``load_deadline`` (else UNAVAILABLE); concurrent first calls share one load, and a model that
failed to load answers with its reason until ``retry_after`` has passed. A model idle for ``keep_warm`` seconds is
unloaded, unless it is always loaded or an ensemble that is loaded calls it. Before a load, the least recently
used idle models are unloaded until the new one fits the budget, by its measured size when it was loaded before
(the process tree's resident memory grown by its load) or its files' size otherwise; a model with requests in
flight or queued is never unloaded: a load waits for one to become idle, and when none does by the load deadline
the request gets UNAVAILABLE (HTTP 503) naming the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from runtime.errors import ServingError, Unavailable
from runtime.models.manager import ModelManager
from runtime.scheduling.stats import LatencyHistogram

logger = logging.getLogger(__name__)

PYTHON_WORKER_BYTES = 64 << 20  # what a Python model's worker process adds before its own files (an estimate)
COLD_CALL_BUCKETS_MS = (10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0, 30000.0)
ROOM_POLL_SECONDS = 0.02  # how often a load waiting for room looks again
ROOM_WAIT_MARGIN_SECONDS = 0.1  # a load stops waiting for room this much before its deadline: its caller hears why
IDLE_GRACE_SECONDS = 0.05  # a model used this recently is not evicted: its request may be on its way to the queue


@dataclass
class OnDemandSettings:
    keep_warm: float = 300.0  # seconds idle before a model is unloaded (0: never for idleness)
    memory_budget: int = 0  # bytes of host memory models may hold (0: no budget)
    always_loaded: tuple[str, ...] = ()  # loaded at start and never unloaded by this mode
    load_deadline: float = 120.0  # seconds a first call waits for its model's sync and load
    retry_after: float = 30.0  # seconds before a model that failed to load is tried again


@dataclass
class _Resident:
    bytes: int
    last_used: float


@dataclass
class OnDemandCounts:
    """What the metrics report: loads, unloads by reason, cold-call latency."""

    loads: int = 0
    unloads: dict[str, int] = field(default_factory=lambda: {"idle": 0, "evicted": 0})
    cold_calls: LatencyHistogram = field(default_factory=lambda: LatencyHistogram(COLD_CALL_BUCKETS_MS))


def resident_bytes() -> int:
    """Resident memory of this process and its children (the Python models' workers)."""
    import psutil

    process = psutil.Process(os.getpid())
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total


class OnDemandLoader:
    """Loads models as calls arrive and unloads them by idleness and memory; the core asks it on a lookup miss."""

    def __init__(self, manager: ModelManager, settings: OnDemandSettings,
                 sync: Callable[[str], Awaitable[None]] | None = None,
                 measure: Callable[[], int] = resident_bytes) -> None:
        self.manager = manager
        self.settings = settings
        self.sync = sync  # brings one model's files from object storage (None: a local repository)
        self.measure = measure
        self.resident: dict[str, _Resident] = {}  # models this mode loaded, by name
        self.measured: dict[str, int] = {}  # what each model held when it was last loaded (kept across unloads)
        self.counts = OnDemandCounts()
        self._loads: dict[str, asyncio.Task] = {}
        self._failed: dict[str, tuple[float, ServingError]] = {}
        self._one_at_a_time = asyncio.Lock()  # loads measure memory: one at a time
        self._keep_warm: asyncio.Task | None = None

    # -- the request path ----------------------------------------------------------------------------------
    def touch(self, name: str) -> None:
        """A request for ``name`` arrived: it is in use now."""
        held = self.resident.get(name)
        if held is not None:
            held.last_used = time.monotonic()

    def knows(self, name: str) -> bool:
        """A model of the repository, or of its object storage (listed at start, downloaded at first call)."""
        return name in self.manager.listed_elsewhere or name in self.manager.repository.model_names()

    async def ensure_loaded(self, name: str) -> None:
        """Load ``name`` for a call that found it unloaded; the error a caller should see if it cannot be."""
        failed = self._failed.get(name)
        if failed is not None and time.monotonic() - failed[0] < self.settings.retry_after:
            raise failed[1]
        load = self._loads.get(name)
        if load is None:
            load = self._loads[name] = asyncio.ensure_future(self._load(name))
            load.add_done_callback(lambda task: self._load_done(name, task))
        started = time.perf_counter()
        try:
            await asyncio.wait_for(asyncio.shield(load), self.settings.load_deadline)
        except TimeoutError:
            raise Unavailable(f"model '{name}' is loading on demand and was not ready within "
                              f"{self.settings.load_deadline:g}s") from None
        self.counts.cold_calls.observe((time.perf_counter() - started) * 1000)

    def _load_done(self, name: str, task: asyncio.Task) -> None:
        self._loads.pop(name, None)
        if not task.cancelled():
            task.exception()  # retrieved: the callers that waited have seen it

    def wants(self, name: str) -> bool:
        """A model of the repository with no version in service: one a call should load."""
        entry = self.manager.models.get(name)
        if entry is not None and any(version.in_service for version in entry.versions.values()):
            return False
        return self.knows(name)

    async def _load(self, name: str) -> None:
        async with self._one_at_a_time:
            if self.manager.models.get(name) is not None and self.manager.models[name].ready_versions():
                return  # loaded meanwhile (an explicit load, an ensemble's)
            if self.sync is not None:  # the model's files, and those of the models an ensemble calls
                await self.sync(name)
                for step in self.manager.ensemble_dependencies(name):
                    await self.sync(step)
            needed = self.measured.get(name) or self._estimate(name)
            await self._make_room(name, needed)
            before = self.measure()
            entry = await self.manager.load_model(name)
            if not entry.ready_versions():
                reason = entry.config_error or "; ".join(entry.version_errors.values()) or entry.reason
                error = Unavailable(f"model '{name}' failed to load on demand: {reason}")
                self._failed[name] = (time.monotonic(), error)
                raise error
            self._failed.pop(name, None)
            grown = max(self.measure() - before, 0)
            self.measured[name] = held = max(grown, self._file_bytes(name))
            self.resident[name] = _Resident(held, time.monotonic())
            self.counts.loads += 1
            await self._trim(name)  # it held more than estimated: others make way, not the model just called
            logger.info("loaded model '%s' on demand (%.1f MiB resident, %.1f MiB of %s held by on-demand models)",
                        name, held / 2**20, self.total() / 2**20,
                        f"{self.settings.memory_budget / 2**20:.1f} MiB" if self.settings.memory_budget
                        else "no budget")

    # -- memory -----------------------------------------------------------------------------------------------
    def total(self) -> int:
        return sum(held.bytes for held in self.resident.values())

    def resident_by_model(self) -> dict[str, int]:
        return {name: held.bytes for name, held in self.resident.items()}

    def _file_bytes(self, name: str) -> int:
        folder = self.manager.repository.model_dir(name)
        total = 0
        for path in folder.rglob("*"):
            with contextlib.suppress(OSError):
                if path.is_file():
                    total += path.stat().st_size
        return total

    def _estimate(self, name: str) -> int:
        """A model never loaded: its files' size (and a worker process's for a Python model), or what the models
        loaded so far held, the median of them, if that is more."""
        python = any(self.manager.repository.model_dir(name).glob("*/model.py"))
        from_files = self._file_bytes(name) + (PYTHON_WORKER_BYTES if python else 0)
        seen = sorted(self.measured.values())
        return max(from_files, seen[len(seen) // 2] if seen else 0)

    def _least_recently_used(self, but: str = "") -> str | None:
        """The idle model used longest ago that may be unloaded (not ``but``), if any."""
        now = time.monotonic()
        idle = [(held.last_used, name) for name, held in self.resident.items()
                if name != but and self._evictable(name, now)]
        return min(idle)[1] if idle else None

    async def _trim(self, loaded: str) -> None:
        budget = self.settings.memory_budget
        while budget and self.total() > budget:
            victim = self._least_recently_used(but=loaded)
            if victim is None:
                return  # over until the models in use finish: the next load waits for room
            await self.unload(victim, "evicted")

    def _evictable(self, name: str, now: float) -> bool:
        held = self.resident.get(name)
        if held is None or name in self.settings.always_loaded or now - held.last_used < IDLE_GRACE_SECONDS:
            return False
        entry = self.manager.models.get(name)
        if entry is None:
            return True
        if any(version.busy for version in entry.versions.values()):
            return False
        return not self.manager.dependents(name)  # a loaded ensemble calls it

    async def _make_room(self, name: str, needed: int) -> None:
        budget = self.settings.memory_budget
        if not budget:
            return
        if needed > budget:
            raise Unavailable(f"model '{name}' needs about {needed} bytes, more than the memory budget of "
                              f"{budget} bytes for models")
        give_up = time.monotonic() + max(0.0, self.settings.load_deadline - ROOM_WAIT_MARGIN_SECONDS)
        while self.total() + needed > budget:
            victim = self._least_recently_used()
            if victim is not None:
                await self.unload(victim, "evicted")
            elif time.monotonic() < give_up:  # every resident model is in use: wait for one to finish its requests
                await asyncio.sleep(ROOM_POLL_SECONDS)
            else:
                raise Unavailable(
                    f"cannot load model '{name}' (about {needed} bytes): the memory budget of {budget} bytes is "
                    f"held by models in use ({self.total()} bytes)")

    async def unload(self, name: str, reason: str) -> None:
        self.resident.pop(name, None)
        await self.manager.unload_model(name)
        self.counts.unloads[reason] += 1
        logger.info("unloaded model '%s' (%s)", name, "idle" if reason == "idle" else "evicted to make room")

    def forget(self, name: str) -> None:
        """An explicit unload took the model out: it no longer counts against the budget."""
        self.resident.pop(name, None)

    # -- keep warm ----------------------------------------------------------------------------------------------
    async def load_always_loaded(self) -> None:
        for name in self.settings.always_loaded:
            try:
                await self.ensure_loaded(name)
            except ServingError as exc:
                logger.error("model '%s' (always loaded) did not load: %s", name, exc)

    def start(self) -> None:
        if self.settings.keep_warm > 0 and self._keep_warm is None:
            self._keep_warm = asyncio.ensure_future(self._unload_idle_forever())

    def cancel(self) -> None:
        """No more unloading for idleness (the server is shutting down and unloads everything itself)."""
        if self._keep_warm is not None:
            self._keep_warm.cancel()
            self._keep_warm = None

    async def _unload_idle_forever(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.settings.keep_warm / 4))
            now = time.monotonic()
            for name, held in list(self.resident.items()):
                if now - held.last_used >= self.settings.keep_warm and self._evictable(name, now):
                    async with self._one_at_a_time:
                        if name in self.resident and self._evictable(name, time.monotonic()):
                            await self.unload(name, "idle")
