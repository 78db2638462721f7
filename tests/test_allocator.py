"""runtime/allocator.py's watch of glibc's freed memory: it looks after the server has served, and an idle server is
not woken to look again (each look costs a thread's wake-up)."""

from __future__ import annotations

import asyncio

import pytest

from runtime import allocator

pytestmark = pytest.mark.skipif(allocator.free_held_bytes() is None, reason="glibc's mallinfo2 (2.33 and later)")


def test_a_look_that_found_nothing_is_not_made_again_until_the_server_has_served(monkeypatch):
    looks: list[float] = []
    activity = [1.0]

    def counted() -> int:
        looks.append(activity[0])
        return 0  # nothing held: nothing to give back

    monkeypatch.setattr(allocator, "free_held_bytes", counted)

    async def watch() -> None:
        task = asyncio.ensure_future(allocator.keep_giving_back_free_memory(
            interval=0.01, threshold=1 << 20, last_activity=lambda: activity[0]))
        await asyncio.sleep(0.1)
        assert looks == [1.0, 1.0]  # whether glibc tells at all, then once after the activity: not every interval
        activity[0] = 2.0  # a request served
        deadline = asyncio.get_running_loop().time() + 0.01 * allocator.IDLE_BACKOFF * 4
        while len(looks) < 3:  # at the next check, however far the idle checks have backed off
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)  # and no more looks while nothing else is served
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    looks.clear()
    asyncio.run(watch())
    assert looks == [1.0, 1.0, 2.0]


def test_without_an_activity_signal_it_looks_every_interval(monkeypatch):
    looks: list[int] = []
    monkeypatch.setattr(allocator, "free_held_bytes", lambda: looks.append(0) or 0)

    async def watch() -> None:
        task = asyncio.ensure_future(allocator.keep_giving_back_free_memory(interval=0.01, threshold=1 << 20))
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(watch())
    assert len(looks) >= 4
