"""The bound on answers being sent (runtime/http/sending.py), in process."""

from __future__ import annotations

import asyncio
import time

import pytest

from runtime.errors import Unavailable
from runtime.http.sending import UnsentBytes


def test_the_bound_refuses_a_new_answer_when_no_sender_is_stalled():
    async def scenario() -> None:
        unsent = UnsentBytes(limit=100)
        first = unsent.admit(60)
        with pytest.raises(Unavailable, match="60 bytes of answers are waiting for clients"):
            unsent.admit(50)  # the first is sending, not stalled: nothing may be cut off
        first.waiting_since = time.monotonic() - 2  # now stalled on a chunk for 2 s
        unsent.admit(50)
        assert first.cut.is_set()
        unsent.release(first)
        assert unsent.in_use == 50

    asyncio.run(scenario())
