"""Triton's generate extension: ``POST /v2/models/{m}/generate`` and ``/generate_stream``.

A request is one JSON object whose members named after the model's inputs are their values (a scalar,
or a flat list); ``parameters`` and ``id`` are the request's.  A response is one JSON object: each output
as a scalar (one element) or a flat list, with ``model_name``, ``model_version`` and ``id``.
``generate`` expects exactly one response; ``generate_stream`` sends every response as a server-sent
event (``data: {...}``), so a decoupled model streams tokens over plain HTTP.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from runtime.api import InferenceApi
from runtime.datatypes import array_from_values, array_to_values
from runtime.errors import InvalidArgument, ServingError
from runtime.extensions.shared_memory import require_no_regions
from runtime.http.body import read_body
from runtime.http.codec import parse_json
from runtime.http.json_data import dumps
from runtime.types import InferRequest, InferTensor, StreamResponse

MAX_GENERATE_BODY_BYTES = 64 << 20
ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that generates "
                "various number of responses")
EVENT_STREAM = "text/event-stream; charset=utf-8"


def _request(service: InferenceApi, name: str, version: str, body: bytes) -> InferRequest:
    message = parse_json(body)
    if not isinstance(message, dict):
        raise InvalidArgument("the generate request must be a JSON object")
    parameters = message.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidArgument("Expected JSON object for keyword: 'parameters'")
    require_no_regions(parameters)
    request_id = message.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("'id' must be a string")
    spec = service.model_config(name, version)
    inputs = []
    for declared in spec.inputs:
        if declared.name not in message:
            continue
        value = message[declared.name]
        if isinstance(value, list) and any(isinstance(item, (list, dict)) for item in value):
            raise InvalidArgument(f"input '{declared.name}': a generate request takes a scalar or a flat list")
        values = value if isinstance(value, list) else [value]
        shape = ([1] if spec.max_batch_size > 0 else []) + [len(values)]
        try:
            data = array_from_values(declared.datatype, shape, values)
        except InvalidArgument as exc:
            raise InvalidArgument(f"input '{declared.name}': {exc.message}") from None
        inputs.append(InferTensor(declared.name, declared.datatype, tuple(shape), data))
    return InferRequest(model_name=name, model_version=version, id=request_id, inputs=inputs,
                        parameters=dict(parameters))


def _event(item: StreamResponse) -> dict[str, Any] | None:
    """One response as the generate extension writes it (None: a bare final flag, which is not sent)."""
    if item.error is not None:
        return {"error": item.error.message if isinstance(item.error, ServingError) else str(item.error)}
    response = item.response
    if response is None:
        return None
    event: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        event["id"] = response.id
    for tensor in response.outputs:
        values = array_to_values(tensor.values(), tensor.datatype)
        event[tensor.name] = values[0] if len(values) == 1 else values
    return dict(sorted(event.items()))


class GenerateEndpoints:
    """The two routes, over the core's stream of responses."""

    def __init__(self, service: InferenceApi, body_timeout: float) -> None:
        self.service = service
        self.body_timeout = body_timeout

    async def _start(self, request: Request) -> AsyncGenerator[StreamResponse, None]:
        name = request.path_params["model_name"]
        version = str(request.path_params.get("model_version", ""))
        await self.service.ensure_model(name, version)
        body = await read_body(request, MAX_GENERATE_BODY_BYTES, self.body_timeout)
        return self.service.infer_stream(_request(self.service, name, version, body))

    async def generate(self, request: Request) -> Response:
        stream = await self._start(request)
        events = []
        try:
            async for item in stream:
                if item.error is not None:
                    raise item.error
                event = _event(item)
                if event is not None:
                    events.append(event)
        finally:
            await stream.aclose()
        if len(events) != 1:
            raise InvalidArgument(ONE_RESPONSE)
        return Response(dumps(events[0]), media_type="application/json")

    async def generate_stream(self, request: Request) -> Response:
        stream = await self._start(request)
        first = await anext(stream, None)  # an error before any response answers with an error status
        status = 400 if first is not None and first.error is not None else 200
        return StreamingResponse(_events(first, stream), status_code=status, media_type=EVENT_STREAM)


async def _events(first: StreamResponse | None,
                  stream: AsyncGenerator[StreamResponse, None]) -> AsyncIterator[bytes]:
    try:
        item = first
        while item is not None:
            event = _event(item)
            if event is not None:
                yield b"data: " + dumps(event) + b"\n\n"
            if item.final:
                return
            item = await anext(stream, None)
    finally:
        await stream.aclose()
