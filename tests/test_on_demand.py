"""runtime/models/on_demand.py in process: one load shared by concurrent first calls, least recently used models
evicted to fit the budget, busy ones kept, the budget's refusal in words that name it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from examples.build_models import build_add_sub_onnx
from runtime.errors import MemoryBudgetExhausted
from runtime.models.memory_ledger import HOST
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
            with pytest.raises(MemoryBudgetExhausted, match="memory budget of 15728640 bytes is held by models in use"):
                await service.infer(_request("m1"))  # waited for room until the load deadline
            assert _loaded(service) == {"m0"}
    asyncio.run(main())


class _Gpu:
    """GPU 0's used memory as NVML would read it: a base, a CUDA context that the first load creates and no unload
    gives back, and ``per_model`` bytes for each loaded model (no GPU on the hosts these tests run on: the real
    device is read in tests/e2e/test_gpu.py)."""

    def __init__(self, service, per_model: int, context: int) -> None:
        self.service, self.per_model, self.context, self.contexts = service, per_model, context, 0

    def __call__(self) -> dict[int, int]:
        loaded = len(_loaded(self.service))
        if loaded:
            self.contexts = self.context
        return {0: 1000 * MIB + self.contexts + loaded * self.per_model}


def test_a_gpu_budget_evicts_by_what_each_load_grew_the_gpu_and_counts_what_unloads_leave_behind(repository):
    async def main():
        settings = OnDemandSettings(gpu_memory_budget=300 * MIB)
        async with core(repository, model_control="on_demand", on_demand=settings) as service:
            loader = service.on_demand
            loader.measure_gpus = _Gpu(service, per_model=100 * MIB, context=50 * MIB)
            loader.ledger.observe_gpus(loader.measure_gpus())  # the baseline, before any load
            for name in ("m0", "m1"):
                await service.infer(_request(name))
                await asyncio.sleep(0.06)
            assert loader.ledger.held_by_model("gpu0") == {"m0": 150 * MIB, "m1": 100 * MIB}  # m0 made the context
            await service.infer(_request("m2"))  # 350 MiB used past the baseline: m0, least recently used, makes way
            assert _loaded(service) == {"m1", "m2"} and loader.counts.unloads["evicted"] == 1
            assert loader.ledger.overhead["gpu0"] == 50 * MIB  # the context m0's unload left
            assert loader.ledger.total("gpu0") == 250 * MIB <= settings.gpu_memory_budget
            await asyncio.sleep(0.06)
            assert loader.ledger.measured["m0"]["gpu0"] == 100 * MIB  # its unload gave back 100 of the 150
            await service.infer(_request("m0"))  # room made before its load: m1 makes way
            assert _loaded(service) == {"m2", "m0"} and loader.counts.unloads["evicted"] == 2
            assert loader.ledger.total("gpu0") == 250 * MIB
            assert loader.ledger.held(HOST) == loader.total()  # the host's books are kept beside the GPU's
    asyncio.run(main())


def test_gpu_memory_held_outside_the_models_is_refused_at_once_naming_the_budget(repository):
    async def main():
        settings = OnDemandSettings(gpu_memory_budget=120 * MIB, load_deadline=30)
        async with core(repository, model_control="on_demand", on_demand=settings) as service:
            loader = service.on_demand
            loader.measure_gpus = gpu = _Gpu(service, per_model=100 * MIB, context=50 * MIB)
            loader.ledger.observe_gpus(gpu())
            await service.infer(_request("m0"))  # 150 MiB: over, but nothing else to unload
            await asyncio.sleep(0.06)
            await service.infer(_request("m1"))  # m0 (150 MiB) makes way; m1 then holds 100 of the 150 used
            assert _loaded(service) == {"m1"}
            await asyncio.sleep(0.06)
            started = asyncio.get_running_loop().time()
            with pytest.raises(MemoryBudgetExhausted, match=r"GPU 0 memory budget of 125829120 bytes has 73400320 "
                                                            r"bytes left, the rest held outside the models"):
                await service.infer(_request("m0"))  # 100 MiB (its unload gave back 100 of the 150 its load took)
            assert _loaded(service) == {"m1"}  # not unloaded in vain: the context alone leaves 70 MiB
            assert asyncio.get_running_loop().time() - started < 5  # refused at once, not at the load deadline
    asyncio.run(main())


def test_an_unknown_name_is_answered_from_the_index_read_again_at_most_once_a_second(repository):
    """A miss never lists the repository itself: a folder added is found once the index is read again (in a
    thread, at most once a second), and one removed is still known until then."""
    from runtime.errors import NotFound

    async def main():
        async with core(repository, model_control="on_demand", on_demand=OnDemandSettings()) as service:
            write_model(repository, "late", ONNX_ADD_SUB_CONFIG)
            build_add_sub_onnx(repository / "late" / "1" / "model.onnx", datatype="INT32")
            (repository / "m3").rename(repository.parent / "m3-gone")
            for _ in range(200):  # misses within the second: the index answers, the folder is not read
                with pytest.raises(NotFound):
                    await service.infer(_request("late"))
            assert service.on_demand.knows("m3")
            await asyncio.sleep(1.1)
            with pytest.raises(NotFound):
                await service.infer(_request("late"))  # stale: this miss has the index read again
            for _ in range(100):
                await asyncio.sleep(0.01)
                if service.on_demand.knows("late"):
                    break
            assert (await service.infer(_request("late"))).outputs[0].data.tolist() == [[2] * 16]
            assert not service.on_demand.knows("m3")
    asyncio.run(main())
