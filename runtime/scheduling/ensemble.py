"""Ensembles (``platform: "ensemble"``): a model whose requests run a graph of steps, each step a request to
another model through the server (so through that model's own scheduler: its dynamic batching serves ensemble
and direct traffic together).

A step runs as soon as every tensor it reads exists, independent steps concurrently; tensors pass from step to
step as the arrays they are, without copies.  An ensemble has no instances of its own: it is ready while every
model it calls is.  The checks that need the composing models' configs (:func:`check_composing_models`) run when
the ensemble loads, with Triton's words; those of the graph alone are in ``ensemble_config``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.config.ensemble_config import EnsembleStep, composing_models
from runtime.config.spec import ModelSpec, TensorSpec
from runtime.errors import ModelLoadError, ServingError
from runtime.handler import ServerServices
from runtime.scheduling.ensemble_inflight import StepSlots
from runtime.scheduling.stats import ModelStatistics
from runtime.types import InferRequest, InferTensor, ModelOutputs, RequestedOutput, StreamItem

# What Triton's ensembles put in every response (a client of a sequence-less ensemble sees zeros).
RESPONSE_PARAMETERS = {"sequence_id": 0, "sequence_start": False, "sequence_end": False}

SpecLookup = Callable[[str, int], ModelSpec | None]  # (model, version or -1) -> its config, None if not loaded


def check_composing_models(spec: ModelSpec, lookup: SpecLookup) -> ModelSpec:
    """Check an ensemble against the configs of the models its steps call (ModelLoadError, in Triton's words);
    the ensemble's spec as it serves: decoupled when one of its steps is (its config then says so, as Triton's)."""
    name = spec.name
    missing = [model for model in composing_models(spec.steps) if lookup(model, -1) is None]
    if missing:
        raise ModelLoadError(f"ensemble {name} contains models that are not available or ambiguous: "
                             f"{', '.join(missing)}")
    inferred: dict[str, tuple[TensorSpec, ModelSpec]] = {}
    decoupled = spec.decoupled
    for own in (*spec.inputs, *spec.outputs):
        inferred[own.name] = (own, spec)
    for step in spec.steps:
        model = lookup(step.model_name, step.model_version)
        if model is None:
            raise ModelLoadError(f"ensemble '{name}' depends on '{step.model_name}' whose required version "
                                 f"{step.model_version} is not loaded.")
        if spec.max_batch_size > model.max_batch_size:
            raise ModelLoadError(f"ensemble {name} allows maximum batch size {spec.max_batch_size}, but it contains "
                                 f"model {model.name} which only allows maximum batch size to be "
                                 f"{model.max_batch_size}")
        decoupled = decoupled or model.decoupled
        for mapping, find, what in ((step.input_map, model.input, "is mapping to non-existing input"),
                                    (step.output_map, model.output, "is mapped from non-existing output")):
            for model_tensor, tensor in mapping.items():
                declared = find(model_tensor)
                if declared is None:
                    raise ModelLoadError(f"in ensemble {name}, ensemble tensor {tensor} {what} {model_tensor} "
                                         f"in model {model.name}")
                _agree(name, tensor, declared, model, inferred)
    if decoupled and not spec.decoupled:
        spec.proto.model_transaction_policy.decoupled = True
        return dataclasses.replace(spec, decoupled=True)
    return spec


def _agree(ensemble: str, tensor: str, declared: TensorSpec, model: ModelSpec,
           inferred: dict[str, tuple[TensorSpec, ModelSpec]]) -> None:
    """An ensemble tensor must have one datatype and one shape, whichever model reads or writes it."""
    if tensor not in inferred:
        inferred[tensor] = (declared, model)
        return
    first, first_model = inferred[tensor]
    if first.datatype != declared.datatype:
        raise ModelLoadError(f"in ensemble {ensemble}, ensemble tensor {tensor}: inconsistent data type: "
                             f"{_config_type(first)} is inferred from model {first_model.name} while "
                             f"{_config_type(declared)} is inferred from model {model.name}")
    if not (_dims_agree(first.dims, declared.dims)
            or _dims_agree(_full_shape(first, first_model), _full_shape(declared, model))):
        raise ModelLoadError(f"in ensemble {ensemble}, ensemble tensor {tensor}: inconsistent shape: "
                             f"{_shape_text(first, first_model)} is inferred from model {first_model.name} while "
                             f"{_shape_text(declared, model)} is inferred from model {model.name}")


def _dims_agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _config_type(tensor: TensorSpec) -> str:
    return "TYPE_STRING" if tensor.datatype == "BYTES" else f"TYPE_{tensor.datatype}"


def _full_shape(tensor: TensorSpec, model: ModelSpec) -> tuple[int, ...]:
    """A tensor's shape with the batch dimension (-1) of a model that batches."""
    return ((-1,) if model.max_batch_size > 0 else ()) + tuple(tensor.dims)


def _shape_text(tensor: TensorSpec, model: ModelSpec) -> str:
    return "[" + ",".join(str(d) for d in _full_shape(tensor, model)) + "]"


Tensors = dict[str, tuple[str, np.ndarray]]  # ensemble tensor -> (datatype, array)
Emit = Callable[[ModelOutputs], None]


