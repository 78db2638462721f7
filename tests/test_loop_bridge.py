"""runtime/grpc/loop_bridge.py: coroutines run on a loop for threads that wait for them."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from runtime.grpc.loop_bridge import LoopBridge


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


async def _on_loop_thread(value: int) -> tuple[int, int]:
    await asyncio.sleep(0)
    return value, threading.get_ident()


def test_results_come_back_to_each_caller_computed_on_the_loop(loop):
    bridge = LoopBridge(loop)
    loop_thread = bridge.run(_on_loop_thread(0))[1]
    assert loop_thread != threading.get_ident()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda value: bridge.run(_on_loop_thread(value)), range(400)))
    assert [value for value, _ in results] == list(range(400))
    assert {thread for _, thread in results} == {loop_thread}


def test_an_exception_is_raised_in_the_caller(loop):
    async def fail() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        LoopBridge(loop).run(fail())


def test_cancel_stops_a_running_coroutine_and_the_caller_sees_it(loop):
    bridge = LoopBridge(loop)
    stopped = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    call = bridge.submit(forever())
    time.sleep(0.05)
    bridge.cancel(call)
    with pytest.raises(asyncio.CancelledError):
        bridge.wait(call)
    assert stopped.wait(5)


def test_cancel_before_the_loop_started_it_never_runs_it(loop):
    bridge = LoopBridge(loop)
    ran = threading.Event()
    gate = threading.Event()
    loop.call_soon_threadsafe(gate.wait, 5)  # the loop is busy while the call is queued and cancelled

    async def mark() -> None:
        ran.set()

    call = bridge.submit(mark())
    bridge.cancel(call)
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        bridge.wait(call)
    assert not ran.is_set()


def test_cancel_after_the_end_changes_nothing(loop):
    bridge = LoopBridge(loop)
    call = bridge.submit(_on_loop_thread(7))
    assert bridge.wait(call)[0] == 7
    bridge.cancel(call)
    assert call.ended and call.error is None


def test_a_closed_loop_answers_cancelled_instead_of_hanging():
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(asyncio.CancelledError):
        LoopBridge(loop).run(_on_loop_thread(1))
