"""The container-function lifecycle: cold start from S3, hot reload, explicit control, warm-up, idle exit."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_models import build_add_sub_onnx
from tests.conftest import ONNX_ADD_SUB_CONFIG, S3_ENV, VERSION_PYTHON
from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, python_model_source, write_model


def _served_version(client: httpclient.InferenceServerClient, model: str = "versioned") -> int:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    return int(client.infer(model, [tensor]).as_numpy("OUT")[0])


def _wait_until(predicate, timeout: float = 30.0, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


def _index(client) -> dict[tuple[str, str], dict]:
    return {(r["name"], r.get("version", "")): r for r in client.get_model_repository_index()}


class LoadLoop:
    """A client that keeps sending requests on its own thread, counting failures."""

    def __init__(self, url: str, model: str = "versioned") -> None:
        self.url, self.model = url, model
        self.versions: list[int] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url)
        while not self._stop.is_set():
            try:
                self.versions.append(_served_version(client, self.model))
            except Exception as exc:  # noqa: BLE001 - every failure is recorded and asserted on
                self.failures.append(str(exc))
        client.close()

    def __enter__(self) -> LoadLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)


# -- hot reload of a local repository (poll mode, watchdog) ----------------------------------------------

@pytest.fixture
def poll_server(tmp_path):
    repository = tmp_path / "models"
    write_model(repository, "versioned", IDENTITY_PYTHON_CONFIG, {"1/model.py": VERSION_PYTHON})
    process = ServerProcess(repository, "--model-control-mode", "poll", "--poll-interval", "1").start()
    yield process, repository
    assert process.stop() == 0, process.log()


def test_new_version_takes_traffic_with_zero_failed_requests(poll_server):
    process, repository = poll_server
    client = httpclient.InferenceServerClient(process.http_url)
    assert _served_version(client) == 1
    with LoadLoop(process.http_url) as load:
        _wait_until(lambda: len(load.versions) > 20)
        (repository / "versioned" / "2").mkdir()
        (repository / "versioned" / "2" / "model.py").write_text(VERSION_PYTHON)
        _wait_until(lambda: load.versions and load.versions[-1] == 2)
        time.sleep(0.5)
    assert load.failures == []
    switch = load.versions.index(2)
    assert set(load.versions[:switch]) == {1} and set(load.versions[switch:]) == {2}
    _wait_until(lambda: ("versioned", "1") not in _index(client) or _index(client)[("versioned", "1")]["state"]
                != "READY")
    _wait_until(lambda: "unloaded model 'versioned' version 1" in process.log())


def test_broken_new_version_leaves_the_old_one_serving(poll_server):
    process, repository = poll_server
    client = httpclient.InferenceServerClient(process.http_url)
    with LoadLoop(process.http_url) as load:
        (repository / "versioned" / "5").mkdir()
        (repository / "versioned" / "5" / "model.py").write_text("raise ImportError('broken build')\n")
        _wait_until(lambda: _index(client).get(("versioned", "5"), {}).get("state") == "UNAVAILABLE")
        time.sleep(0.5)
    assert load.failures == []
    assert set(load.versions) == {1}
    assert "broken build" in _index(client)[("versioned", "5")]["reason"]
    assert client.is_model_ready("versioned", "1")


def test_config_change_reloads_and_a_removed_model_unloads(poll_server):
    process, repository = poll_server
    client = httpclient.InferenceServerClient(process.http_url)
    write_model(repository, "second", IDENTITY_PYTHON_CONFIG, {"1/model.py": VERSION_PYTHON})
    _wait_until(lambda: client.is_model_ready("second"))
    config = repository / "versioned" / "config.pbtxt"
    config.write_text(config.read_text() + 'parameters { key: "k" value { string_value: "v" } }\n')
    _wait_until(lambda: client.get_model_config("versioned").get("parameters", {}).get("k") == {"string_value": "v"})
    shutil.rmtree(repository / "second")
    _wait_until(lambda: not client.is_model_ready("second"))
    with pytest.raises(InferenceServerException) as info:
        _served_version(client, "second")
    assert info.value.status() == "404"
    assert client.is_model_ready("versioned")


def test_load_and_unload_are_refused_outside_explicit_mode(poll_server):
    process, _ = poll_server
    client = httpclient.InferenceServerClient(process.http_url)
    with pytest.raises(InferenceServerException) as info:
        client.unload_model("versioned")
    assert info.value.status() == "503"  # Triton's answer (and words), whatever the mode
    assert "explicit model load / unload is not allowed if polling is enabled" in info.value.message()
    assert client.is_model_ready("versioned")


# -- explicit model control -------------------------------------------------------------------------------

@pytest.fixture
def explicit_server(tmp_path):
    repository = tmp_path / "models"
    write_model(repository, "versioned", IDENTITY_PYTHON_CONFIG, {"1/model.py": VERSION_PYTHON})
    write_model(repository, "later", IDENTITY_PYTHON_CONFIG, {"1/model.py": VERSION_PYTHON})
    process = ServerProcess(repository, "--model-control-mode", "explicit", "--load-model", "*").start()
    yield process, repository
    assert process.stop() == 0, process.log()


def test_explicit_load_and_unload_over_http(explicit_server):
    process, repository = explicit_server
    client = httpclient.InferenceServerClient(process.http_url)
    assert client.is_model_ready("versioned")
    client.unload_model("versioned")
    assert not client.is_model_ready("versioned")
    assert _index(client)[("versioned", "1")] == {"name": "versioned", "version": "1", "state": "UNAVAILABLE",
                                                  "reason": "unloaded"}  # as Triton lists it
    with pytest.raises(InferenceServerException) as info:
        _served_version(client)
    assert info.value.status() == "404"  # as Triton: no available versions
    (repository / "versioned" / "2").mkdir()
    (repository / "versioned" / "2" / "model.py").write_text(VERSION_PYTHON)
    time.sleep(0.5)
    assert not client.is_model_ready("versioned")  # nothing loads on its own in explicit mode
    client.load_model("versioned")
    assert client.is_model_ready("versioned")
    assert _served_version(client) == 2


def test_explicit_load_errors(explicit_server):
    process, repository = explicit_server
    client = httpclient.InferenceServerClient(process.http_url)
    for name, fragment in [("no_such_model", "failed to load 'no_such_model', failed to poll from model repository"),
                           ("..", "invalid model name")]:
        with pytest.raises(InferenceServerException) as info:
            client.load_model(name)
        assert info.value.status() in ("400", "404")
        assert fragment in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.load_model("versioned", config="{not json")
    assert info.value.status() == "400"
    assert "the 'config' parameter is not a valid model config" in info.value.message()
    with pytest.raises(InferenceServerException) as info:  # model files never come from a request
        client.load_model("versioned", files={"file:1/model.py": b"import os"})
    assert info.value.status() == "400"
    assert "not accepted" in info.value.message()
    config = json.dumps({"backend": "python", "max_batch_size": 0,
                         "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "parameters": {"from_override": {"string_value": "yes"}}})
    client.load_model("versioned", config=config)
    assert client.get_model_config("versioned")["parameters"]["from_override"]["string_value"] == "yes"
    (repository / "later" / "2").mkdir()
    (repository / "later" / "2" / "model.py").write_text("import not_a_module\n")
    with pytest.raises(InferenceServerException) as info:
        client.load_model("later")
    assert "not_a_module" in info.value.message()
    assert _served_version(client, "later") == 1  # the failed load left version 1 serving


def test_explicit_load_and_unload_over_grpc(explicit_server):
    process, _ = explicit_server
    client = grpcclient.InferenceServerClient(process.grpc_url)
    client.unload_model("later")
    assert not client.is_model_ready("later")
    client.load_model("later")
    assert client.is_model_ready("later")
    with pytest.raises(InferenceServerException) as info:
        client.load_model("missing_model")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    client.close()


def test_unload_during_inference_lets_the_request_finish(tmp_path):
    repository = tmp_path / "models"
    write_model(repository, "slow", IDENTITY_PYTHON_CONFIG, {"1/model.py": python_model_source(
        "time.sleep(1.0)\nreturn [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', "
        "pb_utils.get_input_tensor_by_name(r, 'IN').as_numpy())]) for r in requests]")})
    with ServerProcess(repository, "--model-control-mode", "explicit", "--load-model", "slow") as process:
        client = httpclient.InferenceServerClient(process.http_url)
        result: dict = {}

        def call() -> None:
            tensor = httpclient.InferInput("IN", [1], "FP32")
            tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
            result["out"] = httpclient.InferenceServerClient(process.http_url).infer("slow", [tensor]).as_numpy("OUT")

        worker = threading.Thread(target=call)
        worker.start()
        time.sleep(0.3)
        client.unload_model("slow")
        worker.join(10)
        assert result["out"].tolist() == [1.0]
        assert not client.is_model_ready("slow")


# -- warm-up, readiness, idle exit -----------------------------------------------------------------------

WARMUP = """
model_warmup [ {
  name: "zeros" batch_size: 1 count: 3
  inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
} ]
"""


def test_warmup_runs_before_ready_and_a_failing_warmup_keeps_the_model_unavailable(tmp_path):
    repository = tmp_path / "models"
    counter = tmp_path / "warmups.txt"
    write_model(repository, "warm", IDENTITY_PYTHON_CONFIG + WARMUP, {"1/model.py": python_model_source(
        f"open({str(counter)!r}, 'a').write('x')\n"
        "return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', "
        "pb_utils.get_input_tensor_by_name(r, 'IN').as_numpy())]) for r in requests]")})
    write_model(repository, "cold", IDENTITY_PYTHON_CONFIG + WARMUP, {"1/model.py": python_model_source(
        "return [pb_utils.InferenceResponse(error=pb_utils.TritonError('cannot warm up')) for r in requests]")})
    with ServerProcess(repository) as process:
        client = httpclient.InferenceServerClient(process.http_url)
        assert counter.read_text() == "xxx"
        assert client.is_model_ready("warm")
        row = _index(client)[("cold", "1")]
        assert row["state"] == "UNAVAILABLE"
        assert "warmup 'zeros' failed: cannot warm up" in row["reason"]


def test_readiness_is_false_until_the_initial_load_finishes(tmp_path):
    repository = tmp_path / "models"
    write_model(repository, "slow_init", IDENTITY_PYTHON_CONFIG, {"1/model.py": python_model_source("return []")
                .replace("self.args = args", "self.args = args\n        time.sleep(3)")})
    process = ServerProcess(repository).start(wait_ready=False)
    try:
        process.wait_for("/v2/health/live")
        assert httpx.get(f"http://{process.http_url}/v2/health/ready").status_code == 400
        process.wait_for("/v2/health/ready")
        assert httpx.get(f"http://{process.http_url}/v2/models/slow_init/ready").status_code == 200
    finally:
        assert process.stop() == 0


def test_idle_timeout_stops_the_function(tmp_path):
    repository = tmp_path / "models"
    write_model(repository, "versioned", IDENTITY_PYTHON_CONFIG, {"1/model.py": VERSION_PYTHON})
    config = tmp_path / "function.yaml"
    config.write_text("idle_timeout_seconds: 2\n")
    process = ServerProcess(repository, "--config", str(config)).start()
    _served_version(httpclient.InferenceServerClient(process.http_url))
    assert process.process.wait(20) == 0
    assert "idle for" in process.log()


# -- cold start from object storage ---------------------------------------------------------------------

def _upload_folder(s3, bucket: str, folder: Path, prefix: str) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            s3.put_object(Bucket=bucket, Key=f"{prefix}{path.relative_to(folder)}", Body=path.read_bytes())


def _s3_function_yaml(tmp_path: Path, endpoint: str, extra: str = "") -> Path:
    config = tmp_path / "function.yaml"
    config.write_text(
        f"cache_dir: {tmp_path / 'cache'}\n"
        f"storage: {{endpoint_url: '{endpoint}', region: us-east-1, addressing_style: path, max_attempts: 2}}\n"
        + extra
    )
    return config


def test_cold_start_from_s3_and_warm_restart(s3, bucket, moto_endpoint, tmp_path):
    local = tmp_path / "local"
    build_add_sub_onnx(local / "adder" / "1" / "model.onnx", datatype="INT32")
    build_add_sub_onnx(local / "adder" / "2" / "model.onnx", datatype="INT32")
    write_model(local, "adder", ONNX_ADD_SUB_CONFIG)
    write_model(local, "versioned", IDENTITY_PYTHON_CONFIG + "version_policy: { specific { versions: [ 2 ] } }\n",
                {f"{v}/model.py": VERSION_PYTHON for v in (1, 2, 3)})
    _upload_folder(s3, bucket, local, "functions/demo/")
    s3.put_object(Bucket=bucket, Key="functions/demo/evil/config.pbtxt", Body=IDENTITY_PYTHON_CONFIG.encode())
    s3.put_object(Bucket=bucket, Key="functions/demo/evil/1/../../../escape.py", Body=b"x")
    config = _s3_function_yaml(tmp_path, moto_endpoint)

    def start() -> ServerProcess:
        return ServerProcess(Path("unused"), "--config", str(config), env=S3_ENV,
                             log=tmp_path / f"server-{time.monotonic_ns()}.log").with_repository_url(
            f"s3://{bucket}/functions/demo").start()

    process = start()
    try:
        client = httpclient.InferenceServerClient(process.http_url)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        assert client.infer("adder", inputs).as_numpy("OUTPUT0").tolist() == (2 * a).tolist()
        assert _served_version(client) == 2
        index = _index(client)
        assert ("adder", "1") not in index and index[("adder", "2")]["state"] == "READY"
        assert index[("evil", "")]["state"] == "UNAVAILABLE"
        assert "refused object key" in index[("evil", "")]["reason"]
        log = process.log()
        assert "model 'adder': listed 3 objects, 2 selected; downloaded 2 files" in log
        assert "model 'versioned': listed 4 objects, 2 selected; downloaded 2 files" in log
        cached = tmp_path / "cache" / "repository"
        assert sorted(p.name for p in (cached / "versioned").iterdir() if p.name[0] != ".") == ["2", "config.pbtxt"]
        assert not list(tmp_path.rglob("escape.py"))
        assert "testing" not in log  # credentials are never logged
    finally:
        assert process.stop() == 0
    warm = start()
    try:
        assert "model 'adder': listed 3 objects, 2 selected; downloaded 0 files (0 bytes)" in warm.log()
        assert _served_version(httpclient.InferenceServerClient(warm.http_url)) == 2
    finally:
        assert warm.stop() == 0


def test_s3_poll_picks_up_a_new_version(s3, bucket, moto_endpoint, tmp_path):
    local = tmp_path / "local"
    write_model(local, "versioned", IDENTITY_PYTHON_CONFIG, {"1/model.py": VERSION_PYTHON})
    _upload_folder(s3, bucket, local, "repo/")
    config = _s3_function_yaml(tmp_path, moto_endpoint, "model_control: {mode: poll, poll_interval_seconds: 1}\n")
    process = ServerProcess(Path("unused"), "--config", str(config), env=S3_ENV,
                            log=tmp_path / "server.log").with_repository_url(f"s3://{bucket}/repo").start()
    try:
        with LoadLoop(process.http_url) as load:
            _wait_until(lambda: len(load.versions) > 10)
            s3.put_object(Bucket=bucket, Key="repo/versioned/2/model.py", Body=VERSION_PYTHON.encode())
            _wait_until(lambda: load.versions and load.versions[-1] == 2, timeout=30)
        assert load.failures == []
    finally:
        assert process.stop() == 0


def test_unreachable_storage_fails_the_cold_start(tmp_path):
    config = _s3_function_yaml(tmp_path, "http://127.0.0.1:9")
    process = ServerProcess(Path("unused"), "--config", str(config), env=S3_ENV,
                            log=tmp_path / "server.log").with_repository_url("s3://bucket/repo")
    process.start(wait_ready=False)
    assert process.process.wait(60) == 1
    assert "cold start failed: cannot list s3://bucket/repo/" in process.log()
