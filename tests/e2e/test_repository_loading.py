"""Cold start over a repository with broken models: they are UNAVAILABLE with a reason, the rest serve."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def index(http_client) -> dict[tuple[str, str], dict]:
    return {(row["name"], row.get("version", "")): row for row in http_client.get_model_repository_index()}


@pytest.mark.parametrize(
    "model, reason",
    [
        ("broken_syntax", "config.pbtxt syntax error"),
        ("unknown_platform", "unknown platform 'caffe2_netdef' (served here: "),
        ("name_mismatch", "config name 'another_name' does not match its folder name"),
    ],
)
def test_bad_config_makes_only_that_model_unavailable(index, http_client, model, reason):
    row = index[(model, "")]
    assert row["state"] == "UNAVAILABLE"
    assert reason in row["reason"]
    with pytest.raises(InferenceServerException) as info:
        http_client.get_model_metadata(model)
    assert info.value.status() == "404"  # Triton never knew a model whose config does not parse
    assert f"Request for unknown model: '{model}' is not found: " in info.value.message()
    assert reason in info.value.message()


@pytest.mark.parametrize(
    "model, reason",
    [
        ("missing_file", "missing model file 'model.onnx'"),
        ("tensorrt_on_cpu", "tensorrt_plan models run only on an NVIDIA GPU, and this host has none"),
        ("truncated_onnx", "ONNX"),
        ("import_error_python", "ModuleNotFoundError"),
        ("external_data_onnx", "refers to external data outside the model folder"),
    ],
)
def test_bad_version_is_unavailable_with_its_reason(index, model, reason):
    row = index[(model, "1")]
    assert row["state"] == "UNAVAILABLE"
    assert reason in row["reason"]


def test_no_traceback_or_path_in_reasons(index):
    for row in index.values():
        assert "Traceback" not in row.get("reason", "")


def test_good_models_serve_beside_broken_ones(index, http_client):
    for model in ("simple_onnx", "simple_torch", "text_python", "simple_int32"):
        assert index[(model, "1")]["state"] == "READY"
    assert http_client.is_server_ready()


def test_ready_only_index(server, http_client):
    ready = [r for r in http_client.get_model_repository_index() if r.get("state") == "READY"]
    response = httpx.post(f"http://{server.http_url}/v2/repository/index", json={"ready": True})
    assert response.status_code == 200
    assert response.json() == ready
    bad = httpx.post(f"http://{server.http_url}/v2/repository/index", json={"ready": "yes"})
    assert bad.status_code == 400
    assert "boolean 'ready'" in bad.json()["error"]


def _version_served(http_client, model: str, version: str = "") -> int:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    return int(http_client.infer(model, [tensor], model_version=version).as_numpy("OUT")[0])


def test_specific_version_policy(index, http_client):
    assert {v for (n, v) in index if n == "versioned_python"} == {"1", "3"}
    assert _version_served(http_client, "versioned_python") == 3
    assert _version_served(http_client, "versioned_python", "1") == 1
    with pytest.raises(InferenceServerException) as info:
        _version_served(http_client, "versioned_python", "2")
    assert info.value.status() == "404"


def test_latest_policy_orders_versions_numerically(index, http_client):
    assert {v for (n, v) in index if n == "latest_two_python"} == {"3", "10"}
    assert _version_served(http_client, "latest_two_python") == 10
    assert http_client.get_model_metadata("latest_two_python")["versions"] == ["3", "10"]


def test_default_policy_is_the_newest_version_and_ignores_non_numeric_folders(index, http_client):
    assert {v for (n, v) in index if n == "default_policy_python"} == {"7"}
    assert _version_served(http_client, "default_policy_python") == 7
