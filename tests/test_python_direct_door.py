"""A Python worker's side door (handlers/python/inbox.py, worker.py; runtime/direct_path.py) given what it cannot
read: a frame that is no message, a string that is not UTF-8, a batch whose tensor does not fit its shape. Each fails
only itself, answered on the door; the worker lives and serves the next request (reliability checklist 36)."""

from __future__ import annotations

import asyncio
import pickle

import numpy as np
import pytest

from handlers.python.transport import recv_direct, send_direct
from runtime.types import InferRequest, InferTensor
from tests.in_process import core
from tests.support import python_model_source, write_model

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""
MODEL = python_model_source("""
return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))])
        for request in requests]
""")
INLINE = -1


def _request(key: int, shape: tuple, data: bytes, request_id: str = "r") -> tuple:
    """A direct batch's request as the lanes write one (runtime/native/lane_request.h)."""
    return (key, [("IN", "FP32", shape, INLINE, 0, len(data), data)], request_id, [], "{}", 0, 0, 0, (), -1)


def _frame(message: tuple, replace: tuple[bytes, bytes] | None = None) -> bytes:
    payload = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    if replace is not None:
        assert payload.count(replace[0]) == 1
        payload = payload.replace(*replace)
    return len(payload).to_bytes(4, "big") + payload


UNREADABLE = {
    "no pickle": b"\x00\x00\x00\x05hello",
    "an id that is not UTF-8": _frame(("direct", 7, [_request(-7, (2,), bytes(8), "IDID")], False),
                                      (b"IDID", b"\xff\xfe\xfd\xfc")),
    "a message of the wrong form": _frame(("direct", 7)),
    "a cancellation of the wrong form": _frame(("cancel",)),
}


@pytest.mark.parametrize("what", [*UNREADABLE, "a tensor that does not fit its shape"])
def test_what_the_worker_cannot_read_fails_itself_and_the_worker_serves_on(tmp_path, what):
    write_model(tmp_path / "models", "door", CONFIG, {"1/model.py": MODEL})

    async def pid(service) -> int:
        request = InferRequest(model_name="door", inputs=[InferTensor("IN", "FP32", (2,), None, raw=bytes(8))])
        return int((await service.infer(request)).outputs[0].data[0])

    async def scenario() -> None:
        async with core(tmp_path / "models") as service:
            before = await pid(service)
            (direct,) = service.direct_models()
            fd = direct.channel.socket_fd
            if what in UNREADABLE:
                frame = UNREADABLE[what]
                expected_id, words = 0, "the request could not be read"
            else:
                frame = b""
                send_direct(fd, ("direct", 9, [_request(-9, (3,), bytes(8))], False))  # 8 bytes for 3 floats
                expected_id, words = 9, "the batch could not be read: ValueError"
            if frame:
                await asyncio.to_thread(lambda: __import__("os").write(fd, frame))
            _, batch_id, (result,) = await asyncio.wait_for(asyncio.to_thread(recv_direct, fd), 10)
            assert batch_id == expected_id
            assert result[0] == "error" and result[1].startswith(words), result
            assert await pid(service) == before  # the same worker

    asyncio.run(scenario())


def test_a_batch_that_cannot_be_read_fails_each_of_its_requests(tmp_path):
    write_model(tmp_path / "models", "door", CONFIG, {"1/model.py": MODEL})

    async def scenario() -> None:
        async with core(tmp_path / "models") as service:
            (direct,) = service.direct_models()
            fd = direct.channel.socket_fd
            good = np.ones(2, np.float32).tobytes()
            send_direct(fd, ("direct", 11, [_request(-11, (2,), good), _request(-12, (5,), good)], False))
            _, batch_id, results = await asyncio.wait_for(asyncio.to_thread(recv_direct, fd), 10)
            assert batch_id == 11 and len(results) == 2
            assert all(result[0] == "error" for result in results)

    asyncio.run(scenario())
