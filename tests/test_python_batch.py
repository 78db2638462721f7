"""handlers/python/batch.py in process, with a real worker: requests handed over together (a model without dynamic
batching) whose worker is lost; those it never began go back to the queue and are served by the next worker."""

from __future__ import annotations

import asyncio

import numpy as np

from runtime.errors import ServingError
from runtime.types import InferRequest, InferTensor
from tests.in_process import core
from tests.support import python_model_source, write_model

# Each request alone, as Triton runs a model without dynamic batching; a negative input takes the worker down, and
# a large one holds it, so that the next requests queue behind it.
MODEL = python_model_source("""
if len(requests) != 1:
    raise pb_utils.TritonModelException(f"{len(requests)} requests in one execute")
data = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
if data.min() < 0:
    os._exit(3)
time.sleep(0.003 if data.min() >= 100 else 0.0002)
return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data * 2)])]
""")
CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def _request(value: float) -> InferRequest:
    data = np.full((1, 3), value, dtype=np.float32)
    return InferRequest(model_name="fragile", inputs=[InferTensor("IN", "FP32", data.shape, None, raw=data.tobytes())])


async def _outcome(service, value: float) -> str:
    try:
        response = await service.infer(_request(value))
    except ServingError as exc:
        return exc.message
    return "right" if np.array_equal(response.outputs[0].data, np.full((1, 3), value * 2, np.float32)) else "wrong"


def test_requests_handed_over_with_one_that_takes_the_worker_down_are_served_after_it(tmp_path):
    write_model(tmp_path / "models", "fragile", CONFIG, {"1/model.py": MODEL})

    async def scenario() -> None:
        async with core(tmp_path / "models") as service:
            for value in range(20):  # executions measured fast: queued requests are handed over together
                assert await _outcome(service, value) == "right"
            holding = asyncio.ensure_future(_outcome(service, 100))
            await asyncio.sleep(0.002)  # the worker holds it; what follows queues, the one that kills it first
            queued = [asyncio.ensure_future(_outcome(service, value)) for value in (-1, 1, 2, 3, 4, 5, 6, 7)]
            assert await holding == "right"
            killer, *others = await asyncio.gather(*queued)
            assert "exited with code 3" in killer and "restarted" in killer
            assert others == ["right"] * 7  # handed over with it, never begun: served by the next worker
            assert await _outcome(service, 9) == "right"
            stats = service.model_statistics("fragile")["model_stats"][0]
            # executions: the twenty, the one held, the killer's (lost), the seven's once each (not also in the lost
            # hand-off's: 37 before), the last; the killer's inference failed
            assert (stats["execution_count"], stats["inference_count"]) == (20 + 1 + 1 + 7 + 1, 20 + 1 + 7 + 1)

    asyncio.run(scenario())
