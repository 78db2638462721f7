"""The collector paused for a start and resumed after it (runtime/startup_gc.py)."""

from __future__ import annotations

import gc

from runtime.startup_gc import pause_collection, resume_collection


def test_a_paused_collector_resumes_with_what_the_start_built_frozen():
    assert gc.isenabled()
    try:
        pause_collection()
        assert not gc.isenabled()
        built_by_the_start = [[] for _ in range(100)]
        resume_collection()
        assert gc.isenabled()
        assert gc.get_freeze_count() >= len(built_by_the_start)
        assert gc.get_count()[0] < 100  # the young generation starts empty
    finally:
        gc.unfreeze()
        gc.enable()


def test_resuming_a_collector_that_was_never_paused_freezes_nothing():
    before = gc.get_freeze_count()
    resume_collection()
    assert gc.isenabled() and gc.get_freeze_count() == before
