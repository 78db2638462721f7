"""RequestsInFlight in process: keys, a decoupled request's stream, reschedules, cancellation, lost workers."""

from __future__ import annotations

import asyncio

import numpy as np

from handlers.base import REQUEUE, RESCHEDULE
from handlers.python.in_flight import RequestsInFlight
from handlers.python.transport import Arena
from runtime.errors import InternalError, Status
from runtime.types import InferRequest, InferTensor, ModelOutputs, ResponseStream, StreamItem


def _request(loop: asyncio.AbstractEventLoop | None = None) -> InferRequest:
    data = np.zeros((1, 2), dtype=np.float32)
    request = InferRequest(model_name="m", inputs=[InferTensor("IN", "FP32", data.shape, data)])
    request.stream = ResponseStream(loop) if loop is not None else None
    return request


async def _nothing_more(stream: ResponseStream) -> bool:
    try:
        await asyncio.wait_for(stream.get(), 0.05)
    except TimeoutError:
        return True
    return False


def test_a_decoupled_request_keeps_its_inputs_until_its_final_response():
    async def scenario() -> None:
        arena = Arena(1 << 20)
        try:
            in_flight = RequestsInFlight("model 'm' instance 0", decoupled=True)
            request = _request(asyncio.get_running_loop())
            (key,) = in_flight.new_keys(1)
            refs = [arena.write("IN", np.ones(20000, np.float32), "FP32")]
            cancelled = []
            in_flight.track([key], [request], [refs], arena, cancelled.append)
            assert in_flight.key_of(request) == key and arena.in_use() > 0
            request.stream.on_cancel()  # the client went away
            assert cancelled == [key]
            in_flight.untrack([request])  # execute returned: the stream goes on
            assert in_flight.key_of(request) is None
            assert in_flight.decoupled_results([key]) == [{}] and arena.in_use() > 0
            in_flight.deliver(key, StreamItem({"OUT": np.ones(1)}, final=False))
            in_flight.deliver(key, StreamItem(None, final=True))
            assert arena.in_use() == 0  # freed with the final response
            in_flight.deliver(key, StreamItem({"OUT": np.ones(1)}, final=True))  # after the final one: dropped
            await asyncio.sleep(0)
            items = [await request.stream.get(), await request.stream.get()]
            assert [item.final for item in items] == [False, True] and await _nothing_more(request.stream)
        finally:
            arena.close()

    asyncio.run(scenario())


def test_a_rescheduled_request_is_handed_back_and_forgotten():
    async def scenario() -> None:
        in_flight = RequestsInFlight("model 'm' instance 0", decoupled=True)
        request = _request(asyncio.get_running_loop())
        keys = in_flight.new_keys(1)
        in_flight.track(keys, [request], [[]], None, lambda key: None)
        in_flight.reschedule(keys[0])
        assert in_flight.decoupled_results(keys) == [RESCHEDULE]
        in_flight.deliver(keys[0], StreamItem(None, final=True))  # forgotten: nothing reaches the stream
        assert await _nothing_more(request.stream)

    asyncio.run(scenario())


def test_a_lost_worker_ends_every_open_stream_with_the_reason():
    async def scenario() -> None:
        in_flight = RequestsInFlight("model 'm' instance 0", decoupled=True)
        requests = [_request(asyncio.get_running_loop()) for _ in range(2)]
        keys = in_flight.new_keys(2)
        assert keys[0] != keys[1]
        in_flight.track(keys, requests, [[], []], None, lambda key: None)
        in_flight.end_streams("worker process exited with code 3")
        await asyncio.sleep(0)
        for request in requests:
            item = await request.stream.get()
            assert item.final and "instance 0: worker process exited with code 3" in item.outputs.message

    asyncio.run(scenario())


def test_requests_a_lost_worker_never_began_go_back_to_the_queue_once():
    in_flight = RequestsInFlight("model 'm' instance 0", decoupled=False)
    requests = [_request() for _ in range(5)]
    keys = in_flight.new_keys(5)
    error = InternalError("model 'm' instance 0: worker process exited with code 3; it is being restarted")
    # the worker had begun the first two (the second took it down): those fail, the other three are queued again,
    # as never executed (REQUEUE, not the model's RESCHEDULE: they count in no execution)
    assert in_flight.failed(keys, requests, error, begun=2) == [error, error, REQUEUE, REQUEUE, REQUEUE]
    # lost with a worker again (never begun again, say): a request goes back once, then fails
    again = in_flight.new_keys(3)
    assert in_flight.failed(again, requests[2:], error, begun=0) == [error] * 3
    assert in_flight.failed(in_flight.new_keys(2), [_request(), requests[3]], error, begun=0) == [REQUEUE, error]
    assert in_flight.failed(in_flight.new_keys(2), [_request(), _request()], error) == [error, error]  # all begun


def test_results_of_a_model_that_answers_in_turn():
    in_flight = RequestsInFlight("model 'm' instance 0", decoupled=False)
    ok = in_flight.result((0,), ("ok", [("OUT", np.arange(3))], '{"p": 1}'))
    assert isinstance(ok, ModelOutputs) and ok.parameters == {"p": 1}
    error = in_flight.result((1,), ("error", "bad input", Status.INVALID_ARG.value))
    assert error.message == "bad input" and error.status == Status.INVALID_ARG
    failed = in_flight.failed([(2,)], [_request()], InternalError("gone"))
    assert [f.message for f in failed] == ["gone"]
