"""A real server's threads under Linux's SCHED_BATCH, its event loop's (its main thread) and its Python model's
worker too; with ``--batch-scheduled-threads false``, every one of them under the default policy."""

from __future__ import annotations

import os
import time

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, python_model_source, write_model

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's scheduling policies")
IDENTITY = python_model_source(
    'return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")'
    '.as_numpy())]) for r in requests]')


def _policies(pid: int) -> dict[str, set[int]]:
    """The policies of the server's main thread, its other threads, and its Python workers' threads."""
    server = psutil.Process(pid)
    found: dict[str, set[int]] = {"main": set(), "helpers": set(), "workers": set()}
    for process in [server, *server.children(recursive=True)]:
        # a worker is forked by multiprocessing's fork server (the server's child), so it is the server's grandchild
        worker = process.ppid() != pid and "multiprocessing.forkserver" in " ".join(process.cmdline())
        for thread in process.threads():
            kind = "main" if thread.id == pid else "helpers" if process.pid == pid else "workers" if worker else ""
            if kind:
                found[kind].add(os.sched_getscheduler(thread.id))
    return found


@pytest.mark.parametrize("batched", [True, False])
def test_the_loop_its_helpers_and_workers_are_batched(tmp_path, batched):
    repository = tmp_path / "models"
    write_model(repository, "identity", IDENTITY_PYTHON_CONFIG, {"1/model.py": IDENTITY})
    with ServerProcess(repository, "--batch-scheduled-threads", str(batched).lower()) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        tensor = grpcclient.InferInput("IN", [2], "FP32")
        tensor.set_data_from_numpy(np.ones(2, dtype=np.float32))
        assert client.infer("identity", [tensor]).as_numpy("OUT").tolist() == [1.0, 1.0]
        policy = os.SCHED_BATCH if batched else os.SCHED_OTHER
        wanted = {"main": {policy}, "helpers": {policy}, "workers": {policy}}
        deadline = time.monotonic() + 5  # threads that escaped join at the next rescan (1 s)
        while (policies := _policies(server.process.pid)) != wanted and time.monotonic() < deadline:
            time.sleep(0.2)
    assert policies == wanted
