"""The infer route's ASGI edges in process: the body as received (the watch for a client that leaves and for the
body's deadline: tests/test_request_watch.py), and a large JSON body decoded where it leaves the event loop free."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import orjson
import pytest

from runtime.errors import Cancelled, ResourceExhausted
from runtime.http.body import BodyTimeout, ByteBudget, receive_asgi_body
from runtime.http.codec import decode_infer_request
from runtime.http.infer_route import InferRoute
from runtime.http.sending import UnsentBytes
from tests.in_process import core
from tests.support import JSON_SUM, JSON_SUM_CONFIG, write_model


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


def test_a_large_json_body_is_decoded_off_the_event_loop(tmp_path):
    values = np.random.default_rng(0).random(2_000_000).astype(np.float32)
    body = orjson.dumps({"inputs": [{"name": "IN", "shape": [len(values)], "datatype": "FP32",
                                     "data": values.astype(np.float64)}]}, option=orjson.OPT_SERIALIZE_NUMPY)
    started = time.perf_counter()
    decode_infer_request(body, None, "json_sum", "")
    one_decode = time.perf_counter() - started  # what the loop would stall for, were the body decoded on it

    write_model(tmp_path, "json_sum", JSON_SUM_CONFIG, {"1/model.py": JSON_SUM})

    async def missing_app(scope, receive, send) -> None:
        raise AssertionError("not an infer request")

    scope = {"type": "http", "method": "POST", "path": "/v2/models/json_sum/infer",
             "headers": [(b"content-length", str(len(body)).encode())]}
    step = 1 << 20
    chunks = [_body(body[i : i + step], i + step < len(body)) for i in range(0, len(body), step)]

    async def receive() -> dict:
        await asyncio.sleep(0)  # a chunk at a time, as from a socket
        return chunks.pop(0)

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def slowest_tick(done: asyncio.Event) -> float:
        slowest, last = 0.0, time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.002)
            now = time.perf_counter()
            slowest, last = max(slowest, now - last), now
        return slowest

    async def main() -> float:
        async with core(tmp_path) as service:
            route = InferRoute(missing_app, service, 1 << 30, 60.0, ByteBudget(1 << 30), UnsentBytes())
            done = asyncio.Event()
            ticking = asyncio.create_task(slowest_tick(done))
            await asyncio.sleep(0.01)  # ticking already
            await route(scope, receive, send)
            done.set()
            return await ticking

    slowest = asyncio.run(main())
    assert sent[0]["status"] == 200, sent
    answer = orjson.loads(b"".join(message.get("body", b"") for message in sent[1:]))
    assert answer["outputs"][0]["data"][0] == pytest.approx(values.sum(dtype=np.float64), rel=1e-6)
    assert slowest < one_decode / 2, (slowest, one_decode)
