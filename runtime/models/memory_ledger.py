"""The books of model control ``on_demand``: what each model it loaded holds, in host memory and on each GPU, against
the budgets (``on_demand.py`` decides what to load and unload; this keeps the accounts).

Host memory is the sum of what each model measured at its load (the process tree's resident memory grew by it). A
GPU is measured whole (NVML): what its used memory grew by since the first reading, less what the models hold, is
overhead, and it counts against that GPU's budget too. A CUDA context stays with its process after the model that
made it is unloaded, and a framework's cache keeps what it freed: memory the device no longer has, whoever holds it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

HOST = "host"


class BudgetSettings(Protocol):
    memory_budget: int  # host memory models may hold (0: no budget)
    gpu_memory_budget: int  # memory the models may hold on each GPU (0: no budget)


def gpu_resource(index: int) -> str:
    """The ledger's name for CUDA device ``index``."""
    return f"gpu{index}"


def gpu_index(resource: str) -> int | None:
    return int(resource[3:]) if resource.startswith("gpu") else None


def describe(resource: str) -> str:
    index = gpu_index(resource)
    return "host memory" if index is None else f"GPU {index} memory"


@dataclass
class ResidentModel:
    held: dict[str, int]  # bytes by resource (HOST, gpu0, ...)
    last_used: float


class MemoryLedger:
    """Resident models, their measured sizes (kept across unloads), and each GPU's overhead."""

    def __init__(self, settings: BudgetSettings) -> None:
        self.settings = settings  # read at each check: the budgets are the settings' current values
        self.resident: dict[str, ResidentModel] = {}
        self.measured: dict[str, dict[str, int]] = {}  # what each model held when it was last loaded
        self.overhead: dict[str, int] = {}  # by GPU resource: growth since the first reading no model accounts for
        self._gpu_baseline: dict[str, int] = {}

    def budget(self, resource: str) -> int:
        return self.settings.memory_budget if resource == HOST else self.settings.gpu_memory_budget

    def held(self, resource: str) -> int:
        return sum(model.held.get(resource, 0) for model in self.resident.values())

    def total(self, resource: str = HOST) -> int:
        """What counts against ``resource``'s budget: the models' measured sizes, and its overhead."""
        return self.held(resource) + self.overhead.get(resource, 0)

    def gpu_indices(self) -> list[int]:
        """The GPUs read or held so far, by CUDA device number."""
        gpus = {*self._gpu_baseline, *(r for model in self.resident.values() for r in model.held)} - {HOST}
        return sorted(index for index in map(gpu_index, gpus) if index is not None)

    def observe_gpus(self, used: dict[int, int]) -> None:
        """A reading of every GPU's used bytes (the first one is the baseline): what has grown since the baseline
        beyond what the models hold becomes that GPU's overhead."""
        for index, value in used.items():
            resource = gpu_resource(index)
            baseline = self._gpu_baseline.setdefault(resource, value)
            self.overhead[resource] = max(0, value - baseline - self.held(resource))

    def record_load(self, name: str, held: dict[str, int]) -> None:
        self.measured[name] = dict(held)
        self.resident[name] = ResidentModel(dict(held), time.monotonic())

    def record_unload(self, name: str) -> None:
        self.resident.pop(name, None)

    def record_release(self, name: str, released: dict[int, int]) -> None:
        """What each GPU's used memory fell by when ``name`` was unloaded, taken as its size there from now on:
        less than its load grew it by where that load made a CUDA context that stays behind (its next load will not
        make it again), more where it grew after its load (kernels loaded and buffers taken at its first calls)."""
        measured = self.measured.get(name, {})
        for index, amount in released.items():
            resource = gpu_resource(index)
            if amount > 0 and resource in measured:
                measured[resource] = amount

    def touch(self, name: str) -> None:
        model = self.resident.get(name)
        if model is not None:
            model.last_used = time.monotonic()

    def beyond_budget(self, needed: dict[str, int]) -> str | None:
        """A resource whose budget ``needed`` passes on its own, if any: no unload can make room for it."""
        return next((r for r, amount in needed.items() if self.budget(r) and amount > self.budget(r)), None)

    def short(self, needed: dict[str, int]) -> list[str]:
        """The resources whose budget a load of ``needed`` bytes would pass now."""
        return [r for r, amount in needed.items()
                if amount and self.budget(r) and self.total(r) + amount > self.budget(r)]

    def over(self) -> list[str]:
        """The resources over their budget now (a model held more than estimated, or overhead grew)."""
        resources = [HOST, *map(gpu_resource, self.gpu_indices())]
        return [r for r in resources if self.budget(r) and self.total(r) > self.budget(r)]

    def held_by_model(self, resource: str) -> dict[str, int]:
        return {name: model.held[resource] for name, model in self.resident.items() if resource in model.held}
