"""A direct path: plain requests a front end sends to a model's worker process itself, past the core.

The core decides which model versions may be served so (:meth:`InferenceService.direct_models`) and hands a front
end what it needs as data: the model's declared inputs and outputs, the worker's channel (a socket and a buffer the
worker maps), a way to hear when the model's own queue is idle, and a way to add what it served to the model's
statistics. The front end serves a request that way only where the core would have served it the same (see
``runtime/native/lane.h``: the lanes both adapters hand plain requests to); anything else goes through the core as
before.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from runtime.config.spec import ModelSpec
from runtime.errors import ServingError
from runtime.types import ModelOutputs, RequestedOutput

# The direct path's messages are the worker protocol's (handlers/python/transport.py), one request a batch; the
# front end's end also knows these: where an output lies (in the message, or as the request's input of that number)
# and the execution a direct batch is (BLS calls from it name it, so that the handler sees them).
DIRECT_EXECUTION = -1


@dataclass
class DirectChannel:
    """A worker process's side door (handlers/python: one per live worker): the front end writes a batch's inputs
    into the buffer, sends its message on the socket and reads the answer there.  Before the worker stops or is
    dropped, the handler runs the ``closing`` hooks (``wait``: whether to wait for a batch under way, as an unload
    does; a lost worker's do not)."""

    socket_fd: int
    buffer_fd: int
    buffer_size: int
    buffer_segment: int  # the buffer's segment number in the worker's references
    execute_timeout: float
    # why a request sent this way failed, in the core's words, once the worker went away (``timed_out``: it did not
    # answer in time, and is dropped here); blocking (it may wait for the process): never on the event loop
    failure: Callable[[bool], str]
    # a batch's answer as the core takes a model's: its outputs, the model's error, or None where the model asked to
    # see the request again (the backend's own format: ``read_answer(frame, the request's inputs)``)
    read_answer: Callable[[bytes, list[bytes]], ModelOutputs | ServingError | None]
    closing: list[Callable[[bool], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    closed: bool = False

    def close(self, wait: bool) -> None:
        """Run the closing hooks once (the handler, before the worker stops)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            hooks, self.closing = self.closing, []  # nothing of the front end's kept past this
        for hook in hooks:
            hook(wait)

    def on_close(self, hook: Callable[[bool], None]) -> Callable[[], None] | None:
        """Add a closing hook; how to take it off again, or None where the channel has closed already (the hook is
        not run)."""
        with self._lock:
            if self.closed:
                return None
            self.closing.append(hook)

        def remove() -> None:
            with self._lock:
                if hook in self.closing:
                    self.closing.remove(hook)

        return remove


# What a direct path served, for the model's statistics: rows of (batch size, requests, total, input, infer and
# output ns), then failed requests, their ns, and the wall-clock ns of the last request (0: none).
ServedRows = tuple[list[tuple[int, int, int, int, int, int]], int, int, int]


@dataclass(frozen=True)
class DirectModel:
    """A model version a front end may serve plain requests of directly (to requests naming no version or this
    one); ``watch_idle(watcher, hold)`` tells ``watcher(bool)`` whether the model's own queue is idle (nothing
    queued or executing) now and on each change, asks ``hold()`` before the scheduler runs a batch (None: the front
    end holds the instance with nothing, else an awaitable done once it does not), and returns how to stop;
    ``add_served(pull, state)`` makes ``pull()`` (which returns ServedRows) be asked whenever the model's statistics
    are read, and ``state()`` (whether the front end takes its requests, whether it serves one now) whenever its
    lanes are, and returns how to stop;
    ``record_served(*rows)`` counts what the front end finished itself."""

    spec: ModelSpec
    version: int
    channel: DirectChannel
    watch_idle: Callable[[Callable[[bool], None], Callable[[], Awaitable[None] | None]], Callable[[], None]]
    add_served: Callable[[Callable[[], ServedRows], Callable[[], tuple[bool, bool]]], Callable[[], None]]
    record_served: Callable[[list, int, int, int], None]


SERVE_AGAIN = object()  # a request a direct path gave back that the core is to serve afresh


@dataclass
class LaneAnswer:
    """An HTTP answer a direct path wrote itself: its body (read in place), and its JSON header's length."""

    body: memoryview
    json_length: int


@dataclass
class LaneRequest:
    """An HTTP request a direct path took: ``future`` gets a LaneAnswer, the model's ServingError, the core's
    InferResponse (for an answer given back and finished in the core's words) or SERVE_AGAIN."""

    token: int
    model: str
    future: asyncio.Future
    requested: list[RequestedOutput]


class DirectLanes(Protocol):
    """What the HTTP route hands a lone request with binary tensors to (the lanes, ``runtime/native/lanes.py``):
    served past the core where the model's lane takes it."""

    def take_http(self, model: str, version: str, request_id: str, inputs: list[tuple[str, str, list[int], int]],
                  outputs: list[str], chunks: list[bytes], header_length: int) -> LaneRequest | None:
        """Served by the model's lane (``inputs``: name, datatype, shape, bytes, lying one after another in
        ``chunks`` from ``header_length`` on; ``outputs``: those asked for, all as binary data), or None where
        none takes it (nothing touched)."""

    def withdraw(self, request: LaneRequest) -> None:
        """The request's client went away: the model is told, the outcome dropped."""
