"""runtime/models/memory_ledger.py: host memory as the models' measured sum; a GPU measured whole, what no model
accounts for kept as overhead against its budget; a model's GPU size is what its unload gave back."""

from __future__ import annotations

from runtime.models.memory_ledger import HOST, MemoryLedger, describe, gpu_resource
from runtime.models.on_demand import OnDemandSettings

MIB = 1 << 20


def test_host_memory_is_the_sum_of_what_the_models_measured():
    ledger = MemoryLedger(OnDemandSettings(memory_budget=100 * MIB))
    ledger.record_load("a", {HOST: 40 * MIB})
    ledger.record_load("b", {HOST: 30 * MIB})
    assert ledger.total(HOST) == 70 * MIB and ledger.over() == []
    assert ledger.short({HOST: 40 * MIB}) == [HOST] and ledger.short({HOST: 30 * MIB}) == []
    ledger.record_unload("a")
    assert ledger.total(HOST) == 30 * MIB and ledger.measured["a"] == {HOST: 40 * MIB}  # kept for its next load


def test_a_gpu_grown_beyond_what_its_models_hold_counts_the_rest_as_overhead():
    ledger = MemoryLedger(OnDemandSettings(gpu_memory_budget=500 * MIB))
    ledger.observe_gpus({0: 1000 * MIB, 1: 2000 * MIB})  # the baseline
    ledger.record_load("a", {HOST: MIB, gpu_resource(0): 300 * MIB})
    ledger.observe_gpus({0: 1350 * MIB, 1: 2000 * MIB})  # 50 MiB more than "a" holds: a context, a cache
    assert ledger.overhead == {"gpu0": 50 * MIB, "gpu1": 0}
    assert ledger.total("gpu0") == 350 * MIB and ledger.gpu_indices() == [0, 1]
    assert ledger.short({"gpu0": 200 * MIB}) == ["gpu0"] and ledger.short({"gpu1": 200 * MIB}) == []
    assert ledger.beyond_budget({"gpu1": 600 * MIB}) == "gpu1"
    ledger.record_load("b", {gpu_resource(0): 200 * MIB})
    ledger.observe_gpus({0: 1550 * MIB})
    assert ledger.over() == ["gpu0"]
    assert ledger.held_by_model("gpu0") == {"a": 300 * MIB, "b": 200 * MIB}


def test_what_an_unload_gives_back_is_the_models_gpu_size_from_then_on():
    ledger = MemoryLedger(OnDemandSettings(gpu_memory_budget=500 * MIB))
    ledger.observe_gpus({0: 0})
    ledger.record_load("first", {gpu_resource(0): 800 * MIB})  # its load made the process's CUDA context
    ledger.record_unload("first")
    ledger.record_release("first", {0: 300 * MIB})
    ledger.observe_gpus({0: 500 * MIB})
    assert ledger.measured["first"]["gpu0"] == 300 * MIB and ledger.overhead["gpu0"] == 500 * MIB
    ledger.record_load("first", {gpu_resource(0): 300 * MIB})
    ledger.record_unload("first")
    ledger.record_release("first", {0: 320 * MIB, 1: 50 * MIB})  # it grew after its load, on the GPU it was on
    assert ledger.measured["first"] == {"gpu0": 320 * MIB}


def test_budgets_are_read_when_checked_and_resources_are_named_in_words():
    settings = OnDemandSettings()
    ledger = MemoryLedger(settings)
    ledger.record_load("a", {HOST: 40 * MIB})
    assert ledger.short({HOST: 10**12}) == []  # no budget
    settings.memory_budget = 30 * MIB
    assert ledger.over() == [HOST]
    assert describe(HOST) == "host memory" and describe(gpu_resource(3)) == "GPU 3 memory"
