"""runtime/native/lanes.py at shutdown: an HTTP request a lane took ends with its outcome, or, cut off, with an error;
never left waiting. The lane table here is a stand-in that takes every request: what is under test is the order in
which the Python side takes outcomes and closes, which a real lane reaches only through a race (it is free again a
moment before it hands its outcome over; tests/e2e/test_http_lanes.py's drain test met it)."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

from runtime.direct_path import LaneAnswer
from runtime.errors import Status, Unavailable
from runtime.native.lanes import NativeLanes


class TakingTable:
    """Takes every HTTP request; its outcome comes when the test delivers it (never as the table's event)."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()

    def fileno(self) -> int:
        return self.read_end

    def take(self) -> list:
        return []

    def take_http(self, *request: object) -> bool:
        return True

    def remove(self, lane: object) -> None:
        pass


def _lanes(loop: asyncio.AbstractEventLoop) -> NativeLanes:
    native = SimpleNamespace(LaneTable=TakingTable, HTTP=1)
    return NativeLanes(native=native, service=None, loop=loop, max_error_bytes=1024)  # type: ignore[arg-type]


def _take(lanes: NativeLanes):
    request = lanes.take_http("m", "1", "id", [("IN", "FP32", [1], 4)], ["OUT"], [b"{}" + bytes(4)], 2)
    assert request is not None
    return request


def test_the_drain_waits_for_an_outcome_the_lane_has_not_handed_over_yet():
    async def scenario() -> object:
        loop = asyncio.get_running_loop()
        lanes = _lanes(loop)
        request = _take(lanes)
        assert lanes.busy()  # no lane is busy, but the request has no outcome yet
        loop.call_later(0.05, lanes.http_outcome, (request.token, ("answer", memoryview(b"{}"), 2)))
        await lanes.quiet(5.0)
        lanes.close()
        assert not lanes.busy()
        return request.future.result()

    outcome = asyncio.run(scenario())
    assert isinstance(outcome, LaneAnswer) and bytes(outcome.body) == b"{}"


def test_a_request_cut_off_at_the_deadline_ends_as_unavailable():
    async def scenario() -> object:
        lanes = _lanes(asyncio.get_running_loop())
        request = _take(lanes)
        await lanes.quiet(0.05)
        assert lanes.busy()
        lanes.close()
        return request.future.result()

    outcome = asyncio.run(scenario())
    assert isinstance(outcome, Unavailable) and outcome.status is Status.UNAVAILABLE
