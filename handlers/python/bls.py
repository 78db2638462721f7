"""Business Logic Scripting: requests a Python model sends to other models of this server.

They go through the server's own core (so they meet the same schedulers, batching and validation as
any request) and come back as results: a list for a model in default mode, a stream for a decoupled
one.  An unknown model or a bad request is an error response, never a hang; a call is bounded by its
``timeout`` and by how deep BLS calls nest.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from handlers.base import ServerServices
from handlers.python.runner import Result, error_result
from runtime.datatypes import datatype_of
from runtime.errors import InvalidArgument, ServingError, Status, Unsupported
from runtime.types import InferRequest, InferTensor, RequestedOutput

MAX_DEPTH = 16
# Request parameters the server itself reads; a model sees only the others (as in Triton).
CONTROL_PARAMETERS = frozenset({"timeout", "priority", "sequence_id", "sequence_start", "sequence_end",
                                "binary_data_output"})


def compact_json(parameters: dict[str, Any]) -> str:
    """Parameters as Triton's JSON writer prints them for a model: no spaces, text unescaped."""
    return json.dumps(parameters, separators=(",", ":"), ensure_ascii=False)


def model_parameters(parameters: dict[str, Any]) -> str:
    """The JSON a model's ``request.parameters()`` returns."""
    if not parameters:
        return "{}"
    return compact_json({k: v for k, v in parameters.items() if k not in CONTROL_PARAMETERS})


def core_request(message: dict, inputs: list[tuple[str, np.ndarray]], chain: tuple[str, ...]) -> InferRequest:
    parameters = json.loads(message.get("parameters") or "{}")
    if message.get("timeout"):
        parameters["timeout"] = int(message["timeout"])
    version = message.get("model_version", -1)
    return InferRequest(
        model_name=message["model_name"],
        model_version="" if version in (-1, None, "") else str(version),
        id=message.get("request_id", ""),
        inputs=[InferTensor(name, datatype_of(array), tuple(array.shape), array) for name, array in inputs],
        outputs=[RequestedOutput(name) for name in message.get("outputs", [])],
        parameters=parameters,
        bls_chain=chain,
        caller_execution=int(message.get("execution") or 0),
    )


def _result(response: Any) -> Result:
    outputs = [(tensor.name, tensor.data) for tensor in response.outputs]
    return ("ok", outputs, compact_json(response.parameters or {}))


def _error(exc: Exception) -> Result:
    """A failed BLS call as the calling model sees it: as in Triton, INTERNAL unless the called model itself
    answered with an error of its own code."""
    if isinstance(exc, ServingError):
        return error_result(exc.message, exc.status if exc.executed else Status.INTERNAL)
    return error_result(f"BLS request failed: {type(exc).__name__}: {exc}")


def _refuse_endless(services: ServerServices, chain: tuple[str, ...], target: str, version: str) -> None:
    """Refuse a call that could only wait forever: every instance of its target is already busy waiting on
    this chain of calls (a model calling itself), or the chain is deeper than MAX_DEPTH."""
    caller = chain[-1] if chain else "?"
    if len(chain) > MAX_DEPTH:
        raise InvalidArgument(f"BLS requests nest more than {MAX_DEPTH} deep: does model '{caller}' call itself "
                              "without end?")
    waiting = chain.count(target)
    instances = services.model_config(target, version).instance_count
    if waiting and waiting >= instances:
        raise InvalidArgument(f"model '{caller}' calls model '{target}', whose {instances} instance(s) are all busy "
                              f"waiting on this chain of BLS calls ({' -> '.join(chain)}): it would wait forever")


async def run(services: ServerServices, message: dict, inputs: list[tuple[str, np.ndarray]], decoupled: bool,
              started: Callable[[InferRequest], None] | None = None) -> AsyncIterator[tuple[Result | None, bool]]:
    """Run one BLS request; yields (result, final) pairs (one pair unless the target is decoupled). ``started``
    gets the core's request once it is built (a decoupled call's caller may ask it to stop: ``ask_cancel``)."""
    chain = tuple(message.get("chain", ()))
    timeout = int(message.get("timeout") or 0) / 1e6
    try:
        request = core_request(message, inputs, chain)
        if started is not None:
            started(request)
        _refuse_endless(services, chain, request.model_name, request.model_version)
        if not decoupled and services.is_decoupled(request.model_name, request.model_version):
            raise Unsupported(f"Model {request.model_name} is using the decoupled. The current BLS request call "
                              "doesn't support models using the decoupled transaction policy. Please use "
                              "'decoupled=True' argument to the 'exec' or 'async_exec' calls for decoupled models.")
        if not decoupled:
            response = await asyncio.wait_for(services.infer(request), timeout or None)
            yield _result(response), True
            return
        async with asyncio.timeout(timeout or None):
            async for item in services.infer_stream(request):
                if item.error is not None:
                    yield _error(item.error), item.final
                else:  # a bare final flag comes as an empty response, as in Triton
                    yield (_result(item.response) if item.response is not None else ("ok", [], "{}")), item.final
    except TimeoutError:
        yield error_result(f"BLS request to model '{message.get('model_name')}' timed out", Status.UNAVAILABLE), True
    except Exception as exc:  # noqa: BLE001 - any failure is the calling model's error response
        yield _error(exc), True
