"""Tensors between the server and a Python worker, through shared memory.

Each side writes the tensors it sends into an *arena* it owns: anonymous ``memfd`` segments
whose file descriptors travel once over the control connection (``SCM_RIGHTS``).  A message
then carries only where a tensor lies (segment, offset, size); the receiver maps it and reads
it as a numpy view, without a copy.  The memory has no name in any file system, so it is gone
as soon as the last process that maps it exits or closes it: a crashed worker leaves nothing
behind.  An arena starts at ``initial_bytes`` and grows by segments of at least
``growth_bytes`` (Triton's ``shm-default-byte-size`` / ``shm-growth-byte-size``).

Tensors of at most ``INLINE_MAX_BYTES`` travel inside the message instead: for them, allocating,
mapping and later releasing arena space costs more than the copy it saves.  A large input the server
received straight into its shared tensor pool (``runtime/tensor_pool.py``) is not copied at all: the
pool's segments are announced to the worker like the arena's (numbered from ``POOL_SEGMENTS``) and the
reference points into them.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

import numpy as np

from runtime.datatypes import WIRE_DTYPES, datatype_of, deserialize_bytes, serialize_bytes, wire_dtype
from runtime.memfd_arena import MemfdArena, MemfdSegment
from runtime.tensor_pool import TensorPool

DEFAULT_INITIAL_BYTES = 1 << 20
DEFAULT_GROWTH_BYTES = 1 << 20
INLINE_MAX_BYTES = 16 * 1024
INLINE = -1  # the segment of a tensor carried in the message itself
POOL_SEGMENTS = 1 << 20  # the tensor pool's segment k is segment POOL_SEGMENTS + k to a peer
DIRECT_SEGMENT = 1 << 30  # a direct path's buffer (runtime/direct_path.py): read in place, as the pool's segments
REQUEST_INPUT = -2  # the segment of an output that is its request's input number ``offset``, read in place there


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
    _write_frame(connection.fileno(), payload)


def recv_pickled(connection: Connection) -> Any:
    """``connection.recv``, reading the frame straight from the descriptor (no buffer objects per read); EOFError
    once the peer has closed.  A segment's descriptor that follows a message is left for ``recv_handle``."""
    fd = connection.fileno()
    (size,) = _FRAME.unpack(_read_exactly(fd, 4))
    if size == -1:
        (size,) = _LONG_FRAME.unpack(_read_exactly(fd, 8))
    return pickle.loads(_read_exactly(fd, size))


def send_direct(fd: int, message: tuple) -> None:
    """A message on a direct path's socket (``runtime/direct_path.py``), framed as send_pickled frames one (the
    other end reads 4-byte lengths only)."""
    payload = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    if len(payload) > 0x7FFFFFFF:
        raise ValueError(f"a direct answer of {len(payload)} bytes (2 GiB at most)")
    _write_frame(fd, payload)


class UnreadableFrame(ValueError):
    """A whole frame came on a direct path's socket but is not a message this protocol sends (a string that is
    not UTF-8, a truncated pickle): the stream stays in step, only that message is lost."""


