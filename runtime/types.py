"""Protocol-neutral request and response types of the inference core."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class InferTensor:
    """A named tensor; BYTES data is a numpy object array of ``bytes``.

    A request's input may instead arrive as ``raw`` little-endian bytes (binary tensors, gRPC
    raw contents): validation checks their size against shape and datatype, then sets ``data``.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | None
    parameters: dict[str, Any] = field(default_factory=dict)
    raw: bytes | memoryview | None = None
    in_shared_memory: bool = False  # an output written into a shared-memory region: no data in the response

    def values(self) -> np.ndarray:
        """``data``, which an output and a validated input always have (only a received input may lack it)."""
        data = self.data
        if data is None:
            raise TypeError(f"tensor '{self.name}' has no data yet")
        return data


@dataclass
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferRequest:
    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: list[InferTensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)  # empty: all outputs
    parameters: dict[str, Any] = field(default_factory=dict)
    raw_input: bool = False  # a raw binary request: one nameless input whose shape the model's config gives
    stream: ResponseStream | None = None  # where a decoupled model's responses to this request go
    bls_chain: tuple[str, ...] = ()  # the models whose executions wait on this request (BLS calls, outermost first)
    caller_execution: int = 0  # the execution waiting on this request (a BLS call's or ensemble step's; wait_graph)
    execution: int = 0  # while it executes: the execution it is part of (set by the scheduler; wait_graph)
    correlation_id: int | str = 0  # the sequence it belongs to (set by the sequence scheduler)
    flags: int = 0  # the sequence's START (1) / END (2) flags for this request
    trace: Any = None  # its trace when sampled (runtime.extensions.tracing.Trace); an ensemble step: its parent's
    trace_context: str | None = None  # a W3C traceparent the client sent (continued in opentelemetry mode)
    cancel_asked: bool = False  # its caller asked the model to stop (a BLS ResponseIterator's cancel())
    outputs_optional: bool = False  # an ensemble step's: outputs its model did not produce are left out (Triton 2.52)
    output_regions: dict[str, Any] = field(default_factory=dict)  # output -> the shared-memory region it is held in

    def ask_cancel(self) -> None:
        """Tell the decoupled model running this request to stop (it sees ``is_cancelled()``); unlike a client
        going away, its responses still come, its final one included."""
        self.cancel_asked = True
        if self.stream is not None:
            self.stream.cancel()

    def input_arrays(self) -> dict[str, np.ndarray]:
        return {tensor.name: tensor.values() for tensor in self.inputs}


@dataclass
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: list[InferTensor]
    parameters: dict[str, Any] = field(default_factory=dict)


class ModelOutputs(dict):
    """A model's answer to one request: output name -> array, and the response parameters it set."""

    def __init__(self, arrays: Any = (), parameters: dict[str, Any] | None = None) -> None:
        super().__init__(arrays)
        self.parameters: dict[str, Any] = parameters or {}


@dataclass
class StreamItem:
    """One response of a decoupled model: its outputs (or an error, or None for a bare final flag), and
    whether it is the last one for its request."""

    outputs: dict[str, np.ndarray] | BaseException | None  # a ModelOutputs, where the model set parameters
    final: bool


@dataclass
class StreamResponse:
    """One response of a stream as the core hands it to a protocol adapter."""

    response: InferResponse | None  # None: a bare final flag (or an error)
    error: Exception | None
    final: bool


class ResponseStream:
    """The responses to one request of a decoupled model, put from any thread, taken on the event loop.

    Nothing is put after the final item: a later put is dropped (the model already ended the request).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[StreamItem] = asyncio.Queue()
        self._lock = threading.Lock()
        self.finished = False  # the final item was put
        self.cancelled = False  # the client went away: the model may check is_cancelled()
        self.on_cancel: Any = None  # called (on the loop) when the client goes away

    def put(self, item: StreamItem) -> bool:
        """Queue an item (from any thread); False if the stream had already finished."""
        with self._lock:
            if self.finished:
                return False
            self.finished = item.final
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        return True

    async def get(self) -> StreamItem:
        return await self._queue.get()

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            if self.on_cancel is not None:
                self.on_cancel()
