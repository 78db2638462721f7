"""runtime/scheduling/run_placement.py: cheap runs on the loop, slow or large ones in threads, and a model timed
slow in threads re-timed on the loop now and then, that timing replacing the estimate."""

from __future__ import annotations

from runtime.scheduling.run_placement import (
    INLINE_INPUT_BYTES,
    INLINE_SECONDS,
    PROBE_CEILING_SECONDS,
    PROBE_INTERVAL_SECONDS,
    Placement,
    RunPlacement,
)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_unmeasured_large_or_slow_runs_stay_in_threads_and_cheap_ones_run_on_the_loop():
    placement = RunPlacement()
    assert placement.place(16) is Placement.THREAD  # nothing measured yet
    placement.record(INLINE_SECONDS / 4, Placement.THREAD)
    assert placement.place(16) is Placement.LOOP
    assert placement.place(INLINE_INPUT_BYTES + 1) is Placement.THREAD


def test_a_model_timed_slow_in_threads_is_timed_on_the_loop_once_an_interval_and_comes_back_if_cheap():
    clock = _Clock()
    placement = RunPlacement(clock)
    placement.record(INLINE_SECONDS * 3, Placement.THREAD)  # GIL waits in a busy thread, say
    assert placement.place(16) is Placement.THREAD  # no probe before the first interval has passed
    clock.now += PROBE_INTERVAL_SECONDS
    assert placement.place(16) is Placement.PROBE
    assert placement.place(16) is Placement.THREAD  # one probe an interval
    placement.record(INLINE_SECONDS / 5, Placement.PROBE)  # its own time, on the loop: replaces the estimate
    assert placement.run_seconds == INLINE_SECONDS / 5
    assert placement.place(16) is Placement.LOOP


def test_a_model_slower_than_the_ceiling_or_with_large_inputs_is_never_probed():
    clock = _Clock()
    placement = RunPlacement(clock)
    placement.record(PROBE_CEILING_SECONDS, Placement.THREAD)
    clock.now += 10 * PROBE_INTERVAL_SECONDS
    assert placement.place(16) is Placement.THREAD
    placement.run_seconds = INLINE_SECONDS * 2
    assert placement.place(INLINE_INPUT_BYTES + 1) is Placement.THREAD
    assert placement.place(16) is Placement.PROBE  # a large batch did not use up the interval's probe


def test_a_probe_that_measures_slow_keeps_the_model_in_threads():
    clock = _Clock()
    placement = RunPlacement(clock)
    placement.record(INLINE_SECONDS * 2, Placement.THREAD)
    clock.now += PROBE_INTERVAL_SECONDS
    assert placement.place(16) is Placement.PROBE
    placement.record(INLINE_SECONDS * 2, Placement.PROBE)
    assert placement.place(16) is Placement.THREAD
