"""Real Triton beside our server, both on one Python-backend repository (see models.py).

The oracle (nvidia-pytriton's tritonserver) is prepared by scripts/triton_oracle.sh; set CONFORMANCE=skip to
leave the suite out where PyPI cannot be reached (CI never does).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm

from tests.conformance.cases import SHM_INPUT_KEY, SHM_OUTPUT_KEY, A, B
from tests.conformance.models import build_repository
from tests.conformance.servers import Pair, start_pair


def pytest_collection_modifyitems(config, items):
    if os.environ.get("CONFORMANCE") == "skip":
        skip = pytest.mark.skip(reason="CONFORMANCE=skip")
        for item in items:
            if "conformance" in str(item.fspath):
                item.add_marker(skip)


def shared_memory_regions() -> list:
    """The POSIX shared-memory objects the shared-memory cases register (inputs A and B, room for an output)."""
    inputs = shm.create_shared_memory_region("conformance-in", SHM_INPUT_KEY, 32)
    shm.set_shared_memory_region(inputs, [np.asarray(A, np.float32), np.asarray(B, np.float32)])
    return [inputs, shm.create_shared_memory_region("conformance-out", SHM_OUTPUT_KEY, 64)]


CACHE_BYTES = 1 << 20  # the response cache both servers run (the 'cached' model uses it)


@pytest.fixture(scope="session")
def repository(tmp_path_factory):
    return build_repository(tmp_path_factory.mktemp("conformance") / "models")


@pytest.fixture(scope="session")
def pair(repository, tmp_path_factory) -> Pair:
    servers = start_pair(repository, tmp_path_factory.mktemp("pair"), (f"--cache-config=local,size={CACHE_BYTES}",),
                         ("--cache-config", f"local,size={CACHE_BYTES}"))
    regions = shared_memory_regions()
    yield servers
    servers.stop()
    for region in regions:
        shm.destroy_shared_memory_region(region)
