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
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from handlers.base import ServerServices
from runtime.config import ModelSpec, TensorSpec
from runtime.ensemble_config import EnsembleStep, composing_models
from runtime.errors import ModelLoadError, ServingError
from runtime.model import ModelState, ModelVersion
from runtime.stats import ModelStatistics
from runtime.types import InferRequest, InferTensor, ModelOutputs, RequestedOutput

# What Triton's ensembles put in every response (a client of a sequence-less ensemble sees zeros).
RESPONSE_PARAMETERS = {"sequence_id": 0, "sequence_start": False, "sequence_end": False}

SpecLookup = Callable[[str, int], ModelSpec | None]  # (model, version or -1) -> its config, None if not loaded


def check_composing_models(spec: ModelSpec, lookup: SpecLookup) -> None:
    """Check an ensemble against the configs of the models its steps call; ModelLoadError (Triton's words)."""
    name = spec.name
    missing = [model for model in composing_models(spec.steps) if lookup(model, -1) is None]
    if missing:
        raise ModelLoadError(f"ensemble {name} contains models that are not available or ambiguous: "
                             f"{', '.join(missing)}")
    inferred: dict[str, tuple[TensorSpec, ModelSpec]] = {}
    for tensor in (*spec.inputs, *spec.outputs):
        inferred[tensor.name] = (tensor, spec)
    for step in spec.steps:
        model = lookup(step.model_name, step.model_version)
        if model is None:
            raise ModelLoadError(f"ensemble '{name}' depends on '{step.model_name}' whose required version "
                                 f"{step.model_version} is not loaded.")
        if spec.max_batch_size > model.max_batch_size:
            raise ModelLoadError(f"ensemble {name} allows maximum batch size {spec.max_batch_size}, but it contains "
                                 f"model {model.name} which only allows maximum batch size to be "
                                 f"{model.max_batch_size}")
        if model.decoupled:
            raise ModelLoadError(f"ensemble {name} contains model {model.name}, which uses the decoupled "
                                 "transaction policy: not supported in ensembles by this server yet")
        for model_input, tensor in step.input_map.items():
            declared = model.input(model_input)
            if declared is None:
                raise ModelLoadError(f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing "
                                     f"input {model_input} in model {model.name}")
            _agree(name, tensor, declared, model, inferred)
        for model_output, tensor in step.output_map.items():
            declared = model.output(model_output)
            if declared is None:
                raise ModelLoadError(f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing "
                                     f"output {model_output} in model {model.name}")
            _agree(name, tensor, declared, model, inferred)


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
    if not _dims_agree(first.dims, declared.dims):
        raise ModelLoadError(f"in ensemble {ensemble}, ensemble tensor {tensor}: inconsistent shape: "
                             f"{_shape_text(first, first_model)} is inferred from model {first_model.name} while "
                             f"{_shape_text(declared, model)} is inferred from model {model.name}")


def _dims_agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _config_type(tensor: TensorSpec) -> str:
    return "TYPE_STRING" if tensor.datatype == "BYTES" else f"TYPE_{tensor.datatype}"


def _shape_text(tensor: TensorSpec, model: ModelSpec) -> str:
    dims = ([-1] if model.max_batch_size > 0 else []) + list(tensor.dims)
    return "[" + ",".join(str(d) for d in dims) + "]"


class EnsembleScheduler:
    """Runs each request of an ensemble through its steps (the scheduler role of a :class:`ModelVersion`)."""

    def __init__(self, spec: ModelSpec, services: ServerServices, stats: ModelStatistics) -> None:
        self.spec = spec
        self.services = services
        self.stats = stats
        self._running: set[asyncio.Task] = set()

    @property
    def pending(self) -> int:
        return 0  # requests never wait: each runs its steps at once

    async def submit(self, request: InferRequest, batch_size: int) -> tuple[Any, int]:
        """The ensemble's outputs for one request (or the error of the step that failed); nothing is queued."""
        started = time.perf_counter_ns()
        tensors: dict[str, tuple[str, np.ndarray]] = {t.name: (t.datatype, t.data) for t in request.inputs}
        waiting = list(self.spec.steps)
        running: dict[asyncio.Task, EnsembleStep] = {}
        try:
            while waiting or running:
                for step in [s for s in waiting if all(t in tensors for t in s.input_map.values())]:
                    waiting.remove(step)
                    running[asyncio.create_task(self._run_step(step, tensors, request))] = step
                if not running:  # the graph was checked at load: never here
                    raise ServingError(f"ensemble '{self.spec.name}' cannot run its remaining steps")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    running.pop(task)
                    tensors.update(task.result())
        except ServingError as error:
            result: Any = error
        else:
            result = ModelOutputs({t.name: tensors[t.name][1] for t in self.spec.outputs}, dict(RESPONSE_PARAMETERS))
        finally:
            for task in running:
                task.cancel()
        self.stats.record_execution(batch_size, 0, time.perf_counter_ns() - started, 0, 1)
        return result, 0

    async def _run_step(self, step: EnsembleStep, tensors: dict[str, tuple[str, np.ndarray]],
                        request: InferRequest) -> dict[str, tuple[str, np.ndarray]]:
        inputs = []
        for model_input, tensor in step.input_map.items():
            datatype, array = tensors[tensor]
            inputs.append(InferTensor(model_input, datatype, tuple(int(d) for d in array.shape), array))
        step_request = InferRequest(
            model_name=step.model_name,
            model_version="" if step.model_version < 0 else str(step.model_version),
            id=request.id,
            inputs=inputs,
            outputs=[RequestedOutput(name) for name in step.output_map],
            parameters=dict(request.parameters),
        )
        response = await self.services.infer(step_request)
        return {step.output_map[output.name]: (output.datatype, output.data) for output in response.outputs}

    async def close(self) -> None:
        """Nothing to stop: in-flight requests belong to their callers (drained before an ensemble unloads)."""


class EnsembleVersion(ModelVersion):
    """A loaded version of an ensemble: no instances; ready while every model its steps call is."""

    services: ServerServices | None = None

    def load(self, contexts: list) -> None:
        """Only its label files to read (its composing models were checked before)."""
        try:
            self.load_labels()
        except ModelLoadError as exc:
            self.state, self.reason = ModelState.UNAVAILABLE, str(exc)

    @property
    def loaded(self) -> bool:
        return self.state is not ModelState.UNAVAILABLE

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY and not self._unready_composing()

    def _unready_composing(self) -> list[str]:
        services = self.services
        if services is None:
            return ["(no server)"]
        return [f"{step.model_name}" for step in self.spec.steps
                if not services.model_ready(step.model_name, "" if step.model_version < 0
                                            else str(step.model_version))]

    def status(self) -> tuple[str, str]:
        if self.state is ModelState.READY and (unready := self._unready_composing()):
            return ModelState.UNAVAILABLE.value, f"composing model(s) not ready: {', '.join(unready)}"
        return self.state.value, self.reason

    @property
    def device(self) -> str:
        return "-"

    def start(self) -> None:
        self.scheduler = EnsembleScheduler(self.spec, self.services, self.stats)  # type: ignore[assignment]
        self.state, self.reason = ModelState.READY, ""
