"""LoopLocal: one object per event loop, made once, the same for every caller on that loop, gone with its loop."""

from __future__ import annotations

import asyncio
import gc
import weakref

from runtime.loop_local import LoopLocal


class _State:
    pass


def test_each_loop_gets_its_own_object_made_once():
    made: list[_State] = []

    def make() -> _State:
        made.append(_State())
        return made[-1]

    local = LoopLocal(make)
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        a = local.get(first)
        assert local.get(first) is a
        b = local.get(second)
        assert b is not a and local.get(second) is b
        assert local.get(first) is a  # back to a loop asked for before: its object, not a new one
        assert made == [a, b]
    finally:
        first.close()
        second.close()


def test_an_object_does_not_keep_its_loop_alive():
    local = LoopLocal(_State)
    loop = asyncio.new_event_loop()
    state = local.get(loop)
    gone = weakref.ref(loop)
    loop.close()
    del loop
    gc.collect()
    assert gone() is None
    later = asyncio.new_event_loop()
    try:
        assert local.get(later) is not state
    finally:
        later.close()
