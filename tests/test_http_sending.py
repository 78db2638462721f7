"""The bound on answers being sent (runtime/http/sending.py), in process."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from runtime.errors import Unavailable
from runtime.http.sending import CHUNK_BYTES, UnsentBytes, send_answer


def test_the_bound_refuses_a_new_answer_when_no_sender_is_stalled():
    async def scenario() -> None:
        unsent = UnsentBytes(limit=100)
        first = unsent.admit(60)
        with pytest.raises(Unavailable, match="60 bytes of answers are waiting for clients"):
            unsent.admit(50)  # the first is sending, not stalled: nothing may be cut off
        first.waiting_since = time.monotonic() - 2  # now stalled on a chunk for 2 s
        unsent.admit(50)
        assert first.cut
        unsent.release(first)
        assert unsent.in_use == 50

    asyncio.run(scenario())


def _sent(body: bytes, unsent: UnsentBytes) -> list[dict]:
    messages: list[dict] = []

    async def send(message: dict) -> None:
        messages.append(message)

    asyncio.run(send_answer(send, 200, [(b"content-type", b"application/json")], body, unsent))
    return messages


def test_a_small_answer_goes_in_one_body_message_with_its_length():
    start, body = _sent(b'{"a":1}', UnsentBytes())
    assert start == {"type": "http.response.start", "status": 200,
                     "headers": [(b"content-length", b"7"), (b"content-type", b"application/json")]}
    assert body == {"type": "http.response.body", "body": b'{"a":1}'}


def test_a_large_answer_goes_in_chunks_and_is_released():
    unsent = UnsentBytes()
    payload = bytes(range(256)) * (3 * CHUNK_BYTES // 256 + 10)
    start, *chunks = _sent(payload, unsent)
    assert dict(start["headers"])[b"content-length"] == str(len(payload)).encode()
    assert [len(c["body"]) for c in chunks] == [CHUNK_BYTES] * 3 + [len(payload) - 3 * CHUNK_BYTES]
    assert [c["more_body"] for c in chunks] == [True, True, True, False]
    assert b"".join(c["body"] for c in chunks) == payload and unsent.in_use == 0


def test_a_large_answer_past_the_bound_is_a_503():
    start, body = _sent(b"x" * (CHUNK_BYTES + 1), UnsentBytes(limit=CHUNK_BYTES))
    assert start["status"] == 503
    assert body["body"].startswith(b'{"error":"0 bytes of answers are waiting')


def test_an_answer_given_in_parts_is_sent_as_their_join():
    """The parts (a JSON header, tensors read in place) are cut into chunks across their boundaries."""
    header, tensor = b'{"outputs":[]}', np.arange(CHUNK_BYTES // 2, dtype=np.float32)
    parts = [header, memoryview(tensor).cast("B"), b"tail"]
    start, *chunks = _sent(parts, UnsentBytes())
    joined = header + tensor.tobytes() + b"tail"
    assert dict(start["headers"])[b"content-length"] == str(len(joined)).encode()
    assert [len(c["body"]) for c in chunks] == [CHUNK_BYTES, CHUNK_BYTES, len(joined) - 2 * CHUNK_BYTES]
    assert all(type(c["body"]) is bytes for c in chunks) and b"".join(c["body"] for c in chunks) == joined
    small = _sent([header, b"x"], UnsentBytes())
    assert small[1] == {"type": "http.response.body", "body": header + b"x"}
