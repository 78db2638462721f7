"""Frames between a front-end process and the model owner: pickled messages whose tensors travel beside them.

A frame is ``<Q total> <I pickle length> <I buffer count> <Q length>* pickle buffer*``. Buffers of at least
``OUT_OF_BAND_BYTES`` (numpy arrays, and the tensor contents :mod:`runtime.frontends.messages` packs) are written
out of band: no copy into the pickle on the sending side, and views over the received frame on the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any

from runtime.protocol import model_config_pb2

OUT_OF_BAND_BYTES = 4096
MAX_FRAME_BYTES = 1 << 40  # a length past this is a broken stream, not a message

logger = logging.getLogger(__name__)

_TOTAL = struct.Struct("<Q")
_HEAD = struct.Struct("<II")


class LinkClosed(ConnectionError):
    """The other process closed the link (or it broke mid-frame)."""


def _model_config(serialized: bytes) -> model_config_pb2.ModelConfig:
    return model_config_pb2.ModelConfig.FromString(serialized)


class _Pickler(pickle.Pickler):
    # the generated class names a module ("model_config_pb2") that is importable only as runtime.protocol's
    dispatch_table = {model_config_pb2.ModelConfig: lambda config: (_model_config, (config.SerializeToString(),))}


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


class FrontEndLink(asyncio.Protocol):
    """One end of a link on the event loop: each complete frame that arrives goes to ``on_message`` at once (no
    task or future per frame), and frames sent in one turn of the loop leave in one write."""

    def __init__(self, on_message: Callable[[Any], None]) -> None:
        self.on_message = on_message
        self.closed: asyncio.Future = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._pending: list[bytes | memoryview] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self._buffer:  # the usual case: whole frames, decoded in place over ``data``
            consumed = self._deliver(memoryview(data), copy=False)
            if consumed < len(data):
                self._buffer += memoryview(data)[consumed:]
            return
        self._buffer += data  # the rest of a frame (a large one arrives in many pieces)
        view = memoryview(self._buffer)
        consumed = self._deliver(view, copy=True)
        del view  # no view may remain while the buffer shrinks
        if consumed:
            del self._buffer[:consumed]

    def _deliver(self, view: memoryview, copy: bool) -> int:
        """Hand over every complete frame at the start of ``view``; how many bytes they took."""
        at = 0
        while len(view) - at >= _TOTAL.size:
            (total,) = _TOTAL.unpack_from(view, at)
            if total > MAX_FRAME_BYTES:  # a broken stream
                if self.transport is not None:
                    self.transport.close()
                return len(view)
            end = at + _TOTAL.size + total
            if end > len(view):
                break
            body = view[at + _TOTAL.size : end]
            at = end
            try:
                message = decode(bytes(body) if copy else body)  # type: ignore[arg-type]  # msgspec reads views
            except Exception:  # noqa: BLE001 - both ends are ours: a frame that does not decode ends the link
                logger.exception("a frame on a front-end link does not decode: closing the link")
                if self.transport is not None:
                    self.transport.close()
                return len(view)
            del body
            self.on_message(message)
        return at

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def send(self, message: Any, plain: bool = False) -> None:
        """Queue one message (``plain``: see :func:`encode`); it is written at the end of this turn of the loop."""
        parts = encode(message, plain)
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.extend(parts)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(pending)

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        self._flush()
        if self.transport is not None:
            self.transport.close()

    async def aclose(self, timeout: float = 5.0) -> None:
        """Close once what is queued has been written (the process is about to end)."""
        self.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.closed), timeout)


async def open_link(sock: socket.socket, on_message: Callable[[Any], None]) -> FrontEndLink:
    """A :class:`FrontEndLink` over a connected Unix socket."""
    _, link = await asyncio.get_running_loop().create_unix_connection(lambda: FrontEndLink(on_message), sock=sock)
    return link


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
