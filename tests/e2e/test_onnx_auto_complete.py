"""Triton's auto-complete for ONNX models: configs (or no config) completed from the graph, then served."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from examples.build_models import build_add_sub_onnx, save_onnx
from tests.conftest import S3_ENV
from tests.e2e.test_cli import bootstrap, storage_config, upload
from tests.support import ServerProcess, write_model


def build_fixed_scale_onnx(path) -> None:
    """Y = X * 2 with a fixed shape [3, 2]: it cannot batch."""
    graph = helper.make_graph([helper.make_node("Add", ["X", "X"], ["Y"])], "fixed",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 2])])
    save_onnx(graph, path)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repository = tmp_path_factory.mktemp("onnx_auto") / "models"
    build_add_sub_onnx(repository / "no_config" / "1" / "model.onnx", datatype="INT32")  # no config.pbtxt at all
    build_fixed_scale_onnx(repository / "fixed" / "1" / "model.onnx")
    (repository / "fixed" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    build_add_sub_onnx(repository / "partial" / "1" / "model.onnx", datatype="FP32")
    write_model(repository, "partial", 'backend: "onnxruntime"\nmax_batch_size: 8\n'
                                       'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n')
    process = ServerProcess(repository).start()
    yield process
    assert process.stop() == 0, process.log()


def config_of(process: ServerProcess, model: str) -> dict:
    return httpx.get(f"http://{process.http_url}/v2/models/{model}/config").json()


def test_a_model_without_config_is_completed_from_its_graph_and_batches(served):
    config = config_of(served, "no_config")
    assert (config["platform"], config["backend"], config["max_batch_size"]) == ("onnxruntime_onnx", "onnxruntime", 4)
    assert "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    assert [t["name"] for t in config["output"]] == ["OUTPUT0", "OUTPUT1"]
    client = grpcclient.InferenceServerClient(served.grpc_url)
    a = np.arange(64, dtype=np.int32).reshape(4, 16)
    inputs = [grpcclient.InferInput(n, [4, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    assert client.infer("no_config", inputs).as_numpy("OUTPUT0").tolist() == (2 * a).tolist()


def test_a_model_that_cannot_batch_keeps_max_batch_size_0_and_full_dims(served):
    config = config_of(served, "fixed")
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("X", [3, 2])]
    client = httpclient.InferenceServerClient(served.http_url)
    value = httpclient.InferInput("X", [3, 2], "FP32")
    value.set_data_from_numpy(np.ones((3, 2), dtype=np.float32))
    assert client.infer("fixed", [value]).as_numpy("Y").tolist() == [[2.0, 2.0]] * 3


def test_what_the_config_declares_stays_and_the_rest_is_filled_in(served):
    config = config_of(served, "partial")
    assert config["max_batch_size"] == 8 and "dynamic_batching" not in config  # as written
    assert [t["name"] for t in config["input"]] == ["INPUT0", "INPUT1"]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("OUTPUT0", [16]), ("OUTPUT1", [16])]


def test_without_auto_complete_a_config_less_onnx_model_is_not_loaded(tmp_path):
    repository = tmp_path / "models"
    build_add_sub_onnx(repository / "no_config" / "1" / "model.onnx")
    process = ServerProcess(repository, "--disable-auto-complete-config", log=tmp_path / "server.log").start()
    try:
        index = {row["name"]: row for row in httpx.post(f"http://{process.http_url}/v2/repository/index").json()}
        assert index["no_config"]["state"] == "UNAVAILABLE" and "no config.pbtxt" in index["no_config"]["reason"]
    finally:
        assert process.stop() == 0


def test_a_config_less_onnx_model_syncs_from_storage(s3, moto_endpoint, bucket, tmp_path):
    local = tmp_path / "local"
    build_add_sub_onnx(local / "no_config" / "1" / "model.onnx")
    build_add_sub_onnx(local / "no_config" / "2" / "model.onnx")
    upload(s3, bucket, local)
    cache = tmp_path / "cache"
    result = bootstrap("sync", "--config", str(storage_config(tmp_path, moto_endpoint, cache)), f"s3://{bucket}/repo",
                       env=S3_ENV, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (cache / "repository" / "no_config").iterdir() if p.name[0] != ".") == ["2"]
