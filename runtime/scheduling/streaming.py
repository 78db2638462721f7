"""Responses as a stream: one per request for a model in default mode, any number for a decoupled model.

A decoupled model (``model_transaction_policy { decoupled: true }``) answers through its requests'
:class:`ResponseStream`, from ``execute`` or from threads it started, until it sends the final flag.  The
request itself still goes through the model's scheduler (queue, batching, statistics); its result only
says that ``execute`` returned.  If the consumer stops reading (the client went away), the stream is
cancelled: a request still queued never runs, a running one sees ``is_cancelled()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from runtime.config.spec import ModelSpec
from runtime.errors import ServingError
from runtime.types import InferRequest, InferResponse, ResponseStream, StreamItem, StreamResponse

BuildResponse = Callable[..., InferResponse]


class StreamedModel(Protocol):
    """What streaming needs of a model version (``runtime.models.model.ModelVersion`` is one)."""

    spec: ModelSpec

    async def infer(self, request: InferRequest, batch_size: int) -> dict[str, np.ndarray]: ...


async def stream_responses(model: StreamedModel, request: InferRequest, batch_size: int, build: BuildResponse,
                           run: Callable[[], Awaitable[Any]] | None = None) -> AsyncIterator[StreamResponse]:
    """Run a validated request on ``model``; ``build(model, request, outputs, complete)`` makes each response.
    ``run``: how a model in default mode answers (the response cache's way, say), instead of ``model.infer``."""
    if not model.spec.decoupled:
        try:
            outputs = await (run() if run is not None else model.infer(request, batch_size))
        except ServingError as exc:
            if not exc.executed:
                raise
            yield StreamResponse(None, exc, True)
            return
        yield StreamResponse(build(model, request, outputs), None, True)
        return
    stream = ResponseStream(asyncio.get_running_loop())
    request.stream = stream
    if request.cancel_asked:  # asked before its stream existed
        stream.cancel()
    execution = asyncio.ensure_future(model.infer(request, batch_size))
    execution.add_done_callback(lambda done: _end_on_failure(done, stream))
    try:
        while True:
            item = await stream.get()
            yield _stream_response(item, model, request, build)
            if item.final:
                return
    finally:
        if not stream.finished:  # the consumer left before the model finished: tell the model
            stream.cancel()
            execution.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await execution


def _end_on_failure(execution: asyncio.Future, stream: ResponseStream) -> None:
    """A request that failed before or while executing ends its stream with that error (unless the model had
    already sent its final response)."""
    if execution.cancelled():
        return
    error = execution.exception()
    if error is not None:
        stream.put(StreamItem(error, True))


def _stream_response(item: StreamItem, model: StreamedModel, request: InferRequest,
                     build: BuildResponse) -> StreamResponse:
    if isinstance(item.outputs, Exception):
        return StreamResponse(None, item.outputs, item.final)
    if item.outputs is None:
        return StreamResponse(None, None, item.final)
    try:
        return StreamResponse(build(model, request, item.outputs, False), None, item.final)
    except ServingError as exc:
        return StreamResponse(None, exc, item.final)

