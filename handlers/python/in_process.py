"""A Python model run in the server process (``isolation: thread``): what its ``pb_utils`` calls reach.

In a worker process these calls travel over the link; here they go straight to the server's services on its event
loop, and responses and cancellation go through the instance's requests in flight.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import triton_python_backend_utils as pb_utils
from handlers.python import bls
from handlers.python.in_flight import RequestsInFlight, stream_item
from handlers.python.runner import BLS_ORIGIN, TRITON_CODE_BY_STATUS, Result, response_result
from runtime.errors import Status


def log_model(model: str, level: str, message: str) -> None:
    levels = {"INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR, "VERBOSE": logging.DEBUG}
    logging.getLogger("model").log(levels.get(level, logging.INFO), "model '%s': %s", model, message)


async def call_service(services: Any, model: str, kind: str, operation: str, arguments: tuple) -> Any:
    """A model's custom-metric or model-control call, on the server's loop."""
    if kind == "metric":
        return services.custom_metric(model, operation, *arguments)
    if operation == "load":
        name, config, files = arguments
        if files:
            raise ValueError("load_model takes models from the repository only: 'files' are not accepted")
        await services.load_model(name, {"config": config} if config else {})
        return None
    if operation == "unload":
        name, dependents = arguments
        await services.unload_model(name, {"unload_dependents": dependents} if dependents else {})
        return None
    if operation == "ready":
        return services.model_ready(*arguments)
    raise ValueError(f"unknown call '{operation}'")


class InProcessHost:
    """The host of a model run in the server process."""

    def __init__(self, model: str, services: Any, in_flight: RequestsInFlight) -> None:
        self.model = model
        self.services = services  # the server's, None where the handler runs without a server
        self.in_flight = in_flight

    def _services(self) -> Any:
        if self.services is None:
            raise pb_utils.TritonModelException("the server offers no such call here")
        return self.services

    def _await(self, coroutine: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._services().loop).result(timeout)

    def infer(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        message = {"model_name": request.model_name(), "model_version": request.model_version(),
                   "outputs": request.requested_output_names(), "request_id": request.request_id(),
                   "parameters": request.parameters(), "timeout": request.timeout(),
                   **BLS_ORIGIN.get().call(self.model)}
        inputs = [(t.name(), t.as_numpy()) for t in request.inputs()]

        async def collect() -> list:
            return [pair async for pair in bls.run(self._services(), message, inputs, decoupled)]

        responses = [_response(result) for result, _ in self._await(collect()) if result is not None]
        return pb_utils.ResponseIterator(iter(responses)) if decoupled else responses[0]  # all came: no cancel

    def send(self, key: Any, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        result = None if response is None else response_result(response, self.model)
        self.in_flight.deliver(key, stream_item(result, flags))

    def is_cancelled(self, key: Any) -> bool:
        return key in self.in_flight.cancelled

    def reschedule(self, key: Any) -> None:
        self.in_flight.reschedule(key)

    def log(self, level: str, message: str) -> None:
        log_model(self.model, level, message)

    def metric(self, operation: str, *arguments: Any) -> Any:
        return self._services().custom_metric(self.model, operation, *arguments)

    def control(self, operation: str, *arguments: Any) -> Any:
        try:
            return self._await(call_service(self._services(), self.model, "control", operation, arguments))
        except Exception as exc:
            raise pb_utils.TritonModelException(str(exc)) from None


def _response(result: Result) -> pb_utils.InferenceResponse:
    if result[0] == "ok":
        return pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in result[1]], parameters=result[2])
    code = TRITON_CODE_BY_STATUS.get(Status(result[2]), pb_utils.TritonError.INTERNAL)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(result[1], code))
