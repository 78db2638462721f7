"""runtime/allocator.py's watch of glibc's freed memory: it looks after the server has served, and an idle server is
not woken to look again (each look costs a thread's wake-up); Python's arenas and frame-stack chunks from the heap."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap

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


# Calls at every depth from 0 to 600, 300 at each: one of the depths sits where a 16 KiB frame-stack chunk ends
# (gh-142183). The page faults the loop costs, in a fresh interpreter, with the arenas from the heap or not.
CHUNK_EDGE_LOOP = textwrap.dedent("""
    import resource, sys
    from runtime import allocator
    if sys.argv[1] == "heap":
        assert allocator.tune_allocator()
    def leaf():
        return 1
    def at_depth(depth):
        if depth:
            return at_depth(depth - 1)
        for _ in range(300):
            leaf()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for depth in range(600):
        at_depth(depth)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _chunk_edge_faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", CHUNK_EDGE_LOOP, mode], capture_output=True, text=True, check=True)
    return int(done.stdout)


@pytest.mark.skipif(not allocator.NATIVE_ARENAS_BUILT, reason="runtime._python_arenas was not built")
def test_calls_at_a_chunk_edge_take_no_fresh_pages_once_arenas_come_from_the_heap():
    heap = _chunk_edge_faults("heap")
    assert heap < 200, heap
    if sys.version_info < (3, 13):  # where CPython maps and unmaps the chunk on each call
        assert _chunk_edge_faults("mapped") > 1000


def test_a_block_mapped_before_the_heap_allocator_is_given_back_to_its_own_allocator():
    """Arenas alive across the switch (this test process made many before) are freed by munmap, not free():
    thousands of objects made before and dropped after, then a collection, and the process goes on."""
    made_before = [[index] * 20 for index in range(200_000)]  # several arenas of small objects
    assert allocator.tune_allocator()
    del made_before
    gc.collect()
    assert sum(len([index] * 20) for index in range(1000)) == 20_000
