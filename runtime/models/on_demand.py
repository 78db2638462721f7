"""Model control ``on_demand``: a model loads at its first call, stays warm while used, and makes way for others
under memory budgets (host memory, and each GPU's).

The first inference to a model of the repository that is not loaded syncs it (object storage), loads it and is
answered, all within ``load_deadline`` (else UNAVAILABLE); concurrent first calls share one load, and a model that
failed to load answers with its reason until ``retry_after`` has passed. A model idle for ``keep_warm`` seconds is
unloaded, unless it is always loaded or an ensemble that is loaded calls it. Before a load, the least recently
used idle models are unloaded until the new one fits each budget, by its measured size when it was loaded before
(the process tree's resident memory, and each GPU's used memory, grown by its load) or an estimate from its files
and placement otherwise (``memory_ledger.py`` keeps the accounts); a model with requests in flight or queued is
never unloaded: a load waits for one to become idle, and when none does by the load deadline the request gets
RESOURCE_EXHAUSTED (HTTP 503) naming the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from runtime.devices import gpu_memory_used
from runtime.errors import MemoryBudgetExhausted, ServingError, Unavailable
from runtime.models.manager import ModelManager
from runtime.models.memory_ledger import HOST, MemoryLedger, describe, gpu_resource
from runtime.process_memory import own_resident_bytes
from runtime.scheduling.stats import LatencyHistogram

logger = logging.getLogger(__name__)

PYTHON_WORKER_BYTES = 64 << 20  # what a Python model's worker process adds before its own files (an estimate)
CUDA_CONTEXT_BYTES = 512 << 20  # what a Python model's worker adds on its GPU, if it uses CUDA (an estimate)
COLD_CALL_BUCKETS_MS = (10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0, 30000.0)
INDEX_MAX_AGE_SECONDS = 1.0  # the repository's listing is read again at most this often, off the loop
ROOM_POLL_SECONDS = 0.02  # how often a load waiting for room looks again
ROOM_WAIT_MARGIN_SECONDS = 0.1  # a load stops waiting for room this much before its deadline: its caller hears why
RELEASE_SETTLE_POLLS = 25  # readings of the GPUs (ROOM_POLL_SECONDS apart) an unload waits for its memory to show free
IDLE_GRACE_SECONDS = 0.05  # a model used this recently is not evicted: its request may be on its way to the queue


@dataclass
class OnDemandSettings:
    keep_warm: float = 300.0  # seconds idle before a model is unloaded (0: never for idleness)
    memory_budget: int = 0  # bytes of host memory models may hold (0: no budget)
    gpu_memory_budget: int = 0  # bytes of each GPU's memory models may hold, overhead included (0: no budget)
    always_loaded: tuple[str, ...] = ()  # loaded at start and never unloaded by this mode
    load_deadline: float = 120.0  # seconds a first call waits for its model's sync and load
    retry_after: float = 30.0  # seconds before a model that failed to load is tried again


@dataclass
class OnDemandCounts:
    """What the metrics report: loads, unloads by reason, cold-call latency."""

    loads: int = 0
    unloads: dict[str, int] = field(default_factory=lambda: {"idle": 0, "evicted": 0})
    cold_calls: LatencyHistogram = field(default_factory=lambda: LatencyHistogram(COLD_CALL_BUCKETS_MS))


def resident_bytes() -> int:
    """Resident memory of this process and its children (the Python models' workers), the shared memory they map
    with it (the tensor pool, their arenas) counted once, here."""
    import psutil

    process = psutil.Process(os.getpid())
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        total += own_resident_bytes(child.pid)
    return total


class OnDemandLoader:
    """Loads models as calls arrive and unloads them by idleness and memory; the core asks it on a lookup miss."""

    def __init__(self, manager: ModelManager, settings: OnDemandSettings,
                 sync: Callable[[str], Awaitable[None]] | None = None,
                 measure: Callable[[], int] = resident_bytes,
                 measure_gpus: Callable[[], dict[int, int]] = gpu_memory_used) -> None:
        self.manager = manager
        self.settings = settings
        self.sync = sync  # brings one model's files from object storage (None: a local repository)
        self.measure = measure  # resident bytes of the server's process tree
        self.measure_gpus = measure_gpus  # used bytes of each GPU, by CUDA device number
        self.ledger = MemoryLedger(settings)  # models this mode loaded, what they hold, each GPU's overhead
        self.ledger.observe_gpus(measure_gpus())  # the baseline: each GPU before this mode loads anything
        self.counts = OnDemandCounts()
        self._loads: dict[str, asyncio.Task] = {}
        self._failed: dict[str, tuple[float, ServingError]] = {}
        self._one_at_a_time = asyncio.Lock()  # loads measure memory: one at a time
        self._keep_warm: asyncio.Task | None = None
        # the repository's model folders: a lookup miss is answered from here, never by listing the folder (2,000
        # folders took 80 ms a miss on the loop); read again at most once a second, in a thread
        self._index: frozenset[str] = frozenset(manager.repository.model_names())
        self._indexed_at = time.monotonic()
        self._indexing: asyncio.Future | None = None

    # -- the request path ----------------------------------------------------------------------------------
    def touch(self, name: str) -> None:
        """A request for ``name`` arrived: it is in use now."""
        self.ledger.touch(name)

    def knows(self, name: str) -> bool:
        """A model of the repository, or of its object storage (listed at start, downloaded at first call), by
        the index; one no older than a second, else read again for the next lookup."""
        if name in self.manager.listed_elsewhere or name in self._index:
            return True
        self._refresh_index()
        return False

    def _refresh_index(self) -> None:
        """Read the repository's folder list again, in a thread, unless it was read within the last second or is
        being read now."""
        if self._indexing is not None or time.monotonic() - self._indexed_at < INDEX_MAX_AGE_SECONDS:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test's synchronous lookup): the next one on a loop reads it
        self._indexing = loop.run_in_executor(None, self.manager.repository.model_names)
        self._indexing.add_done_callback(self._indexed)

    def _indexed(self, listing: asyncio.Future) -> None:
        self._indexing = None
        self._indexed_at = time.monotonic()
        if not listing.cancelled() and listing.exception() is None:
            self._index = frozenset(listing.result())

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
            needed = self.ledger.measured.get(name) or await self._estimate(name)
            await self._make_room(name, needed)
            before, gpus_before = self.measure(), self.measure_gpus()
            entry = await self.manager.load_model(name)
            if not entry.ready_versions():
                reason = entry.config_error or "; ".join(entry.version_errors.values()) or entry.reason
                error = Unavailable(f"model '{name}' failed to load on demand: {reason}")
                self._failed[name] = (time.monotonic(), error)
                raise error
            self._failed.pop(name, None)
            held = {HOST: max(self.measure() - before, self._file_bytes(name))}
            gpus_after = self.measure_gpus()
            for index, used in gpus_after.items():
                if used > gpus_before.get(index, used):
                    held[gpu_resource(index)] = used - gpus_before[index]
            self.ledger.record_load(name, held)
            self.ledger.observe_gpus(gpus_after)
            self.counts.loads += 1
            await self._trim(name)  # it held more than estimated: others make way, not the model just called
            logger.info("loaded model '%s' on demand (%s; on-demand models now hold %s)", name,
                        ", ".join(f"{describe(r)} {amount / 2**20:.1f} MiB" for r, amount in held.items()),
                        ", ".join(self._against_budget(r) for r in held))

    # -- memory -----------------------------------------------------------------------------------------------
    def total(self) -> int:
        """Host memory the models loaded on demand hold."""
        return self.ledger.total(HOST)

    def resident_by_model(self) -> dict[str, int]:
        return self.ledger.held_by_model(HOST)

    def _against_budget(self, resource: str) -> str:
        budget = self.ledger.budget(resource)
        return (f"{self.ledger.total(resource) / 2**20:.1f} MiB of {describe(resource)}"
                + (f" (budget {budget / 2**20:.1f} MiB)" if budget else ""))

    def _file_bytes(self, name: str) -> int:
        folder = self.manager.repository.model_dir(name)
        total = 0
        for path in folder.rglob("*"):
            with contextlib.suppress(OSError):
                if path.is_file():
                    total += path.stat().st_size
        return total

    async def _estimate(self, name: str) -> dict[str, int]:
        """A model never loaded: its files' size (and a worker process's for a Python model) in host memory and on
        each GPU its instances would take (a CUDA context per Python instance there), or what the models loaded so
        far held there, the median of them, if that is more."""
        python = any(self.manager.repository.model_dir(name).glob("*/model.py"))
        files = self._file_bytes(name)
        estimate = {HOST: self._at_least_the_median(HOST, files + (PYTHON_WORKER_BYTES if python else 0))}
        for index, instances in (await asyncio.to_thread(self.manager.repository.gpu_placement, name)).items():
            resource = gpu_resource(index)
            estimate[resource] = self._at_least_the_median(
                resource, instances * (files + (CUDA_CONTEXT_BYTES if python else 0)))
        return estimate

    def _at_least_the_median(self, resource: str, amount: int) -> int:
        seen = sorted(held[resource] for held in self.ledger.measured.values() if held.get(resource))
        return max(amount, seen[len(seen) // 2] if seen else 0)

    def _least_recently_used(self, holding: list[str], but: str = "") -> str | None:
        """The idle model used longest ago that may be unloaded (not ``but``) and holds some of ``holding``."""
        now = time.monotonic()
        idle = [(model.last_used, name) for name, model in self.ledger.resident.items()
                if name != but and any(model.held.get(r) for r in holding) and self._evictable(name, now)]
        return min(idle)[1] if idle else None

    async def _trim(self, loaded: str) -> None:
        while over := self.ledger.over():
            victim = self._least_recently_used(over, but=loaded)
            if victim is None:
                return  # over until the models in use finish: the next load waits for room
            await self.unload(victim, "evicted")

    def _evictable(self, name: str, now: float) -> bool:
        held = self.ledger.resident.get(name)
        if held is None or name in self.settings.always_loaded or now - held.last_used < IDLE_GRACE_SECONDS:
            return False
        entry = self.manager.models.get(name)
        if entry is None:
            return True
        if any(version.busy for version in entry.versions.values()):
            return False
        return not self.manager.dependents(name)  # a loaded ensemble calls it

    async def _make_room(self, name: str, needed: dict[str, int]) -> None:
        ledger = self.ledger
        alone = ledger.beyond_budget(needed)
        if alone is not None:
            raise MemoryBudgetExhausted(f"model '{name}' needs about {needed[alone]} bytes, more than the "
                                        f"{describe(alone)} budget of {ledger.budget(alone)} bytes for models")
        give_up = time.monotonic() + max(0.0, self.settings.load_deadline - ROOM_WAIT_MARGIN_SECONDS)
        while True:
            ledger.observe_gpus(self.measure_gpus())
            short = ledger.short(needed)
            if not short:
                return
            for resource in short:  # no unload can make room: what holds it is not a model
                budget, outside = ledger.budget(resource), ledger.overhead.get(resource, 0)
                if outside + needed[resource] > budget:
                    raise MemoryBudgetExhausted(
                        f"cannot load model '{name}' (about {needed[resource]} bytes): the {describe(resource)} "
                        f"budget of {budget} bytes has {budget - outside} bytes left, the rest held outside the "
                        "models")
            victim = self._least_recently_used(short)
            if victim is not None:
                await self.unload(victim, "evicted")
                continue
            resource = short[0]
            budget, total = ledger.budget(resource), ledger.total(resource)
            if time.monotonic() >= give_up:
                raise MemoryBudgetExhausted(
                    f"cannot load model '{name}' (about {needed[resource]} bytes): the {describe(resource)} budget "
                    f"of {budget} bytes is held by models in use ({total} bytes)")
            await asyncio.sleep(ROOM_POLL_SECONDS)  # every model holding it is in use: wait for one to finish

    async def unload(self, name: str, reason: str) -> None:
        before = self.measure_gpus()
        resident = self.ledger.resident.get(name)
        held = resident.held if resident is not None else {}
        self.ledger.record_unload(name)
        await self.manager.unload_model(name)
        after = self.measure_gpus()
        for _ in range(RELEASE_SETTLE_POLLS):  # a stopped worker's memory may take a moment to show as free
            if all(before[i] - after.get(i, 0) >= held.get(gpu_resource(i), 0) for i in before):
                break
            await asyncio.sleep(ROOM_POLL_SECONDS)
            after = self.measure_gpus()
        self.ledger.record_release(name, {index: before[index] - used for index, used in after.items()
                                          if index in before})
        self.ledger.observe_gpus(after)  # what the unload did not give back is overhead
        self.counts.unloads[reason] += 1
        logger.info("unloaded model '%s' (%s)", name, "idle" if reason == "idle" else "evicted to make room")

    def forget(self, name: str) -> None:
        """An explicit unload took the model out: it no longer counts against the budget."""
        self.ledger.record_unload(name)

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
            for name, model in list(self.ledger.resident.items()):
                if now - model.last_used >= self.settings.keep_warm and self._evictable(name, now):
                    async with self._one_at_a_time:
                        if name in self.ledger.resident and self._evictable(name, time.monotonic()):
                            await self.unload(name, "idle")
