"""runtime/thread_policy.py: every thread, the loop's included, goes under SCHED_BATCH, those started later too."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading

import pytest

from runtime import thread_policy

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's scheduling policies")


def _policy(thread: int = 0) -> int:
    return os.sched_getscheduler(thread)


def test_every_thread_is_batched_the_loops_too_and_later_ones_join():
    async def main() -> None:
        started = threading.Event()
        finish = threading.Event()
        seen: dict[str, int] = {}

        def helper(name: str) -> None:
            seen[name] = threading.get_native_id()
            started.set()
            finish.wait()

        early, late = threading.Thread(target=helper, args=("early",)), None
        early.start()
        started.wait()
        task = thread_policy.batch_threads(interval=0.05)
        assert task is not None and thread_policy.threads_batched()
        try:
            assert _policy(seen["early"]) == os.SCHED_BATCH
            assert _policy() == os.SCHED_BATCH  # the loop's own thread too
            started.clear()
            late = threading.Thread(target=helper, args=("late",))  # started by the loop's thread: it inherits
            late.start()
            started.wait()
            assert _policy(seen["late"]) == os.SCHED_BATCH
            os.sched_setscheduler(seen["late"], os.SCHED_OTHER, os.sched_param(0))  # as a library might set it
            deadline = asyncio.get_running_loop().time() + 0.05 * thread_policy.RESCAN_BACKOFF * 2
            while _policy(seen["late"]) != os.SCHED_BATCH:  # a rescan, however far they have backed off
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.sleep(0)  # its done callbacks
            assert not thread_policy.threads_batched()  # the rescans ended: nothing more is batched
            finish.set()
            early.join()
            if late is not None:
                late.join()

    failures: list[BaseException] = []

    def run() -> None:  # its own thread
        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - raised in the test below
            failures.append(exc)

    before = {thread: _policy(thread) for thread in _threads()}
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    for other, policy in before.items():  # pytest's threads as they were: the servers later tests start inherit
        with contextlib.suppress(ProcessLookupError):
            os.sched_setscheduler(other, policy, os.sched_param(0))
    if failures:
        raise failures[0]


def _threads() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc/self/task")]


def test_a_thread_can_batch_itself_and_what_it_starts_inherits_it():
    policies: list[int] = []

    def child() -> None:
        policies.append(_policy())

    def parent() -> None:
        assert thread_policy.run_as_batch()
        policies.append(_policy())
        inner = threading.Thread(target=child)
        inner.start()
        inner.join()

    thread = threading.Thread(target=parent)
    thread.start()
    thread.join()
    assert policies == [os.SCHED_BATCH, os.SCHED_BATCH]
