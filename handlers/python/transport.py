"""Tensors between the server and a Python worker, through shared memory.

Each side writes the tensors it sends into an *arena* it owns: anonymous ``memfd`` segments
whose file descriptors travel once over the control connection (``SCM_RIGHTS``).  A message
then carries only where a tensor lies (segment, offset, size); the receiver maps it and reads
it as a numpy view, without a copy.  The memory has no name in any file system, so it is gone
as soon as the last process that maps it exits or closes it: a crashed worker leaves nothing
behind.  An arena starts at ``initial_bytes`` and grows by segments of at least
``growth_bytes`` (Triton's ``shm-default-byte-size`` / ``shm-growth-byte-size``).

Tensors of at most ``INLINE_MAX_BYTES`` travel inside the message instead: for them, allocating,
mapping and later releasing arena space costs more than the copy it saves.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import pickle
import struct
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

import numpy as np

from runtime.datatypes import WIRE_DTYPES, deserialize_bytes, serialize_bytes, wire_dtype

ALIGNMENT = 64
DEFAULT_INITIAL_BYTES = 1 << 20
DEFAULT_GROWTH_BYTES = 1 << 20
INLINE_MAX_BYTES = 16 * 1024
INLINE = -1  # the segment of a tensor carried in the message itself


_FRAME = struct.Struct("!i")  # multiprocessing.Connection's framing: a length, then the bytes
_LONG_FRAME = struct.Struct("!Q")  # after a length of -1: a message of 2 GiB or more


def send_pickled(connection: Connection, message: tuple) -> None:
    """``connection.send`` in one ``writev`` of multiprocessing's frame: without its ForkingPickler, which builds a
    pickler and copies its dispatch table for every message (about 8 µs, twice per batch), nor its checks and
    copies around the write.  Either end reads it with :func:`recv_pickled` or ``Connection.recv``."""
    payload = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    if len(payload) > 0x7FFFFFFF:
        connection.send_bytes(payload)
        return
    fd = connection.fileno()
    header = _FRAME.pack(len(payload))
    written = os.writev(fd, (header, payload))
    if written < len(header) + len(payload):  # a signal cut the write short: the rest, in order
        rest = memoryview(header + payload)[written:]
        while rest:
            rest = rest[os.write(fd, rest):]


def recv_pickled(connection: Connection) -> Any:
    """``connection.recv``, reading the frame straight from the descriptor (no buffer objects per read); EOFError
    once the peer has closed.  A segment's descriptor that follows a message is left for ``recv_handle``."""
    fd = connection.fileno()
    (size,) = _FRAME.unpack(_read_exactly(fd, 4))
    if size == -1:
        (size,) = _LONG_FRAME.unpack(_read_exactly(fd, 8))
    return pickle.loads(_read_exactly(fd, size))


def _read_exactly(fd: int, size: int) -> bytes:
    data = os.read(fd, size)
    if len(data) == size:
        return data
    if not data:
        raise EOFError
    parts = bytearray(data)
    while len(parts) < size:
        more = os.read(fd, size - len(parts))
        if not more:
            raise EOFError
        parts += more
    return bytes(parts)


# Where one tensor lies in the sender's arena: (name, datatype, shape, segment, offset, nbytes, inline), where
# ``inline`` holds the bytes of a small tensor carried in the message itself (segment INLINE). A plain tuple, not a
# NamedTuple: pickle writes and reads a plain one in C, where a NamedTuple calls Python for each tensor both ways
# (a batch of eight add_sub requests' 16 tensors: 11.5 against 2.8 us to dump, 6.8 against 3.2 us to load).
TensorRef = tuple[str, str, tuple[int, ...], int, int, int, bytes | None]