def recv_direct(fd: int) -> Any:
    """A batch sent on a direct path's socket; EOFError once it has closed, UnreadableFrame for one that cannot
    be read."""
    (size,) = _FRAME.unpack(_read_exactly(fd, 4))
    frame = _read_exactly(fd, size)
    try:
        message = pickle.loads(frame)  # noqa: S301 - the server's own lane, on a socket only it holds
    except Exception as exc:  # noqa: BLE001 - whatever the bytes, the worker lives
        raise UnreadableFrame(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(message, tuple) or not message:
        raise UnreadableFrame(f"a {type(message).__name__} is not a message")
    return message


def _write_frame(fd: int, payload: bytes) -> None:
    """A 4-byte length and the payload in one ``writev`` (the payload not copied behind its header); a write a
    signal cut short goes on with the rest, in order."""
    header = _FRAME.pack(len(payload))
    written = os.writev(fd, (header, payload))
    if written < len(header) + len(payload):
        rest = memoryview(header + payload)[written:]
        while rest:
            rest = rest[os.write(fd, rest):]


def inline_ref(name: str, array: np.ndarray) -> TensorRef:
    """A tensor carried in the message itself, whatever its size (a direct path's other end reads no arena)."""
    datatype = datatype_of(array)
    data = bytes(serialize_bytes(array)) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
    return (name, datatype, array.shape, INLINE, 0, len(data), data)


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


class Arena(MemfdArena):
    """Memory this side writes the tensors it sends into (see ``runtime/memfd_arena.py``), and tells its peer
    about segment by segment."""

    def __init__(self, initial_bytes: int = DEFAULT_INITIAL_BYTES, growth_bytes: int = DEFAULT_GROWTH_BYTES,
                 max_bytes: int = 1 << 34) -> None:
        super().__init__(initial_bytes, growth_bytes, max_bytes)
        self._announced = 0  # segments the peer already has

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
        """Release the space of tensors written here (an inline one, or one lying in the tensor pool, has none)."""
        for _, _, _, segment, offset, nbytes, _ in refs:
            if INLINE < segment < POOL_SEGMENTS:
                self.release(segment, offset, nbytes)

    def announce(self, connection: Connection, peer_pid: int) -> None:
        """Send the peer the descriptors of segments it has not got yet (before a message that uses them)."""
        self._announced = announce_segments(connection, peer_pid, self.segments, self._announced)


def announce_segments(connection: Connection, peer_pid: int, segments: list[MemfdSegment], announced: int,
                      first_index: int = 0) -> int:
    """Send the peer the descriptors of ``segments[announced:]``, numbered from ``first_index``; how many it has."""
    while announced < len(segments):
        connection.send(("segment", first_index + announced, segments[announced].size))
        send_handle(connection, segments[announced].fd, peer_pid)
        announced += 1
    return announced


def pool_ref(pool: TensorPool, name: str, array: np.ndarray, datatype: str) -> TensorRef | None:
    """Where a large input already lies in the server's tensor pool (``runtime/tensor_pool.py``), for the peer to
    read in place; None when it does not lie there (or is small, or BYTES)."""
    if array.nbytes <= INLINE_MAX_BYTES or datatype == "BYTES":
        return None
    where = pool.locate(array)
    if where is None:
        return None
    return (name, datatype, array.shape, POOL_SEGMENTS + where[0], where[1], array.nbytes, None)


def input_ref(name: str, array: np.ndarray, inputs: list[tuple[int, np.ndarray]]) -> TensorRef | None:
    """An output that is one of ``inputs`` ((index, array) of its request's inputs that lie in the server's tensor
    pool), whole and in place: named by that input's index, for the server to answer from its own array of the
    same memory (no copy into the arena, none back). None for any other output."""
    if not inputs or array.dtype.hasobject or not array.flags.c_contiguous:
        return None
    address = array.__array_interface__["data"][0]
    for index, source in inputs:
        if (address == source.__array_interface__["data"][0] and array.nbytes == source.nbytes
                and array.dtype == source.dtype):
            return (name, datatype_of(array), array.shape, REQUEST_INPUT, index, array.nbytes, None)
    return None


def request_input(request_inputs: Sequence[Any], ref: TensorRef) -> np.ndarray | None:
    """The server's own array for an output the worker named by its input (``input_ref``), viewed as the output's
    shape; None where that input is not the same bytes (the worker never names another)."""
    _, datatype, shape, _, index, nbytes, _ = ref
    if not 0 <= index < len(request_inputs):
        return None
    data = request_inputs[index].data
    if not isinstance(data, np.ndarray) or data.nbytes != nbytes or not data.flags.c_contiguous:
        return None
    return data.reshape(-1).view(np.uint8).view(wire_dtype(datatype)).reshape(shape)


class PeerMemory:
    """The peer's arena, mapped here for reading (its segments arrive as ``segment`` messages)."""

    def __init__(self) -> None:
        self.segments: dict[int, MemfdSegment] = {}

    def receive_segment(self, connection: Connection, index: int, size: int) -> None:
        self.segments[index] = MemfdSegment(size, fd=recv_handle(connection))

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
        return _borrowed(self.segments[segment].map, offset, nbytes, shape, wire_dtype(datatype), release, ref)

    def close(self) -> None:
        for segment in self.segments.values():
            segment.close()
        self.segments.clear()


def _borrowed(segment: mmap.mmap, offset: int, nbytes: int, shape: tuple[int, ...], dtype: np.dtype,
              release: Callable[[TensorRef], None], ref: TensorRef) -> np.ndarray:
    """The tensor's array on ``segment``, ``release(ref)`` run once it and every view of it are gone: views keep
    the flat array they came from as their base (numpy stops collapsing bases at one whose own base, the mapping,
    is not an array).  Not a ctypes buffer: ``c_char * n`` makes a new type whenever the collector has freed the
    last one of that size (36 us a tensor on a slow machine here)."""
    flat = np.frombuffer(segment, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
    weakref.finalize(flat, release, ref)
    return flat.reshape(shape)
