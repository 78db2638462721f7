"""bootstrap/early_sync.py: the cold start's download in a forked child, its note and its outcome told to the
parent, whatever the child's sync does."""

from __future__ import annotations

import os
import threading

import pytest

from bootstrap.early_sync import EarlySync, start_early_sync
from bootstrap.storage import StorageError
from bootstrap.sync import SyncError


def test_the_note_comes_first_then_the_failures_per_model():
    def sync(tell):
        tell(True)
        return {"broken": "no config.pbtxt"}

    early = EarlySync(sync)
    assert early.wait_note() is True
    assert early.outcome() == {"broken": "no config.pbtxt"}


def test_an_outcome_without_a_note_still_arrives():
    early = EarlySync(lambda tell: {})
    assert early.wait_note() is None  # the child told none before its outcome
    assert early.outcome() == {}


@pytest.mark.parametrize(("raised", "expected"), [(StorageError("cannot list s3://b/p: AccessDenied"), StorageError),
                                                  (SyncError("the cache is not private"), SyncError),
                                                  (KeyError("x"), SyncError)])
def test_what_the_childs_sync_raises_is_raised_in_the_parent(raised, expected):
    def sync(tell):
        raise raised

    early = EarlySync(sync)
    with pytest.raises(expected) as caught:
        early.outcome()
    assert str(raised) in str(caught.value)


def test_the_note_asked_after_the_outcome_was_taken_is_what_came():
    for note in (True, None):
        early = EarlySync(lambda tell, note=note: (tell(note) if note is not None else None) or {})
        assert early.outcome() == {}
        assert early.wait_note() is note  # the pipe is closed by now: nothing more is read


def test_a_child_that_dies_without_telling_leaves_the_sync_to_the_parent():
    def sync(tell):
        tell(False)
        os._exit(9)  # as if killed mid-download

    early = EarlySync(sync)
    assert early.wait_note() is False
    assert early.outcome() is None


def test_no_child_is_forked_while_another_thread_runs():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert start_early_sync(lambda tell: {}) is None
    finally:
        stop.set()
        thread.join()
