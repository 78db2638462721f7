"""Shared memory that requests' large tensors are received into, for a model in another process to read in place.

A Python-backend model runs in a worker process that reads its inputs from shared memory.  A tensor received into
private memory is copied there once more (600 KB: 18-36 µs here); received into this pool instead, the listener's
one copy out of its own buffers is the only one: the gRPC edge copies a large message's tensors out of its pieces
straight into a buffer from here, and the HTTP route a large body's chunks.  Each places the tensors at addresses
that are multiples of ALIGNMENT: numpy flags a misaligned array and runs its loops on it slower.  The worker maps
the pool's segments (their descriptors travel once) and is handed where a tensor lies.

A buffer returns to the pool once it and every view of it are gone (so a tensor a response still refers to keeps
its memory); the pool never grows past ``max_bytes`` (``server.tensor_pool_bytes``) and keeps what it has grown to,
as Triton's shared memory for its Python stubs does; a request that finds it full is received into private memory
as before.  Models in this process read these buffers as any other numpy array.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from runtime.memfd_arena import ALIGNMENT, MemfdArena, MemfdSegment

DEFAULT_MAX_BYTES = 64 << 20  # server.tensor_pool_bytes
DEFAULT_SEGMENT_BYTES = 16 << 20
MIN_BYTES = 64 << 10  # below: a copy costs less than the allocation and its bookkeeping
MEMFD_NAME = "triton-tensor-pool"  # its segments in /proc/<pid>/maps (a worker's too, once it maps them)


class TensorPool:
    """Buffers in shared memory (see the module); thread-safe."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self._arena = MemfdArena(0, segment_bytes, max_bytes, name=MEMFD_NAME)
        self._bases: list[int] = []  # each segment's address in this process
        self._bases_lock = threading.Lock()

    def buffer(self, nbytes: int, aligned_at: int = 0) -> np.ndarray | None:
        """A writable uint8 array of ``nbytes`` in the pool whose byte ``aligned_at`` lies at a multiple of
        ALIGNMENT (where a request's tensors start: a model reads a misaligned tensor slower, torch's convolutions
        among them); None below MIN_BYTES or when the pool is full."""
        if nbytes < MIN_BYTES:
            return None
        pad = -aligned_at % ALIGNMENT  # an allocation starts at a multiple of ALIGNMENT in a mapped segment
        try:
            segment, offset = self._arena.allocate(nbytes + pad)
        except (MemoryError, OSError):  # full, or no new segment to be had (memory, descriptors)
            return None
        with self._bases_lock:
            while len(self._bases) <= segment:  # a segment this allocation added
                mapped = self._arena.segments[len(self._bases)].map
                self._bases.append(np.frombuffer(mapped, dtype=np.uint8, count=1).ctypes.data)
        # its views keep it (their base) and so the memory; not a ctypes buffer, whose ``c_char * n`` type is made
        # anew whenever the collector has freed the last one of that size
        array = np.frombuffer(self._arena.segments[segment].map, dtype=np.uint8, count=nbytes + pad, offset=offset)
        weakref.finalize(array, self._arena.release, segment, offset, nbytes + pad)
        return array[pad:] if pad else array

    def locate(self, array: np.ndarray) -> tuple[int, int] | None:
        """(segment, offset) of a C-contiguous array that lies in the pool, else None."""
        if not array.flags.c_contiguous or array.dtype.hasobject:
            return None
        address = array.__array_interface__["data"][0]
        for index, base in enumerate(self._bases):
            if base <= address and address + array.nbytes <= base + self._arena.segments[index].size:
                return index, address - base
        return None

    @property
    def segments(self) -> list[MemfdSegment]:
        """Every segment so far, in order (a peer that has the first k is told of the rest)."""
        return self._arena.segments

    def in_use(self) -> int:
        return self._arena.in_use()
