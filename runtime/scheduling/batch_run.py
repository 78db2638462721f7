"""One execution of a batch on a tensor model: the requests' inputs concatenated along the batch dimension, one
run, the outputs split back per request (a failing batch is run request by request, so that one bad request does
not fail its neighbours); and the trace timestamps of a batch's traced requests."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from runtime.errors import InternalError, ServingError
from runtime.handler import ExecutionTiming, RequestResult, TensorHandler


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
