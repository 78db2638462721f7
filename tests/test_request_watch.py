"""The request watch in process: a client that leaves cancels a request watched past WATCH_AFTER_SECONDS (never
sooner: an early answer never reads for a disconnect), a body past its deadline is BodyTimeout, a server's own
cancellation stays a cancellation, and the sweep stops when nothing is in flight."""

from __future__ import annotations

import asyncio

import pytest

from runtime.errors import Cancelled
from runtime.http.body import BodyTimeout
from runtime.http.request_watch import WATCH_AFTER_SECONDS, RequestWatch, watch_request

WATCH_AFTER = 0.04
SWEEP = 0.01


def _receive(disconnects: bool = True, reads: list | None = None):
    """An ASGI receive after the body: the client leaves at once (or never), each read counted in ``reads``."""
    async def receive() -> dict:
        if reads is not None:
            reads.append(1)
        if not disconnects:
            await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    return receive


async def _serve(watch: RequestWatch, receive, work, body=None, body_timeout: float = 10.0):
    """A request as the infer route serves one: its body read under the watch (``body()``), then ``work()``."""
    with watch.enter(asyncio.current_task(), receive, body_timeout) as watched:
        if body is not None:
            await body()
        watched.body_read()
        return await work()


def test_an_answer_sooner_than_the_watch_delay_never_reads_for_a_disconnect():
    reads: list = []

    async def scenario() -> None:
        watch = RequestWatch(WATCH_AFTER, SWEEP)
        assert await _serve(watch, _receive(reads=reads), lambda: asyncio.sleep(WATCH_AFTER / 4, "quick")) == "quick"
        assert reads == [] and len(watch) == 0
        await asyncio.sleep(WATCH_AFTER * 2)
        assert reads == []

    asyncio.run(scenario())


def test_work_past_the_watch_delay_is_cancelled_when_the_client_leaves():
    reads: list = []

    async def scenario() -> bool:
        watch = RequestWatch(WATCH_AFTER, SWEEP)
        never = asyncio.get_running_loop().create_future()
        with pytest.raises(Cancelled):
            await _serve(watch, _receive(reads=reads), lambda: never)
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0  # this task carries on, not cancelled
        assert reads == [1] and len(watch) == 0
        await asyncio.sleep(0)
        return never.cancelled()

    assert asyncio.run(scenario())


def test_a_client_that_stays_leaves_the_work_alone():
    async def scenario() -> None:
        watch = RequestWatch(WATCH_AFTER, SWEEP)
        slow = await _serve(watch, _receive(disconnects=False), lambda: asyncio.sleep(WATCH_AFTER * 3, "slow"))
        assert slow == "slow"
        assert len(watch) == 0

    asyncio.run(scenario())


def test_a_body_past_its_deadline_is_a_body_timeout_and_one_in_time_is_not():
    async def scenario() -> None:
        watch = RequestWatch(WATCH_AFTER, SWEEP)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(BodyTimeout):
            await _serve(watch, _receive(), lambda: asyncio.sleep(0), body=asyncio.Event().wait, body_timeout=0.1)
        assert 0.1 <= loop.time() - started < 1.0  # due at 0.1 + a sweep; slack for a loaded machine
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0
        # a body that arrives after the watch delay but before its deadline is served; a client that stays
        assert await _serve(watch, _receive(disconnects=False), lambda: asyncio.sleep(0, "served"),
                            body=lambda: asyncio.sleep(WATCH_AFTER * 2), body_timeout=1.0) == "served"
        assert len(watch) == 0

    asyncio.run(scenario())


def test_a_server_cancel_stays_a_cancel():
    async def scenario() -> None:
        watch = RequestWatch(WATCH_AFTER, SWEEP)
        for delay in (WATCH_AFTER / 4, WATCH_AFTER * 3):  # before and after the watch starts
            serving = asyncio.ensure_future(_serve(watch, _receive(disconnects=False), asyncio.Event().wait))
            await asyncio.sleep(delay)
            serving.cancel()
            with pytest.raises(asyncio.CancelledError):
                await serving
        assert len(watch) == 0

    asyncio.run(scenario())


def test_many_requests_each_answered_once_and_the_sweep_stops_when_none_is_in_flight():
    async def scenario() -> None:
        watch = RequestWatch(WATCH_AFTER, SWEEP)
        results = await asyncio.gather(
            *(_serve(watch, _receive(disconnects=False), lambda i=i: asyncio.sleep(i * 0.002, i)) for i in range(60)))
        assert results == list(range(60)) and len(watch) == 0
        await asyncio.sleep(SWEEP * 3)
        assert not watch.sweeping

    asyncio.run(scenario())


def test_the_running_loops_watch_is_made_once_and_used_by_its_tasks():
    async def scenario() -> None:
        with watch_request(_receive(disconnects=False), 10.0) as first:
            with watch_request(_receive(disconnects=False), 10.0) as second:
                assert first.watch is second.watch and len(first.watch) == 2
        assert len(first.watch) == 0 and first.watch.watch_after == WATCH_AFTER_SECONDS

    asyncio.run(scenario())
