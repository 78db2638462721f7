"""Memory shared with other processes by file descriptor: anonymous ``memfd`` segments and a first-fit allocator
over them.

A segment has no name in any file system: it is gone as soon as the last process that maps it exits or closes it,
so a crashed peer leaves nothing behind.  Its descriptor travels to a peer once (``SCM_RIGHTS``); from then on a
tensor in it is named by (segment, offset, size).  Both the Python backend's arenas (``handlers/python/
transport.py``) and the pool that requests' tensors are received into (``runtime/tensor_pool.py``) allocate here.
"""

from __future__ import annotations

import mmap
import os
import threading

ALIGNMENT = 64


def align(size: int) -> int:
    return (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class MemfdSegment:
    """One mapped segment: created here (owned), or mapped from a peer's descriptor."""

    def __init__(self, size: int, fd: int | None = None, name: str = "triton-python") -> None:
        self.owned = fd is None
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC) if fd is None else fd  # the name shows in /proc/*/maps
        if self.owned:
            os.ftruncate(self.fd, size)
        self.size = size
        self.map = mmap.mmap(self.fd, size)
        self.view = memoryview(self.map)

    def close(self) -> None:
        self.view.release()
        try:
            self.map.close()
        except BufferError:  # a numpy view still refers to it: the mapping goes when that view does
            pass
        os.close(self.fd)


class MemfdArena:
    """Segments this side allocates in (first fit, coalescing free list, thread-safe); it starts at
    ``initial_bytes`` and grows by segments of at least ``growth_bytes``, up to ``max_bytes`` in all."""

    def __init__(self, initial_bytes: int, growth_bytes: int, max_bytes: int = 1 << 34,
                 name: str = "triton-python") -> None:
        self.name = name
        self.growth_bytes = growth_bytes
        self.max_bytes = max_bytes
        self.segments: list[MemfdSegment] = []
        self._free: list[list[tuple[int, int]]] = []  # per segment: sorted (offset, size)
        self._lock = threading.Lock()
        if initial_bytes:
            self._grow(initial_bytes, exact=True)

    @property
    def total_bytes(self) -> int:
        return sum(segment.size for segment in self.segments)

    def _grow(self, at_least: int, exact: bool = False) -> int:
        size = align(at_least) if exact else max(align(at_least), self.growth_bytes)
        if self.total_bytes + size > self.max_bytes:
            raise MemoryError(f"shared memory for tensors would exceed {self.max_bytes} bytes")
        self.segments.append(MemfdSegment(size, name=self.name))
        self._free.append([(0, size)])
        return len(self.segments) - 1

    def allocate(self, nbytes: int) -> tuple[int, int]:
        """(segment, offset) of ``nbytes`` of fresh space; MemoryError past ``max_bytes``."""
        size = align(max(nbytes, 1))
        with self._lock:
            for index, free in enumerate(self._free):
                for position, (offset, length) in enumerate(free):
                    if length >= size:
                        if length == size:
                            del free[position]
                        else:
                            free[position] = (offset + size, length - size)
                        return index, offset
            index = self._grow(size)
            free = self._free[index]
            offset, length = free[0]
            free[0] = (offset + size, length - size)
            return index, offset

    def release(self, segment: int, offset: int, nbytes: int) -> None:
        size = align(max(nbytes, 1))
        with self._lock:
            free = self._free[segment]
            free.append((offset, size))
            free.sort()
            merged: list[tuple[int, int]] = []
            for start, length in free:
                if merged and merged[-1][0] + merged[-1][1] == start:
                    merged[-1] = (merged[-1][0], merged[-1][1] + length)
                else:
                    merged.append((start, length))
            self._free[segment] = merged

    def in_use(self) -> int:
        with self._lock:
            return self.total_bytes - sum(length for free in self._free for _, length in free)

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
        self.segments.clear()
