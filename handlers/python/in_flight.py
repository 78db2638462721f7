"""The requests a Python-backend instance is executing: their keys, a decoupled request's stream, cancellation.

A request is known by a key while it executes (the worker names it in every response it sends); a decoupled
request keeps its key, its stream and its inputs in shared memory until its final response, which may come long
after ``execute`` returned.  Both ways of executing (a worker process, or in this process) keep their requests
here, so responses, errors, cancellation and reschedules are delivered alike.
"""

from __future__ import annotations

import itertools
import json
import weakref
from collections.abc import Callable
from typing import Any, cast

import numpy as np

import triton_python_backend_utils as pb_utils
from handlers.base import REQUEUE, RESCHEDULE, RequestResult
from handlers.python.link import WorkerLink
from handlers.python.runner import Result
from handlers.python.transport import Arena
from runtime.datatypes import as_bytes_array
from runtime.errors import ServingError, Status, Unavailable
from runtime.types import InferRequest, ModelOutputs, StreamItem


def to_result(result: Result | None) -> RequestResult:
    """A worker's result for one request as the scheduler takes it."""
    if result is None:
        return RESCHEDULE
    if result[0] == "ok":
        arrays = {name: as_bytes_array(a) if a.dtype == np.object_ else a for name, a in result[1]}
        parameters = result[2]
        return ModelOutputs(arrays, json.loads(parameters) if parameters and parameters != "{}" else None)
    _, message, status = result
    return ServingError(message, Status(status))


def stream_item(result: Result | None, flags: int) -> StreamItem:
    """A response a decoupled model sent (None: only the final flag)."""
    final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    outputs = None if result is None else to_result(result)
    if isinstance(outputs, ServingError):
        outputs.executed = True  # the model's own error response
    return StreamItem(cast(ModelOutputs | ServingError | None, outputs), final)  # a decoupled model: no reschedule


def borrowed(encoded: Any, link: WorkerLink, request: InferRequest | None = None) -> Result | None:
    """A worker's result with its tensors read in place from the worker's memory (returned once unused), or from
    ``request``'s own inputs where the worker named one (``transport.input_ref``)."""
    if encoded is None or encoded[0] != "ok":
        return encoded
    return ("ok", link.borrow(encoded[1], request.inputs if request is not None else ()), encoded[2])


class RequestsInFlight:
    """One instance's executing requests, by key (see the module)."""

    def __init__(self, label: str, decoupled: bool) -> None:
        self.label = label
        self.decoupled = decoupled
        self.cancelled: set[Any] = set()  # keys cancelled while executing in this process (the model asks)
        self._keys = itertools.count()
        self._streams: dict[Any, tuple[Any, Arena | None, list]] = {}  # key -> (ResponseStream, arena, input refs)
        self._executing: dict[int, Any] = {}  # id(InferRequest) -> key, while it executes
        self._rescheduled: set[Any] = set()
        self._requeued: set[int] = set()  # ids of requests rescheduled after a lost worker, while they live

    def new_keys(self, count: int) -> list[tuple[int]]:
        return [(next(self._keys),) for _ in range(count)]

    def track(self, keys: list, requests: list[InferRequest], refs: list[list], arena: Arena | None,
              cancel: Callable[[Any], object]) -> None:
        """``requests`` begin executing under ``keys``; a decoupled one's inputs (``refs`` in ``arena``) stay
        until its final response, and cancelling its stream calls ``cancel(key)``."""
        for key, request, request_refs in zip(keys, requests, refs, strict=True):
            self._executing[id(request)] = key
            if self.decoupled and request.stream is not None:
                self._streams[key] = (request.stream, arena, request_refs)
                request.stream.on_cancel = lambda key=key: cancel(key)
                if request.stream.cancelled:  # asked before it reached the worker
                    cancel(key)

    def untrack(self, requests: list[InferRequest]) -> None:
        for request in requests:
            self._executing.pop(id(request), None)

    def key_of(self, request: InferRequest) -> Any:
        """The key ``request`` executes under, None once it is not executing."""
        return self._executing.get(id(request))

    def collect(self, worker: WorkerLink, keys: list, refs: list[list], answer: Any,
                requests: list[InferRequest]) -> list[RequestResult]:
        """A worker's answer to a batch as the scheduler takes it; inputs freed unless a stream still needs them."""
        if answer is None:  # a decoupled execute returned: responses come through the streams
            return self.decoupled_results(keys)
        arena, streams = worker.arena, self._streams
        results = []
        for key, request_refs, encoded, request in zip(keys, refs, answer, requests, strict=True):
            result = borrowed(encoded, worker, request)
            if key in streams:
                results.append(self.result(key, result))
            else:
                arena.free(request_refs)
                results.append(to_result(result))
        return results

    def result(self, key: Any, result: Result | None) -> RequestResult:
        converted = to_result(result)
        if key in self._streams and converted is not RESCHEDULE:  # a decoupled model that raised
            self.deliver(key, StreamItem(cast(ModelOutputs | ServingError, converted), True))
        return converted

    def decoupled_results(self, keys: list) -> list[RequestResult]:
        """After a decoupled execute returned: each request is done (its responses follow through its stream),
        or rescheduled (it runs again later, under a new key)."""
        results: list[RequestResult] = []
        for key in keys:
            if key in self._rescheduled:
                self._rescheduled.discard(key)
                self.forget(key)
                results.append(RESCHEDULE)
            else:
                results.append({})
        return results

    def reschedule(self, key: Any) -> None:
        """The model asked to see this request again in a later batch."""
        self._rescheduled.add(key)

    def failed(self, keys: list, requests: list[InferRequest], error: ServingError,
               begun: int | None = None) -> list[RequestResult]:
        """A batch whose worker was lost: ``error`` for the requests it had begun (all, without ``begun``); the
        others go back to the queue (REQUEUE: they count in no execution), once each (lost with a worker again, they
        fail: a request that takes down every worker it reaches ends).  A decoupled request's stream ends with the
        error."""
        begun = len(requests) if begun is None else begun
        results: list[RequestResult] = []
        for index, (key, request) in enumerate(zip(keys, requests, strict=True)):
            if key in self._streams:
                self.deliver(key, StreamItem(error, True))
                results.append(error)
            elif index >= begun and id(request) not in self._requeued:
                self._requeued.add(id(request))
                weakref.finalize(request, self._requeued.discard, id(request))
                results.append(REQUEUE)  # never reached: it counts in no execution
            else:
                results.append(error)
        return results

    def deliver(self, key: Any, item: StreamItem) -> None:
        entry = self._streams.get(key)
        if entry is None:
            return  # a response after the final one, or for a request already ended: dropped
        if item.final:
            self.forget(key)
        entry[0].put(item)

    def forget(self, key: Any) -> None:
        """A request that has ended (or is rescheduled): free its inputs."""
        entry = self._streams.pop(key, None)
        if entry is not None:
            _, arena, request_refs = entry
            if arena is not None:
                arena.free(request_refs)
        self.cancelled.discard(key)

    def end_streams(self, why: str) -> None:
        for key in list(self._streams):
            self.deliver(key, StreamItem(Unavailable(f"{self.label}: {why}"), True))
