"""A load request's config override is completed as Triton completes a config.pbtxt: Triton's model-control
examples load ONNX ``simple`` with ``config='{"max_batch_size":"16"}'``, which names no platform, no inputs, no
outputs, and expect the model served with its graph's tensors and the new batch size."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_models import build_add_sub_onnx
from tests.conftest import ONNX_ADD_SUB_CONFIG
from tests.support import ServerProcess, write_model

# What the examples send first: not a config (it must fail with "failed to load", and leave the model serving).
NOT_A_CONFIG = '"parameters": {"config": {{"max_batch_size": "16"}}}'


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("override")
    write_model(repository, "simple", ONNX_ADD_SUB_CONFIG)
    build_add_sub_onnx(repository / "simple" / "1" / "model.onnx", datatype="INT32")
    with ServerProcess(repository, "--model-control-mode", "explicit") as process:
        yield process


def _infer_batch(client, module, rows: int) -> np.ndarray:
    data = np.arange(rows * 16, dtype=np.int32).reshape(rows, 16)
    inputs = [module.InferInput(name, [rows, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    return client.infer("simple", inputs).as_numpy("OUTPUT0")


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_override_without_platform_is_auto_completed(explicit_server, module):
    client = module.InferenceServerClient(explicit_server.http_url if module is httpclient
                                          else explicit_server.grpc_url)
    client.load_model("simple")
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException, match="failed to load"):
        client.load_model("simple", config=NOT_A_CONFIG)
    assert client.is_model_ready("simple")
    client.load_model("simple", config='{"max_batch_size":"16"}')
    config = (client.get_model_config("simple") if module is httpclient
              else client.get_model_config("simple", as_json=True)["config"])
    assert int(config["max_batch_size"]) == 16
    assert config["platform"] == "onnxruntime_onnx" and config["backend"] == "onnxruntime"
    assert sorted(t["name"] for t in config["input"]) == ["INPUT0", "INPUT1"]
    assert [int(d) for d in config["input"][0]["dims"]] == [16]
    assert _infer_batch(client, module, 16).shape == (16, 16)  # past the config.pbtxt's max_batch_size of 8
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    with pytest.raises(InferenceServerException, match="failed to load"):
        client.load_model("wrong_model_name")
    client.close()
