"""runtime/models/on_demand.py in process: one load shared by concurrent first calls, least recently used models
evicted to fit the budget, busy ones kept, the budget's refusal in words that name it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from examples.build_models import build_add_sub_onnx
from runtime.errors import Unavailable
from runtime.models.on_demand import OnDemandSettings
from runtime.types import InferRequest, InferTensor
from tests.conftest import ONNX_ADD_SUB_CONFIG
from tests.in_process import core
from tests.support import write_model

MIB = 1 << 20


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "models"
    for index in range(4):
        write_model(root, f"m{index}", ONNX_ADD_SUB_CONFIG)
        build_add_sub_onnx(root / f"m{index}" / "1" / "model.onnx", datatype="INT32")
    return root


def _request(name: str) -> InferRequest:
    data = np.ones((1, 16), dtype=np.int32)
    return InferRequest(name, inputs=[InferTensor(n, "INT32", (1, 16), data) for n in ("INPUT0", "INPUT1")])


def _loaded(service) -> set[str]:
    return {name for name, entry in service.manager.models.items() if entry.ready_versions()}


def _ten_mib_per_model(service):
    """Resident memory as if each loaded model held 10 MiB."""
    return lambda: 10 * MIB * len(_loaded(service))


def test_concurrent_first_calls_share_one_load(repository):
    async def main():
        async with core(repository, model_control="on_demand", on_demand=OnDemandSettings()) as service:
            assert _loaded(service) == set()
            answers = await asyncio.gather(*(service.infer(_request("m0")) for _ in range(10)))
            assert all(a.outputs[0].data.tolist() == [[2] * 16] for a in answers)
            assert service.on_demand.counts.loads == 1 and service.on_demand.counts.cold_calls.count == 10
    asyncio.run(main())


def test_the_least_recently_used_idle_model_makes_room(repository):
    async def main():
        settings = OnDemandSettings(memory_budget=25 * MIB)
        async with core(repository, model_control="on_demand", on_demand=settings) as service:
            service.on_demand.measure = _ten_mib_per_model(service)
            for name in ("m0", "m1", "m0"):  # m1 is now the least recently used
                await service.infer(_request(name))
                await asyncio.sleep(0.06)  # past the grace a just-used model keeps
            await service.infer(_request("m2"))
            assert _loaded(service) == {"m0", "m2"}
            assert service.on_demand.counts.unloads["evicted"] == 1
            assert service.on_demand.total() <= settings.memory_budget
    asyncio.run(main())


def test_nothing_evictable_is_refused_naming_the_budget(repository):
    async def main():
        settings = OnDemandSettings(memory_budget=15 * MIB, load_deadline=0.5)
        async with core(repository, model_control="on_demand", on_demand=settings) as service:
            service.on_demand.measure = _ten_mib_per_model(service)
            await service.infer(_request("m0"))
            settings.always_loaded = ("m0",)  # as if listed from the start: never evicted
            await asyncio.sleep(0.06)
            with pytest.raises(Unavailable, match="memory budget of 15728640 bytes is held by models in use"):
                await service.infer(_request("m1"))  # waited for room until the load deadline
            assert _loaded(service) == {"m0"}
    asyncio.run(main())