class EnsembleScheduler:
    """Runs each request of an ensemble through its steps (the scheduler role of a :class:`ModelVersion`).

    A decoupled step (any number of responses per request) forks the rest of the graph: each of its responses
    runs the steps after it with that response's tensors, and each branch that completes is one response of
    the ensemble, which is then decoupled too.  As Triton does, the last response carries the final flag.
    """

    def __init__(self, spec: ModelSpec, services: ServerServices, stats: ModelStatistics) -> None:
        self.spec = spec
        self.services = services
        self.stats = stats
        self.slots = StepSlots(spec.name, spec.steps, int(spec.proto.ensemble_scheduling.max_inflight_requests))

    @property
    def pending(self) -> int:
        return 0  # requests never wait: each runs its steps at once

    async def submit(self, request: InferRequest, batch_size: int) -> tuple[Any, int]:
        """Run one request: its outputs (or the error of the step that failed) for a request answered once;
        for a decoupled ensemble the responses go to the request's stream and the result is empty."""
        started = time.perf_counter_ns()
        if request.trace is not None:  # as Triton's ensemble scheduler, which queues the request it is given
            request.trace.event("QUEUE_START", started)
        tensors: Tensors = {t.name: (t.datatype, t.values()) for t in request.inputs}
        answers: list[ModelOutputs] = []
        stream = request.stream
        held: list[ModelOutputs] = []  # a decoupled ensemble's latest response, sent once the next one exists

        def emit(outputs: ModelOutputs) -> None:
            if stream is None:
                answers.append(outputs)
                return
            if held:
                stream.put(StreamItem(held.pop(), False))
            held.append(outputs)

        try:
            await self._branch(request, tensors, list(self.spec.steps), emit)
            if stream is not None:
                stream.put(StreamItem(held.pop() if held else None, True))
                result: Any = ModelOutputs()
            else:
                result = answers[0] if answers else ServingError(
                    f"ensemble '{self.spec.name}' produced no response")
        except ServingError as error:
            result = error
        self.stats.record_execution(batch_size, 0, time.perf_counter_ns() - started, 0, 1)
        return result, 0

    async def _branch(self, request: InferRequest, tensors: Tensors, waiting: list[EnsembleStep], emit: Emit) -> None:
        """Run the ``waiting`` steps as their inputs appear; emit the ensemble's outputs once none is left."""
        running: dict[asyncio.Task, EnsembleStep] = {}
        try:
            while True:
                for step in [s for s in waiting if all(t in tensors for t in s.input_map.values())]:
                    if not self._decoupled(step):
                        waiting.remove(step)
                        running[asyncio.create_task(self._run_step(step, tensors, request))] = step
                if running:
                    done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        running.pop(task)
                        tensors.update(task.result())
                    continue
                forking = [s for s in waiting if all(t in tensors for t in s.input_map.values())]
                if forking:  # every other step that could run has: the rest follows each of its responses
                    waiting.remove(forking[0])
                    await self._fork(request, forking[0], tensors, waiting, emit)
                    return
                if waiting:  # the graph was checked at load: never here
                    raise ServingError(f"ensemble '{self.spec.name}' cannot run its remaining steps")
                emit(ModelOutputs({t.name: tensors[t.name][1] for t in self.spec.outputs if t.name in tensors},
                                  dict(RESPONSE_PARAMETERS)))  # one no step produced is left out (Triton 2.52)
                return
        finally:
            for task in running:
                task.cancel()

    async def _fork(self, request: InferRequest, step: EnsembleStep, tensors: Tensors, waiting: list[EnsembleStep],
                    emit: Emit) -> None:
        """Run a decoupled step; each of its responses continues the graph in a branch of its own."""
        branches: list[asyncio.Task] = []
        try:
            async with self.slots.held(step):  # the step's request is in flight until its last response
                async for item in self.services.infer_stream(self._step_request(step, tensors, request)):
                    if item.error is not None:
                        raise _as_serving_error(item.error)
                    if item.response is not None:
                        produced = {step.output_map[o.name]: (o.datatype, o.data) for o in item.response.outputs
                                    if o.name in step.output_map}
                        branches.append(asyncio.create_task(
                            self._branch(request, tensors | produced, list(waiting), emit)))
            for branch in branches:
                await branch
        finally:
            for branch in branches:
                branch.cancel()

    def _decoupled(self, step: EnsembleStep) -> bool:
        return self.services.is_decoupled(step.model_name, version_text(step))

    def _step_request(self, step: EnsembleStep, tensors: Tensors, request: InferRequest) -> InferRequest:
        inputs = []
        for model_input, tensor in step.input_map.items():
            datatype, array = tensors[tensor]
            inputs.append(InferTensor(model_input, datatype, tuple(int(d) for d in array.shape), array))
        return InferRequest(model_name=step.model_name, model_version=version_text(step), id=request.id,
                            inputs=inputs, outputs=[RequestedOutput(name) for name in step.output_map],
                            parameters=dict(request.parameters), bls_chain=request.bls_chain,
                            caller_execution=request.caller_execution, trace=request.trace, outputs_optional=True)

    async def _run_step(self, step: EnsembleStep, tensors: Tensors, request: InferRequest) -> Tensors:
        async with self.slots.held(step):
            response = await self.services.infer(self._step_request(step, tensors, request))
        return {step.output_map[output.name]: (output.datatype, output.data) for output in response.outputs}

    async def close(self) -> None:
        """Nothing to stop: in-flight requests belong to their callers (drained before an ensemble unloads)."""


def version_text(step: EnsembleStep) -> str:
    """The version a step asks for, as a request names it ("" for the newest)."""
    return "" if step.model_version < 0 else str(step.model_version)


def _as_serving_error(error: Exception) -> ServingError:
    return error if isinstance(error, ServingError) else ServingError(f"{type(error).__name__}: {error}")
