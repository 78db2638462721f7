"""runtime/idle_timers.py: periodic looks wake at multiples of their interval, so looks of nested intervals share."""

from __future__ import annotations

import pytest

from runtime.idle_timers import aligned_delay


@pytest.mark.parametrize("now", [0.0, 0.3, 1.999, 7.25, 12345.678])
def test_the_wake_up_falls_on_a_multiple_of_the_interval_no_later_than_one_interval(now):
    for interval in (0.25, 1.0, 2.0, 8.0):
        delay = aligned_delay(interval, now)
        assert interval * 0.01 <= delay <= interval * 1.01
        wake = now + delay
        assert abs(wake / interval - round(wake / interval)) < 1e-9


def test_looks_of_nested_intervals_wake_together():
    """A 2 s look and an 8 s one, started at different moments, wake at the same moments (every 8 s)."""
    def wakes(interval: float, start: float) -> set[float]:
        moments, now = set(), start
        while now < 64:
            now += aligned_delay(interval, now)
            moments.add(round(now, 6))
        return moments

    short, long_ = wakes(2.0, 0.37), wakes(8.0, 5.1)
    assert long_ <= short and len(short | long_) == len(short)


def test_a_wake_up_right_before_a_multiple_goes_to_the_next_one():
    assert aligned_delay(2.0, 3.9999) == pytest.approx(2.0001)
    assert aligned_delay(0.0, 5.0) == 0.0
