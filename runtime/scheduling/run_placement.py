"""Where a tensor model's batch runs: on the event loop itself where handing it to a worker thread would cost more
than running it, else in a worker thread.

A CPU tensor model whose executions measure under ``INLINE_SECONDS``, on inputs of at most ``INLINE_INPUT_BYTES``,
runs on the loop (a thread's round trip costs a few tens of µs of CPU and two wake-ups per batch; a tiny ONNX model
runs in about 15 µs). A run timed in a worker thread counts the thread's waits for the GIL too: under load a cheap
model can measure slow there and would then stay in threads for good, every run timed the same way. So a model
measured under ``PROBE_CEILING_SECONDS`` in threads runs one batch on the loop every ``PROBE_INTERVAL_SECONDS``,
where its timing is its own, and that timing replaces the estimate: a cheap model comes back to the loop, a slow one
holds the loop at most that long once in that interval.
"""

from __future__ import annotations

import time
from enum import Enum

INLINE_SECONDS = 100e-6  # a measured execution shorter than this runs on the loop (inputs permitting)
INLINE_INPUT_BYTES = 64 * 1024
PROBE_CEILING_SECONDS = 1e-3  # a model measured slower than this in threads is never timed on the loop
PROBE_INTERVAL_SECONDS = 1.0
_EWMA = 0.2


class Placement(Enum):
    THREAD = "thread"
    LOOP = "loop"
    PROBE = "probe"  # on the loop, to time it there


class RunPlacement:
    """One model version's estimate of its runs, and the placement of each batch from it."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.run_seconds: float | None = None  # EWMA of one execution's own run (no hand-off)
        self.next_probe = clock() + PROBE_INTERVAL_SECONDS

    def place(self, input_bytes: int) -> Placement:
        """Where a batch of ``input_bytes`` of inputs runs (the caller has checked it is a CPU tensor model)."""
        estimate = self.run_seconds
        if estimate is None or input_bytes > INLINE_INPUT_BYTES:
            return Placement.THREAD
        if estimate < INLINE_SECONDS:
            return Placement.LOOP
        if estimate >= PROBE_CEILING_SECONDS:
            return Placement.THREAD
        now = self.clock()
        if now < self.next_probe:
            return Placement.THREAD
        self.next_probe = now + PROBE_INTERVAL_SECONDS
        return Placement.PROBE

    def record(self, seconds: float, placement: Placement) -> None:
        """One run's own time: a probe's replaces the estimate, the others move it."""
        previous = self.run_seconds
        if previous is None or placement is Placement.PROBE:
            self.run_seconds = seconds
        else:
            self.run_seconds = (1 - _EWMA) * previous + _EWMA * seconds
