"""Model lifecycle in process (runtime/models: repository, manager, control, versions) through the core's
declared interface: explicit load and unload, version policies, a model that fails to load, and the control modes
that refuse changes. No server, no port."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from runtime.errors import InvalidArgument, NotFound, ServingError, Unavailable
from runtime.types import InferRequest, InferTensor
from tests.in_process import core
from tests.support import write_add_sub_onnx, write_model


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "models"
    write_add_sub_onnx(root, "simple")
    write_add_sub_onnx(root, "versioned", (1, 2, 3), "version_policy: { latest { num_versions: 2 } }\n")
    write_model(root, "broken", 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n', {"1/model.onnx": b"not onnx"})
    return root


def _states(service) -> dict[tuple[str, str], str]:
    return {(row["name"], row.get("version", "")): row.get("state", "") for row in service.repository_index()}


def _add(model: str, version: str = "") -> InferRequest:
    data = np.ones((1, 16), dtype=np.int32)
    return InferRequest(model, model_version=version, inputs=[InferTensor(n, "INT32", (1, 16), data)
                                                        for n in ("INPUT0", "INPUT1")])


def test_explicit_mode_loads_and_unloads_on_request(repository):
    async def main():
        async with core(repository, model_control="explicit") as service:
            assert not service.model_ready("simple")  # explicit mode loads nothing unasked
            with pytest.raises(ServingError):
                await service.infer(_add("simple"))
            await service.load_model("simple")
            assert service.model_ready("simple") and _states(service)[("simple", "1")] == "READY"
            response = await service.infer(_add("simple"))
            assert {t.name: t.data.tolist() for t in response.outputs}["OUTPUT0"] == [[2] * 16]
            await service.unload_model("simple")
            assert not service.model_ready("simple")
            assert _states(service)[("simple", "1")] == "UNAVAILABLE"
    asyncio.run(main())


def test_the_version_policy_decides_which_versions_serve(repository):
    async def main():
        async with core(repository, model_control="explicit") as service:
            await service.load_model("versioned")
            assert [service.model_ready("versioned", v) for v in ("1", "2", "3")] == [False, True, True]
            assert (await service.infer(_add("versioned", "2"))).model_version == "2"
            assert (await service.infer(_add("versioned"))).model_version == "3"  # the newest ready
            with pytest.raises(ServingError):
                await service.infer(_add("versioned", "1"))
    asyncio.run(main())


def test_a_model_that_fails_to_load_says_why_and_the_rest_serve(repository):
    async def main():
        async with core(repository, model_control="explicit") as service:
            with pytest.raises(ServingError) as failed:
                await service.load_model("broken")
            assert "broken" in str(failed.value)
            rows = {row["name"]: row for row in service.repository_index() if row["name"] == "broken"}
            assert rows["broken"]["state"] == "UNAVAILABLE" and rows["broken"]["reason"]
            await service.load_model("simple")
            assert service.model_ready("simple") and not service.model_ready("broken")
    asyncio.run(main())


def test_without_model_control_the_repository_is_fixed(repository):
    async def main():
        async with core(repository) as service:  # mode none: everything loadable loaded at start
            assert service.model_ready("simple") and service.model_ready("versioned")
            assert not service.model_ready("broken")
            with pytest.raises(Unavailable, match="explicit model load / unload is not allowed"):
                await service.unload_model("simple")
            assert service.model_ready("simple")
    asyncio.run(main())


def test_an_unknown_model_is_refused(repository):
    async def main():
        async with core(repository, model_control="explicit") as service:
            with pytest.raises(InvalidArgument, match="failed to load 'nonexistent', failed to poll"):  # as Triton
                await service.load_model("nonexistent")
            with pytest.raises(NotFound):
                service.model_metadata("nonexistent")
    asyncio.run(main())
