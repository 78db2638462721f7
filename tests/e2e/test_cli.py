"""`bootstrap check`, `bootstrap sync` and the platform's `$PORT`, run as users run them (subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bootstrap.settings import SettingsError, parse_settings
from examples.build_models import build_add_sub_onnx
from tests.conftest import ONNX_ADD_SUB_CONFIG, S3_ENV
from tests.support import IDENTITY_PYTHON_CONFIG, ROOT, ServerProcess, free_port, python_model_source, write_model

IDENTITY = python_model_source(
    "return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', pb_utils.get_input_tensor_by_name(r, 'IN')"
    ".as_numpy())]) for r in requests]")


def bootstrap(*arguments: str, cwd: Path = ROOT, env: dict[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bootstrap.cli", *arguments], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def good_repository(root: Path) -> Path:
    build_add_sub_onnx(root / "add_sub" / "1" / "model.onnx", datatype="INT32")
    write_model(root, "add_sub", ONNX_ADD_SUB_CONFIG)
    write_model(root, "identity", IDENTITY_PYTHON_CONFIG, {"1/model.py": IDENTITY, "2/model.py": IDENTITY})
    write_model(root, "pipeline", """
        platform: "ensemble"
        input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
        ensemble_scheduling { step [ { model_name: "identity" model_version: -1
            input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "Y" } } ] }
    """)
    (root / "pipeline" / "1").mkdir()
    return root


def test_check_passes_a_good_repository(tmp_path):
    repository = good_repository(tmp_path / "models")
    result = bootstrap("check", "--model-repository", str(repository), "--device", "cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[:4] for line in lines[:-1]] == [
        ["ok", "add_sub", "version", "1"], ["ok", "identity", "version", "2"], ["ok", "pipeline", "version", "1"]]
    assert lines[-1] == "3 model(s), 3 version(s) ready, 0 failed"


def test_check_reports_every_broken_model_and_exits_1(tmp_path):
    repository = good_repository(tmp_path / "models")
    write_model(repository, "bad_config", 'platform: "onnxruntime_onnx"\nmax_batch_size: {\n')
    (write_model(repository, "missing_file", ONNX_ADD_SUB_CONFIG) / "1").mkdir()
    write_model(repository, "import_error", IDENTITY_PYTHON_CONFIG, {"1/model.py": "import no_such_module_here\n"})
    write_model(repository, "bad_ensemble", """
        platform: "ensemble"
        input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
        ensemble_scheduling { step [ { model_name: "not_a_model" model_version: -1
            input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "Y" } } ] }
    """)
    (repository / "bad_ensemble" / "1").mkdir()
    result = bootstrap("check", "--model-repository", str(repository), "--device", "cpu", "--json", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    rows = {row["name"]: row for row in report["models"]}
    assert {name for name, row in rows.items() if row["state"] == "READY"} == {"add_sub", "identity", "pipeline"}
    assert "config.pbtxt" in rows["bad_config"]["reason"]
    assert "model.onnx" in rows["missing_file"]["reason"]
    assert "no_such_module_here" in rows["import_error"]["reason"]
    assert "not_a_model" in rows["bad_ensemble"]["reason"]
    text = bootstrap("check", "--model-repository", str(repository), "--device", "cpu", cwd=tmp_path)
    assert text.returncode == 1
    assert text.stdout.splitlines()[-1] == "7 model(s), 3 version(s) ready, 4 failed"
    assert any(line.startswith("FAIL import_error") and "no_such_module_here" in line
               for line in text.stdout.splitlines())


def test_check_of_a_missing_folder_exits_2(tmp_path):
    result = bootstrap("check", "--model-repository", str(tmp_path / "nope"), cwd=tmp_path)
    assert result.returncode == 2
    assert "is not a folder" in result.stderr


def storage_config(tmp_path: Path, endpoint: str, cache: Path) -> Path:
    config = tmp_path / "function.yaml"
    config.write_text(f"cache_dir: {cache}\nstorage: {{endpoint_url: '{endpoint}', region: us-east-1, "
                      "addressing_style: path}\n")
    return config


def upload(s3, bucket: str, folder: Path, prefix: str = "repo/") -> None:
    """Upload a local repository as a console or `aws s3 cp --recursive` plus folder creation would: an empty
    folder (an ensemble's version) becomes a placeholder key ending in '/'."""
    for path in sorted(folder.rglob("*")):
        key = prefix + path.relative_to(folder).as_posix()
        if path.is_file() and "__pycache__" not in path.parts:
            s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
        elif path.is_dir() and not any(path.iterdir()):
            s3.put_object(Bucket=bucket, Key=key + "/", Body=b"")


def test_sync_fills_the_cache_so_that_run_downloads_nothing(s3, moto_endpoint, bucket, tmp_path):
    upload(s3, bucket, good_repository(tmp_path / "models"))
    cache = tmp_path / "cache"
    config = storage_config(tmp_path, moto_endpoint, cache)
    result = bootstrap("sync", "--config", str(config), "--model-repository", f"s3://{bucket}/repo", env=S3_ENV,
                       cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"into {cache / 'repository'}" in result.stdout
    assert sorted(p.name for p in (cache / "repository").iterdir() if not p.name.startswith(".")) == [
        "add_sub", "identity", "pipeline"]
    assert not (cache / "repository" / "identity" / "1").exists()  # only the version the policy selects
    assert "model 'identity': listed 3 objects, 2 selected; downloaded 2 files" in result.stderr

    check = bootstrap("check", "--config", str(config), "--model-repository", f"s3://{bucket}/repo", "--device",
                      "cpu", env=S3_ENV, cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "downloaded 0 files (0 bytes)" in check.stderr and "downloaded 1 files" not in check.stderr

    process = ServerProcess(Path("unused"), "--config", str(config), env=S3_ENV, log=tmp_path / "server.log")
    with process.with_repository_url(f"s3://{bucket}/repo"):
        assert httpx.get(f"http://{process.http_url}/v2/models/pipeline/ready").status_code == 200
    assert process.log().count("downloaded 0 files (0 bytes)") == 3


def test_sync_failures_exit_1_and_a_local_repository_exits_2(s3, moto_endpoint, bucket, tmp_path):
    s3.put_object(Bucket=bucket, Key="repo/broken/config.pbtxt", Body=b"max_batch_size: {")
    s3.put_object(Bucket=bucket, Key="repo/broken/1/model.py", Body=b"")
    config = storage_config(tmp_path, moto_endpoint, tmp_path / "cache")
    result = bootstrap("sync", "--config", str(config), "--model-repository", f"s3://{bucket}/repo", env=S3_ENV,
                       cwd=tmp_path)
    assert result.returncode == 1
    assert "FAIL broken:" in result.stdout
    missing = bootstrap("sync", "--config", str(config), "--model-repository", f"s3://no-such-bucket-{bucket}/r",
                        env=S3_ENV, cwd=tmp_path)
    assert missing.returncode == 1 and "NoSuchBucket" in missing.stderr
    local = bootstrap("sync", "--model-repository", str(tmp_path), cwd=tmp_path)
    assert local.returncode == 2 and "nothing to sync" in local.stderr


def test_the_platform_port_sets_the_http_port_unless_configured(tmp_path, monkeypatch):
    monkeypatch.setenv("PORT", "8080")
    assert parse_settings({}, tmp_path).http_port == 8080
    assert parse_settings({"server": {"http_port": 9000}}, tmp_path).http_port == 9000
    assert parse_settings({"server": {"http_port": None}}, tmp_path).http_port is None
    monkeypatch.setenv("PORT", "eighty")
    with pytest.raises(SettingsError, match=r"\$PORT must be a port number"):
        parse_settings({}, tmp_path)
    monkeypatch.delenv("PORT")
    assert parse_settings({}, tmp_path).http_port == 8000


def test_a_server_started_with_only_port_set_serves_http_there(tmp_path):
    repository = tmp_path / "models"
    write_model(repository, "identity", IDENTITY_PYTHON_CONFIG, {"1/model.py": IDENTITY})
    port = free_port()
    process = ServerProcess(repository, env={"PORT": str(port)}, log=tmp_path / "server.log")
    process.http_port = port
    process.command = lambda: [sys.executable, "-m", "bootstrap.cli", "run", "--model-repository", str(repository),
                               "--host", "127.0.0.1", "--grpc-port", str(process.grpc_port), "--metrics-port",
                               str(process.metrics_port)]
    process.start(cwd=tmp_path)  # no function.yaml there: $PORT decides
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/v2/models/identity/ready").status_code == 200
    finally:
        assert process.stop() == 0
    assert f"HTTP endpoint on 127.0.0.1:{port}" in process.log()


def test_sync_as_kserve_storage_initializer_then_serve_the_destination(s3, moto_endpoint, bucket, tmp_path):
    """KServe runs the initializer as `<command> <storageUri> /mnt/models`; the model server then reads
    /mnt/models/repository (deploy/kserve)."""
    upload(s3, bucket, good_repository(tmp_path / "models"))
    destination = tmp_path / "mnt-models"
    env = {**S3_ENV, "AWS_ENDPOINT_URL": moto_endpoint}  # the endpoint, as the AWS tools read it from the env
    config = tmp_path / "function.yaml"
    config.write_text("storage: {addressing_style: path}\n")
    result = bootstrap("sync", "--config", str(config), f"s3://{bucket}/repo", str(destination), env=env,
                       cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    check = bootstrap("check", "--model-repository", str(destination / "repository"), "--device", "cpu",
                      cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.splitlines()[-1] == "3 model(s), 3 version(s) ready, 0 failed"


def test_the_region_comes_from_the_environment_when_not_configured(tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "cn-hangzhou")
    assert parse_settings({}, tmp_path).storage.region == "cn-hangzhou"
    assert parse_settings({"storage": {"region": "us-west-2"}}, tmp_path).storage.region == "us-west-2"


def test_tritons_server_flags_are_taken_as_triton_spells_them(tmp_path):
    repository = tmp_path / "models"
    write_model(repository, "identity", IDENTITY_PYTHON_CONFIG, {"1/model.py": IDENTITY})
    flags = ["--model-namespacing", "true", "--model-load-thread-count", "2", "--rate-limit", "off",
             "--trace-config", "rate=10", "--http-restricted-api", "logging:admin=yes",
             "--grpc-restricted-protocol", "logging:admin=yes"]
    with ServerProcess(repository, *flags) as process:
        assert httpx.get(f"http://{process.http_url}/v2/models/identity/ready").status_code == 200
        assert httpx.get(f"http://{process.http_url}/v2/trace/setting").json()["trace_rate"] == "10"
        assert httpx.get(f"http://{process.http_url}/v2/logging").status_code == 403
    for bad in (["--trace-config", "rate=x"], ["--rate-limit-resource", "R"], ["--http-restricted-api", "x:y=z"]):
        result = subprocess.run([sys.executable, "-m", "bootstrap.cli", "run", "--model-repository", str(repository),
                                 "--rate-limit", "execution_count", *bad], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2 and "invalid settings" in result.stderr, (bad, result.stderr)
