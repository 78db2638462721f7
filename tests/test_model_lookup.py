"""The loaded models' lookups (runtime/models/lookup.py) in process, through the core's manager: the plain lookup
asked before every request, and the cases it leaves to the full one."""

from __future__ import annotations

import asyncio

import pytest

from runtime.errors import NotFound
from tests.in_process import core
from tests.support import write_add_sub_onnx


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "models"
    write_add_sub_onnx(root, "simple")
    write_add_sub_onnx(root, "versioned", (1, 2, 3), "version_policy: { latest { num_versions: 2 } }\n")
    return root


def test_the_serving_config_is_found_without_asking_readiness(repository):
    async def main():
        async with core(repository, model_control="explicit") as service:
            manager = service.manager
            assert manager.serving_spec("simple") is None  # not loaded
            await service.load_model("simple")
            await service.load_model("versioned")
            assert manager.serving_spec("simple").name == "simple"  # its one version
            assert manager.serving_spec("simple", "1").name == "simple"
            assert manager.serving_spec("versioned", "2").name == "versioned"
            # the plain cases only: several versions with none named, one not in service, a version Triton reads
            # differently ("-1": the newest) or not at all, an unknown model; the full lookup answers those
            for name, version in (("versioned", ""), ("versioned", "1"), ("versioned", "-1"), ("versioned", "2x"),
                                  ("versioned", "9" * 40), ("versioned", "\u0662"), ("nonexistent", "")):
                assert manager.serving_spec(name, version) is None
            assert not service.is_decoupled("versioned") and not service.is_decoupled("versioned", "-1")
            with pytest.raises(NotFound):
                service.is_decoupled("nonexistent")
    asyncio.run(main())