def _align(size: int) -> int:
    return (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class _Segment:
    def __init__(self, size: int, fd: int | None = None) -> None:
        self.owned = fd is None
        self.fd = os.memfd_create("triton-python", os.MFD_CLOEXEC) if fd is None else fd
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


class Arena:
    """Memory this side writes tensors into (first fit, coalescing free list, thread-safe)."""

    def __init__(self, initial_bytes: int = DEFAULT_INITIAL_BYTES, growth_bytes: int = DEFAULT_GROWTH_BYTES,
                 max_bytes: int = 1 << 34) -> None:
        self.growth_bytes = growth_bytes
        self.max_bytes = max_bytes
        self.segments: list[_Segment] = []
        self._free: list[list[tuple[int, int]]] = []  # per segment: sorted (offset, size)
        self._lock = threading.Lock()
        self._announced = 0  # segments the peer already has
        self._grow(initial_bytes, exact=True)

    @property
    def total_bytes(self) -> int:
        return sum(segment.size for segment in self.segments)

    def _grow(self, at_least: int, exact: bool = False) -> int:
        size = _align(at_least) if exact else max(_align(at_least), self.growth_bytes)
        if self.total_bytes + size > self.max_bytes:
            raise MemoryError(f"shared memory for tensors would exceed {self.max_bytes} bytes")
        self.segments.append(_Segment(size))
        self._free.append([(0, size)])
        return len(self.segments) - 1

    def allocate(self, nbytes: int) -> tuple[int, int]:
        """(segment, offset) of ``nbytes`` of fresh space."""
        size = _align(max(nbytes, 1))
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
        size = _align(max(nbytes, 1))
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

    def write(self, name: str, array: np.ndarray, datatype: str) -> TensorRef:
        """Copy a tensor into the arena (a small one into the reference itself)."""
        shape = array.shape  # a tuple of Python ints
        if datatype != "BYTES" and array.nbytes <= INLINE_MAX_BYTES:
            return (name, datatype, shape, INLINE, 0, array.nbytes, array.tobytes())
        if datatype == "BYTES":
            data = serialize_bytes(array)
            if len(data) <= INLINE_MAX_BYTES:
                return (name, datatype, shape, INLINE, 0, len(data), bytes(data))
            segment, offset = self.allocate(len(data))
            self.segments[segment].view[offset : offset + len(data)] = data
            nbytes = len(data)
        else:
            source = np.ascontiguousarray(array)
            nbytes = source.nbytes
            segment, offset = self.allocate(nbytes)
            if nbytes:
                target = np.frombuffer(self.segments[segment].view, dtype=np.uint8, count=nbytes, offset=offset)
                target[:] = source.reshape(-1).view(np.uint8)
        return (name, datatype, shape, segment, offset, nbytes, None)

    def free(self, refs: list[TensorRef]) -> None:
        for _, _, _, segment, offset, nbytes, _ in refs:
            if segment != INLINE:
                self.release(segment, offset, nbytes)

    def announce(self, connection: Connection, peer_pid: int) -> None:
        """Send the peer the descriptors of segments it has not got yet (before a message that uses them)."""
        while self._announced < len(self.segments):
            connection.send(("segment", self._announced, self.segments[self._announced].size))
            send_handle(connection, self.segments[self._announced].fd, peer_pid)
            self._announced += 1

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
        self.segments.clear()


class PeerMemory:
    """The peer's arena, mapped here for reading (its segments arrive as ``segment`` messages)."""

    def __init__(self) -> None:
        self.segments: dict[int, _Segment] = {}

    def receive_segment(self, connection: Connection, index: int, size: int) -> None:
        self.segments[index] = _Segment(size, fd=recv_handle(connection))

    def array(self, ref: TensorRef, copy: bool = False) -> np.ndarray:
        """The tensor a reference points at: a writable view of the peer's memory (or a private copy)."""
        name, datatype, shape, segment, offset, nbytes, inline = ref
        if segment == INLINE:
            view, copy = memoryview(bytearray(inline or b"")), False  # a private, writable copy already
        else:
            view = self.segments[segment].view[offset : offset + nbytes]
        if datatype == "BYTES":
            count = int(np.prod(shape, dtype=np.int64))
            return deserialize_bytes(view, count, name).reshape(shape)
        array = np.frombuffer(view, dtype=wire_dtype(datatype)).reshape(shape)
        return array.copy() if copy else array

    def borrow(self, ref: TensorRef, release: Callable[[TensorRef], None]) -> np.ndarray:
        """The tensor in place, without a copy; ``release(ref)`` runs once nothing refers to its memory any more
        (the array and every view of it gone), to let the peer reuse it.  BYTES are copied (and released);
        a tensor that came inline is read where it is (read-only) and has nothing to release."""
        _, datatype, shape, segment, offset, nbytes, inline = ref
        if segment == INLINE:
            if datatype == "BYTES":
                return self.array(ref)
            return np.frombuffer(inline or b"", dtype=WIRE_DTYPES[datatype]).reshape(shape)
        if datatype == "BYTES" or not nbytes:
            array = self.array(ref, copy=True)
            release(ref)
            return array
        owner = _Borrowed(self.segments[segment].map, offset, nbytes, shape, wire_dtype(datatype))
        weakref.finalize(owner, release, ref)
        return np.asarray(owner)

    def close(self) -> None:
        for segment in self.segments.values():
            segment.close()
        self.segments.clear()


class _Borrowed:
    """Owns a borrowed tensor's memory for numpy: arrays made from it (and their views) keep it alive."""

    def __init__(self, segment: mmap.mmap, offset: int, nbytes: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.buffer = (ctypes.c_char * nbytes).from_buffer(segment, offset)
        self.__array_interface__ = {"data": (ctypes.addressof(self.buffer), False), "shape": shape,
                                    "typestr": dtype.str, "version": 3}
