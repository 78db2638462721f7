"""Frames between a front-end process and the model owner: pickled messages whose tensors travel beside them.

A frame is ``<Q total> <I pickle length> <I buffer count> <Q length>* pickle buffer*``. Arrays of at least
``OUT_OF_BAND_BYTES`` (and memoryviews, such as request bodies sliced without a copy) are written out of band:
no copy into the pickle on the sending side, and views over the received frame on the other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.protocol import model_config_pb2
from runtime.types import InferRequest, InferResponse, InferTensor, RequestedOutput, StreamResponse

OUT_OF_BAND_BYTES = 4096
MAX_FRAME_BYTES = 1 << 40  # a length past this is a broken stream, not a message

_TOTAL = struct.Struct("<Q")
_HEAD = struct.Struct("<II")


class LinkClosed(ConnectionError):
    """The other process closed the link (or it broke mid-frame)."""


def _array(data: bytes, dtype: str, shape: tuple) -> np.ndarray:
    return np.frombuffer(data, dtype).reshape(shape)


def _reduce_array(array: np.ndarray) -> tuple:
    """Small arrays as their bytes (a quarter of numpy's own pickling cost); others as numpy pickles them,
    out of band."""
    if array.nbytes < OUT_OF_BAND_BYTES and not array.dtype.hasobject:
        return _array, (array.tobytes(), array.dtype.str, array.shape)
    return array.__reduce_ex__(5)


def _reduce_fields(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """A dataclass as its constructor's positional arguments (cheaper than pickling its ``__dict__``)."""
    return lambda obj: (type(obj), tuple(getattr(obj, name) for name in names))


def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _model_config(serialized: bytes) -> model_config_pb2.ModelConfig:
    return model_config_pb2.ModelConfig.FromString(serialized)


class _Pickler(pickle.Pickler):
    dispatch_table = {
        # the generated class names a module ("model_config_pb2") that is importable only as runtime.protocol's
        model_config_pb2.ModelConfig: lambda config: (_model_config, (config.SerializeToString(),)),
        memoryview: lambda view: (memoryview, (pickle.PickleBuffer(view),)),  # plain pickle refuses memoryviews
        np.ndarray: _reduce_array,
        **{cls: _reduce_fields(_fields(cls)) for cls in (InferTensor, InferRequest, InferResponse, RequestedOutput,
                                                          StreamResponse)},
    }


def encode(message: Any, plain: bool = False) -> list[bytes | memoryview]:
    """The frame carrying ``message``, as parts to write in order. ``plain``: the message holds only builtin
    types and PickleBuffers (each sent out of band), so the C pickler needs no hooks."""
    buffers: list[memoryview] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        view = buffer.raw()
        if view.nbytes < OUT_OF_BAND_BYTES:
            return True  # in band
        buffers.append(view)
        return False

    if plain:
        raw: list[pickle.PickleBuffer] = []
        pickled = memoryview(pickle.dumps(message, protocol=5, buffer_callback=raw.append))
        buffers = [buffer.raw() for buffer in raw]
    else:
        stream = io.BytesIO()
        _Pickler(stream, protocol=5, buffer_callback=out_of_band).dump(message)
        pickled = stream.getbuffer()
    lengths = struct.pack(f"<{len(buffers)}Q", *(b.nbytes for b in buffers))
    total = _HEAD.size + len(lengths) + pickled.nbytes + sum(b.nbytes for b in buffers)
    return [_TOTAL.pack(total) + _HEAD.pack(pickled.nbytes, len(buffers)) + lengths, pickled, *buffers]


def decode(frame: bytes | bytearray) -> Any:
    """The message in a frame's body (everything after its total length); arrays are views over ``frame``."""
    view = memoryview(frame)
    pickled_length, count = _HEAD.unpack_from(view)
    at = _HEAD.size
    lengths = struct.unpack_from(f"<{count}Q", view, at)
    at += 8 * count
    pickled = view[at : at + pickled_length]
    at += pickled_length
    buffers = []
    for length in lengths:
        buffers.append(view[at : at + length])
        at += length
    return pickle.loads(pickled, buffers=buffers)


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message from an asyncio stream; LinkClosed at its end."""
    try:
        (total,) = _TOTAL.unpack(await reader.readexactly(_TOTAL.size))
        if total > MAX_FRAME_BYTES:
            raise LinkClosed(f"frame of {total} bytes")
        return decode(await reader.readexactly(total))
    except asyncio.IncompleteReadError:
        raise LinkClosed("the link closed") from None


class FrameWriter:
    """Writes frames to an asyncio stream, every frame queued in one turn of the loop in one write."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._pending: list[bytes | memoryview] = []

    def send(self, message: Any, plain: bool = False) -> None:
        parts = encode(message, plain)
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.extend(parts)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if not self.writer.is_closing():
            self.writer.writelines(pending)

    def close(self) -> None:
        self._flush()
        self.writer.close()


def send_blocking(sock: socket.socket, message: Any) -> None:
    """Send one message on a blocking socket."""
    sock.sendall(b"".join(encode(message)))


def receive_blocking(sock: socket.socket) -> Any:
    """The next message from a blocking socket; LinkClosed at its end."""
    (total,) = _TOTAL.unpack(_receive_exactly(sock, _TOTAL.size))
    if total > MAX_FRAME_BYTES:
        raise LinkClosed(f"frame of {total} bytes")
    return decode(_receive_exactly(sock, total))


def _receive_exactly(sock: socket.socket, size: int) -> bytearray:
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        count = sock.recv_into(view[got:])
        if count == 0:
            raise LinkClosed("the link closed")
        got += count
    return data
