"""runtime/grpc/service.py's ModelStreamInfer under ``--grpc-max-response-pool-size`` (Triton 2.57): a request's
responses queued and not yet written are at most the pool's size, the rest waiting for the client; in process, over
a real core and a decoupled Python model sending 10 responses at once."""

from __future__ import annotations

import asyncio

import numpy as np

from runtime.grpc.call_context import ServicerCallContext
from runtime.grpc.service import InferenceServicer
from runtime.protocol import service_pb2
from tests.in_process import core
from tests.support import python_model_source, write_model

MODEL = python_model_source("""
for request in requests:
    sender = request.get_response_sender()
    for index in range(10):
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full(4096, index, np.float32))]))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
return None
""")
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4096 ] } ]
model_transaction_policy { decoupled: true }
"""


async def _one_request():
    request = service_pb2.ModelInferRequest(model_name="many")
    tensor = request.inputs.add(name="IN", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    yield request


async def _held_while_stalled(service, pool: int | None) -> tuple[int, list[float]]:
    """The responses the stream holds (the one given to the client among them) once the client stalls after the
    first; then every response's value."""
    servicer = InferenceServicer(service, max_response_pool=pool)
    stream = servicer.ModelStreamInfer(_one_request(), ServicerCallContext(()))
    first = await stream.__anext__()
    await asyncio.sleep(1.0)  # the model has sent all ten meanwhile
    response_bytes = first.ByteSize()
    held = round(servicer.streams_bytes.used / response_bytes)
    rest = [message async for message in stream]
    values = [np.frombuffer(m.infer_response.raw_output_contents[0], np.float32)[0] for m in [first, *rest]]
    return held, values


def test_a_request_s_queued_responses_are_bounded_by_the_pool(tmp_path):
    write_model(tmp_path / "models", "many", CONFIG, {"1/model.py": MODEL})

    async def scenario() -> None:
        async with core(tmp_path / "models") as service:
            held, values = await _held_while_stalled(service, None)
            assert held == 10 and values == list(range(10))  # unbounded, as Triton's default: all of them held
            held, values = await _held_while_stalled(service, 2)
            assert held <= 2 and values == list(range(10))  # every response still comes, in order

    asyncio.run(scenario())
