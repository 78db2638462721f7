"""Readiness as the health endpoints report it: a model version's state, and each instance's own readiness check
where its model has one (a Python model's ``is_ready``), as Triton 2.67-2.68 asks it (core: ``TritonModel::IsReady``
asks every instance; ``InferenceServer::IsReady`` asks every ready model under strict readiness).  Requests are
not held up by it: only the readiness endpoints ask."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from runtime.models.model import ModelVersion


async def version_ready_checked(model_version: ModelVersion) -> bool:
    """Ready, and every instance whose model checks its own readiness answers yes (each within its bound)."""
    if not model_version.ready:
        return False
    checking = [instance for instance in model_version.instances if instance.checks_readiness]
    if not checking:
        return True
    answers = await asyncio.gather(*(asyncio.to_thread(instance.check_ready) for instance in checking))
    return all(answers)


async def all_ready_checked(model_versions: Iterable[ModelVersion]) -> bool:
    """Every one of ``model_versions`` ready as :func:`version_ready_checked` says, asked together."""
    answers = await asyncio.gather(*(version_ready_checked(version) for version in model_versions))
    return all(answers)
