"""Triton's response cache: answers to requests already answered, for models whose config enables it
(``response_cache { enable: true }``), within one server-wide byte budget (``cache.size_bytes``, Triton's
``--cache-config local,size=N``).

A request's key hashes its model version, its inputs (names, datatypes, shapes, bytes) and the outputs it asks
for (none named: all of them); what the cache holds is the model's outputs, so how they are formatted
(classification) or travel (binary or JSON) is decided afresh for each response.  A hit skips the queue and
the model; the outputs of a miss are stored as private copies (never views of a worker's memory), least
recently used evicted first.
Error responses, decoupled models and requests of a sequence are never cached; a version's entries go when it
unloads.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.datatypes import serialize_bytes
from runtime.types import InferRequest, ModelOutputs

_SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
# What an entry costs beyond its arrays' data, measured with tracemalloc (CPython 3.11, numpy 2): its key, the
# entry, its place in the LRU, the outputs dict and parameters (about 800 bytes), and each array object (about 150).
ENTRY_OVERHEAD_BYTES = 800
ARRAY_OVERHEAD_BYTES = 150


@dataclass
class _Entry:
    owner: int  # id() of the model version that produced it
    outputs: ModelOutputs
    nbytes: int


@dataclass
class CacheCounters:
    """What the cache did, for the ``nv_cache_*`` metrics."""

    entries: int = 0
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    lookup_ns: int = 0
    insertion_ns: int = 0
    used_bytes: int = 0
    capacity_bytes: int = 0


class ResponseCache:
    """An LRU of responses within ``capacity_bytes`` (thread-safe)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._used = 0
        self._lookups = self._hits = self._misses = self._evictions = self._lookup_ns = self._insertion_ns = 0
        self._lock = threading.Lock()

    def key(self, model: Any, request: InferRequest) -> bytes | None:
        """The request's key for ``model`` (a model version), or None when it must not be cached."""
        if any(request.parameters.get(name) for name in _SEQUENCE_PARAMETERS):
            return None
        digest = hashlib.blake2b(digest_size=20)
        digest.update(f"{model.name}\0{model.version}\0{id(model)}\0".encode())
        for tensor in sorted(request.inputs, key=lambda t: t.name):
            data = tensor.values()
            digest.update(f"{tensor.name}\0{tensor.datatype}\0{list(data.shape)}\0".encode())
            digest.update(serialize_bytes(data) if tensor.datatype == "BYTES" else np.ascontiguousarray(data).data)
        wanted = sorted({o.name for o in request.outputs} or {t.name for t in model.spec.outputs})
        digest.update(f"outputs\0{wanted}".encode())
        return digest.digest()

    def lookup(self, key: bytes) -> ModelOutputs | None:
        started = time.perf_counter_ns()
        with self._lock:
            self._lookups += 1
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
            else:
                self._entries.move_to_end(key)
                self._hits += 1
            self._lookup_ns += time.perf_counter_ns() - started
            return None if entry is None else entry.outputs

    def insert(self, key: bytes, model: Any, outputs: dict[str, np.ndarray]) -> None:
        """Store a private copy of ``outputs`` (skipped if it alone exceeds the budget): a ModelOutputs (a Python
        model's, with its response parameters) or a tensor backend's plain dict of arrays."""
        started = time.perf_counter_ns()
        copied = ModelOutputs({name: np.array(array, copy=True) for name, array in outputs.items()},
                              dict(getattr(outputs, "parameters", None) or {}))
        nbytes = ENTRY_OVERHEAD_BYTES + sum(ARRAY_OVERHEAD_BYTES + _size(array) for array in copied.values())
        if nbytes > self.capacity_bytes:
            return
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self._used -= previous.nbytes
            while self._entries and self._used + nbytes > self.capacity_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._used -= evicted.nbytes
                self._evictions += 1
            self._entries[key] = _Entry(id(model), copied, nbytes)
            self._used += nbytes
            self._insertion_ns += time.perf_counter_ns() - started

    def evict_model(self, model: Any) -> None:
        """Drop every entry ``model`` (a model version) produced: it is being unloaded or replaced."""
        owner = id(model)
        with self._lock:
            for key in [k for k, entry in self._entries.items() if entry.owner == owner]:
                self._used -= self._entries.pop(key).nbytes

    def counters(self) -> CacheCounters:
        with self._lock:
            return CacheCounters(len(self._entries), self._lookups, self._hits, self._misses, self._evictions,
                                 self._lookup_ns, self._insertion_ns, self._used, self.capacity_bytes)


def _size(array: np.ndarray) -> int:
    if array.dtype == np.object_:
        return sum(sys.getsizeof(item) for item in array.reshape(-1)) + array.size * 8
    return array.nbytes


async def through_cache(cache: ResponseCache, model: Any, request: InferRequest,
                        run: Callable[[], Awaitable[dict[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    """The request's outputs from the cache, or from ``run`` (then stored); the version's statistics count a
    hit (lookup time) or a miss (lookup and insertion time), as Triton's do."""
    started = time.perf_counter_ns()
    key = cache.key(model, request)
    cached = cache.lookup(key) if key is not None else None
    looked_up = time.perf_counter_ns()
    if cached is not None:
        model.stats.record_cache_hit(looked_up - started, time.perf_counter_ns() - started)
        return cached
    outputs = await run()
    inserting = time.perf_counter_ns()
    if key is not None:
        cache.insert(key, model, outputs)
    model.stats.record_cache_miss(looked_up - started + time.perf_counter_ns() - inserting)
    return outputs
