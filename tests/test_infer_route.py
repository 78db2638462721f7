"""The infer route's ASGI edges in process: the body as received, the watch for a client that leaves."""

from __future__ import annotations

import asyncio

import pytest

from runtime.errors import Cancelled, ResourceExhausted
from runtime.http.body import BodyTimeout, receive_asgi_body
from runtime.http.infer_route import WATCH_AFTER_SECONDS, unless_disconnected


def _receiving(*messages: dict, then_wait: bool = True):
    """An ASGI receive that gives ``messages`` in turn, then waits for ever (or disconnects)."""
    queue = list(messages)

    async def receive() -> dict:
        if queue:
            return queue.pop(0)
        if then_wait:
            await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    return receive


def _body(chunk: bytes, more: bool = False) -> dict:
    return {"type": "http.request", "body": chunk, "more_body": more}


def test_the_body_arrives_in_its_chunks_and_is_bounded():
    chunks = asyncio.run(receive_asgi_body(_receiving(_body(b"ab", True), _body(b""), then_wait=True), "2", 10, 1))
    assert chunks == [b"ab"]
    with pytest.raises(ResourceExhausted):
        asyncio.run(receive_asgi_body(_receiving(_body(b"x" * 6, True), _body(b"x" * 6)), None, 10, 1))
    with pytest.raises(ResourceExhausted):  # refused on its declared length, before anything is read
        asyncio.run(receive_asgi_body(_receiving(), "11", 10, 1))


def test_a_body_of_declared_length_is_complete_without_the_closing_message():
    """granian sends an empty closing message after the data: waiting for it cost a hand-off per request."""
    assert asyncio.run(receive_asgi_body(_receiving(_body(b"ab", True)), "2", 10, 0.2)) == [b"ab"]
    assert asyncio.run(receive_asgi_body(_receiving(), "0", 10, 0.2)) == []  # nothing to read
    with pytest.raises(BodyTimeout):  # short of its length: still waits for the rest
        asyncio.run(receive_asgi_body(_receiving(_body(b"a", True)), "2", 10, 0.05))


def test_a_body_that_stops_arriving_or_whose_client_leaves_is_refused():
    with pytest.raises(BodyTimeout):
        asyncio.run(receive_asgi_body(_receiving(_body(b"a", True)), None, 10, 0.05))
    with pytest.raises(Cancelled):
        asyncio.run(receive_asgi_body(_receiving(_body(b"a", True), then_wait=False), None, 10, 1))


def test_work_is_cancelled_when_the_client_leaves():
    async def scenario() -> bool:
        never = asyncio.get_running_loop().create_future()
        with pytest.raises(Cancelled):
            await unless_disconnected(_receiving(then_wait=False), never)
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0  # this task carries on, not cancelled
        await asyncio.sleep(0)
        return never.cancelled()

    assert asyncio.run(scenario())


def test_finished_work_is_returned_and_a_server_cancel_stays_a_cancel():
    async def finished() -> str:
        await asyncio.sleep(0)
        return "answer"

    async def scenario() -> None:
        assert await unless_disconnected(_receiving(), finished()) == "answer"
        waiting = asyncio.ensure_future(unless_disconnected(_receiving(), asyncio.Event().wait()))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(scenario())


def test_an_answer_sooner_than_the_watch_delay_never_reads_for_a_disconnect():
    """The watch costs a task and a receive per request: work done within WATCH_AFTER_SECONDS goes without it, and
    work that takes longer is watched (a client leaving then cancels it)."""
    reads = 0

    async def counting_receive() -> dict:
        nonlocal reads
        reads += 1
        return {"type": "http.disconnect"}

    async def scenario() -> None:
        assert await unless_disconnected(counting_receive, asyncio.sleep(WATCH_AFTER_SECONDS / 5, "quick")) == "quick"
        assert reads == 0
        with pytest.raises(Cancelled):
            await unless_disconnected(counting_receive, asyncio.sleep(WATCH_AFTER_SECONDS * 20))
        assert reads == 1

    asyncio.run(scenario())
