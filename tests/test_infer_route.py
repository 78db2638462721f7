"""The infer route's ASGI edges in process: the body as received (the watch for a client that leaves and for the
body's deadline: tests/test_request_watch.py)."""

from __future__ import annotations

import asyncio

import pytest

from runtime.errors import Cancelled, ResourceExhausted
from runtime.http.body import BodyTimeout, receive_asgi_body


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


def test_without_a_timeout_of_its_own_the_body_waits_for_its_caller_to_bound_it():
    async def scenario() -> None:
        reading = asyncio.ensure_future(receive_asgi_body(_receiving(_body(b"a", True)), "2", 10, None))
        await asyncio.sleep(0.1)
        assert not reading.done()  # no deadline of its own
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading

    asyncio.run(scenario())
