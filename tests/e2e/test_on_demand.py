"""Model control on_demand against a real server: a 20-model repository (ONNX and Python) under a memory budget
that fits about five Python models, driven by skewed random traffic from several clients; keep-warm unloading;
always-loaded models; a model that fails to load; explicit control beside it; object storage downloading only the
models that are called."""

from __future__ import annotations

import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_models import build_add_sub_onnx
from tests.conftest import ONNX_ADD_SUB_CONFIG, S3_ENV
from tests.e2e.test_cli import storage_config, upload
from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, python_model_source, write_model

IDENTITY = python_model_source(
    'return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")'
    '.as_numpy())]) for r in requests]')
BUDGET = 160 << 20  # about five Python models' workers (27 MiB each here), with the ONNX models


def _repository(root: Path, onnx: int = 10, python: int = 10) -> Path:
    for index in range(onnx):
        write_model(root, f"onnx{index}", ONNX_ADD_SUB_CONFIG)
        build_add_sub_onnx(root / f"onnx{index}" / "1" / "model.onnx", datatype="INT32")
    for index in range(python):
        write_model(root, f"py{index}", IDENTITY_PYTHON_CONFIG, {"1/model.py": IDENTITY})
    return root


def _call(client: httpclient.InferenceServerClient, name: str, value: int) -> bool:
    if name.startswith("onnx"):
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.full((1, 16), value, dtype=np.int32))
        return bool((client.infer(name, inputs).as_numpy("OUTPUT0") == 2 * value).all())
    tensor = httpclient.InferInput("IN", [2], "FP32")
    tensor.set_data_from_numpy(np.full(2, value, dtype=np.float32))
    return bool((client.infer(name, [tensor]).as_numpy("OUT") == value).all())


def _metrics(process: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{process.metrics_port}/metrics").text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("serverless_triton_")}


def test_skewed_traffic_over_twenty_models_stays_within_the_budget(tmp_path):
    repository = _repository(tmp_path / "models")
    with ServerProcess(repository, "--model-control-mode", "on_demand", "--memory-budget-bytes", str(BUDGET),
                       "--keep-warm-seconds", "600") as process:
        assert httpx.get(f"http://{process.http_url}/v2/health/ready").status_code == 200  # nothing loaded yet
        names = [f"py{i}" for i in range(10)] + [f"onnx{i}" for i in range(10)]
        rng = random.Random(7)
        plan = [(names[min(int(rng.expovariate(0.25)), 19)], k) for k in range(400)]
        over_budget: list[float] = []
        stop = threading.Event()

        def watch() -> None:  # what the server holds, sampled while the traffic runs
            while not stop.is_set():
                held = sum(v for k, v in _metrics(process).items() if k.startswith("serverless_triton_model_resident"))
                if held > BUDGET:
                    over_budget.append(held)
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            local = threading.local()

            def one(item: tuple[str, int]) -> bool:
                if not hasattr(local, "client"):
                    local.client = httpclient.InferenceServerClient(process.http_url)
                return _call(local.client, *item)

            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(one, plan))
        finally:
            stop.set()
            watcher.join()
        assert all(answers)  # every request answered, and correctly: none failed by an eviction
        assert over_budget == []
        metrics = _metrics(process)
        assert metrics['serverless_triton_on_demand_unloads{reason="evicted"}'] > 0
        assert metrics["serverless_triton_on_demand_loads"] > 5
        assert metrics["serverless_triton_cold_call_ms_count"] >= metrics["serverless_triton_on_demand_loads"]
        assert metrics["serverless_triton_memory_budget_bytes"] == BUDGET


def test_idle_models_unload_and_always_loaded_ones_stay(tmp_path):
    repository = _repository(tmp_path / "models", onnx=2, python=2)
    with ServerProcess(repository, "--model-control-mode", "on_demand", "--keep-warm-seconds", "1",
                       "--always-load", "onnx0") as process:
        client = httpclient.InferenceServerClient(process.http_url)
        assert client.is_model_ready("onnx0") and not client.is_model_ready("py0")
        index = {row["name"]: row for row in client.get_model_repository_index()}
        assert set(index) == {"onnx0", "onnx1", "py0", "py1"}  # every model of the repository is listed
        assert _call(client, "py0", 3) and client.is_model_ready("py0")
        deadline = time.monotonic() + 15
        while client.is_model_ready("py0") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not client.is_model_ready("py0") and client.is_model_ready("onnx0")
        assert _metrics(process)['serverless_triton_on_demand_unloads{reason="idle"}'] >= 1
        assert _call(client, "py0", 4)  # and back at the next call


def test_a_model_that_fails_to_load_says_why_until_retried(tmp_path):
    repository = _repository(tmp_path / "models", onnx=1, python=0)
    write_model(repository, "broken", IDENTITY_PYTHON_CONFIG, {"1/model.py": "raise ImportError('no such thing')\n"})
    with ServerProcess(repository, "--model-control-mode", "on_demand", "--log-level", "WARNING") as process:
        client = httpclient.InferenceServerClient(process.http_url)
        for _ in range(2):  # the second answer comes from the remembered failure (no second load)
            with pytest.raises(InferenceServerException, match="failed to load on demand.*no such thing"):
                _call(client, "broken", 1)
        assert _call(client, "onnx0", 5)
        with pytest.raises(InferenceServerException, match="unknown model"):
            _call(client, "nonexistent", 1)
        assert process.log().count("model 'broken' version 1 UNAVAILABLE") == 1  # one load, its reason remembered
        client.unload_model("onnx0")  # explicit control works beside on-demand loading
        assert not client.is_model_ready("onnx0")
        client.load_model("onnx0")
        assert client.is_model_ready("onnx0")


def test_a_model_larger_than_the_budget_is_refused_over_both_protocols_naming_it(tmp_path):
    repository = _repository(tmp_path / "models", onnx=1, python=0)
    with ServerProcess(repository, "--model-control-mode", "on_demand", "--memory-budget-bytes", "100") as process:
        body = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
                           for n in ("INPUT0", "INPUT1")]}
        answer = httpx.post(f"http://{process.http_url}/v2/models/onnx0/infer", json=body)
        assert answer.status_code == 503
        assert re.fullmatch(r"model 'onnx0' needs about \d+ bytes, more than the host memory budget of 100 bytes "
                            r"for models", answer.json()["error"])
        with pytest.raises(InferenceServerException, match="host memory budget of 100 bytes") as refused:
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
            grpcclient.InferenceServerClient(process.grpc_url).infer("onnx0", inputs)
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_object_storage_downloads_only_what_is_called(s3, moto_endpoint, bucket, tmp_path):
    upload(s3, bucket, _repository(tmp_path / "models", onnx=3, python=1))
    cache = tmp_path / "cache"
    config = storage_config(tmp_path, moto_endpoint, cache)
    process = ServerProcess(Path("unused"), "--config", str(config), "--model-control-mode", "on_demand", env=S3_ENV,
                            log=tmp_path / "server.log")
    with process.with_repository_url(f"s3://{bucket}/repo"):
        client = httpclient.InferenceServerClient(process.http_url)
        assert {row["name"] for row in client.get_model_repository_index()} == {"onnx0", "onnx1", "onnx2", "py0"}
        assert not (cache / "repository" / "onnx1").exists()
        assert _call(client, "onnx1", 6) and _call(client, "py0", 7)
        synced = sorted(path.name for path in (cache / "repository").iterdir() if not path.name.startswith("."))
        assert synced == ["onnx1", "py0"]
