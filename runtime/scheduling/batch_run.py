"""One taken batch's run on an instance (:class:`BatchExecution`): on a tensor model, the requests' inputs
concatenated along the batch dimension, one run, the outputs split back per request (a failing batch is run request
by request, so that one bad request does not fail its neighbours); and the trace timestamps of a batch's traced
requests."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import numpy as np

from runtime.config.spec import ModelSpec
from runtime.deadline_wheel import deadline_wheel
from runtime.errors import InternalError, ServingError, Unavailable
from runtime.handler import ExecutionTiming, ModelHandler, RequestResult, TensorHandler
from runtime.scheduling.batch_forming import QueuedRequest
from runtime.scheduling.run_placement import Placement, RunPlacement

logger = logging.getLogger(__name__)


def run_concatenated(instance: TensorHandler, batch: list[Any]) -> list[RequestResult]:
    started = time.perf_counter_ns()
    names = [t.name for t in batch[0].request.inputs]
    inputs = {name: np.concatenate([item.request.input_arrays()[name] for item in batch]) for name in names}
    instance.timing.input_ns += time.perf_counter_ns() - started
    try:
        outputs = instance.run(inputs)
    except ServingError:
        # One bad request must not fail its neighbours: run each alone to isolate it.
        instance.timing = ExecutionTiming()
        return instance.execute([item.request for item in batch])
    splitting = time.perf_counter_ns()
    total = sum(item.batch_size for item in batch)
    results: list[RequestResult] = []
    offset = 0
    for item in batch:
        sliced = {}
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != total:
                error = InternalError(f"output '{name}' has batch dim {array.shape[:1]}, expected {total}")
                return [error] * len(batch)
            sliced[name] = array[offset : offset + item.batch_size]
        results.append(sliced)
        offset += item.batch_size
    instance.timing.output_ns += time.perf_counter_ns() - splitting
    return results


def trace_compute(batch: list[Any], started: int, elapsed: int, timing: ExecutionTiming) -> None:
    """The compute timestamps of the batch's traced requests, from its measured execution."""
    for item in batch:
        trace = item.request.trace
        if trace is not None:
            trace.event("COMPUTE_START", started)
            trace.event("COMPUTE_INPUT_END", started + timing.input_ns)
            trace.event("COMPUTE_OUTPUT_START", started + elapsed - timing.output_ns)
            trace.event("COMPUTE_END", started + elapsed)


class BatchExecution:
    """How a taken batch runs on an instance of one model version: begun on the event loop where the instance can
    (a model in another process), else on the loop or in a worker thread as ``run_placement.py`` decides; one result
    a request, checked; a thread's run past the instance's execute timeout answered at once."""

    def __init__(self, spec: ModelSpec, executor: ThreadPoolExecutor, batching: bool, concatenate: bool) -> None:
        self.spec = spec
        self.executor = executor
        self.batching = batching
        self.concatenate = concatenate
        self.placement = RunPlacement()

    async def run(self, loop: asyncio.AbstractEventLoop, instance: ModelHandler,
                   batch: list[QueuedRequest]) -> list[RequestResult]:
        """One execution of ``batch``: begun on the loop where the instance can (a model in another process), else
        in a worker thread."""
        if not self.concatenate:
            instance.timing = ExecutionTiming()
            requests = [item.request for item in batch]
            separate = self.executions(batch) > 1
            started = instance.start_separate_executions(requests) if separate else instance.start_execute(requests)
            if started is not None:
                return self._checked(await started.results(), len(batch))
        placement = self._place(instance, batch)
        if placement is not Placement.THREAD:
            return self._execute(instance, batch, placement)
        running = loop.run_in_executor(self.executor, self._execute, instance, batch, placement)
        if instance.bounds_own_executions:
            return await running
        timer = deadline_wheel().call_later(instance.execute_timeout,
                                            lambda: self._answer_overdue(instance, batch))
        try:
            return await running
        finally:
            timer.cancel()

    def _answer_overdue(self, instance: ModelHandler, batch: list[QueuedRequest]) -> None:
        """A thread cannot be stopped: the batch's requests get their answer now, and the instance stays held
        (overdue: the model reports it) until the run returns, its results then dropped."""
        error = Unavailable(f"model '{self.spec.name}' execution did not finish within "
                            f"{instance.execute_timeout:g}s; its instance is unavailable until it does")
        logger.error("%s", error.message)
        for item in batch:
            if not item.future.done():
                item.future.set_result(error)

    def _place(self, instance: ModelHandler, batch: list[QueuedRequest]) -> Placement:
        """Where this batch runs: a CPU tensor model's may run on the loop (``run_placement.py``); requests handed
        over together never do (their runs together could hold it long)."""
        if (not isinstance(instance, TensorHandler) or instance.device != "cpu" or self.placement.run_seconds is None
                or self.executions(batch) > 1):
            return Placement.THREAD
        return self.placement.place(sum(getattr(t.data, "nbytes", 0) for item in batch for t in item.request.inputs))

    def executions(self, batch: list[QueuedRequest]) -> int:
        """The executions a taken batch is: one, or without batching one for each of its requests (queued requests
        handed over together, ``batch_forming.py``)."""
        return 1 if self.batching else len(batch)

    def _checked(self, results: list[RequestResult], count: int) -> list[RequestResult]:
        if len(results) != count:
            error = InternalError(f"model '{self.spec.name}' returned {len(results)} results for {count}")
            return [error] * count
        return results

    def _execute(self, instance: ModelHandler, batch: list[QueuedRequest],
                 placement: Placement = Placement.THREAD) -> list[RequestResult]:
        """One execution for the whole batch, or one for each of its requests where they were handed over together
        (in a worker thread, or on the loop: see ``_place``)."""
        requests = [item.request for item in batch]
        instance.timing = ExecutionTiming()
        started = time.perf_counter()
        runs = self.executions(batch)
        if runs > 1:
            results = [result for request in requests for result in self._checked(instance.execute([request]), 1)]
        elif not self.concatenate or len(batch) == 1:
            results = instance.execute(requests)
        else:
            results = run_concatenated(cast(TensorHandler, instance), batch)  # concatenate: a tensor handler
        self.placement.record((time.perf_counter() - started) / runs, placement)
        return self._checked(results, len(requests))
