"""runtime/scheduling/idle_watch.py: watchers told whether a model's own queue is idle, now and on each change, and
their holds on the instance asked before a batch runs."""

from __future__ import annotations

from runtime.scheduling.idle_watch import IdleWatch


def _free() -> None:
    return None


def test_watchers_hear_each_change_once():
    queued: list[int] = []
    watch = IdleWatch(lambda: not queued)
    told: list[bool] = []
    stop = watch.watch(told.append, _free)
    assert told == [True]
    queued.append(1)
    watch.busy()
    watch.busy()
    watch.check()  # still queued
    assert told == [True, False]
    queued.clear()
    watch.check()
    watch.check()
    assert told == [True, False, True]
    stop()
    watch.busy()
    assert told == [True, False, True] and not watch.watchers and not watch.holds


def test_a_late_watcher_hears_what_it_is_now():
    watch = IdleWatch(lambda: False)
    told: list[bool] = []
    watch.watch(told.append, _free)
    assert told == [False]


def test_a_hold_on_the_instance_is_what_the_scheduler_awaits():
    watch = IdleWatch(lambda: True)
    assert watch.held() is None
    holding: list = []
    watch.watch(lambda idle: None, _free)
    stop = watch.watch(lambda idle: None, lambda: holding[0] if holding else None)
    assert watch.held() is None
    holding.append(marker := object())
    assert watch.held() is marker
    stop()
    assert watch.held() is None
