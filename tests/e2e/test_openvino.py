"""The OpenVINO backend (``backend: "openvino"``, ``model.xml`` + ``model.bin``), served and called with tritonclient.

The IR is made here from the add/sub ONNX model by OpenVINO's own converter, as users produce theirs.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.add_sub_models import write_ir
from tests.support import ServerProcess, add_sub_config, assert_add_sub_answers, write_model

CONFIG = add_sub_config('backend: "openvino"', extra="""
dynamic_batching { max_queue_delay_microseconds: 2000 }
parameters { key: "INFERENCE_NUM_THREADS" value: { string_value: "1" } }
""")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repository = tmp_path_factory.mktemp("openvino") / "models"
    write_model(repository, "add_sub_ov", CONFIG)
    write_ir(repository / "add_sub_ov" / "1")
    write_model(repository, "wrong_name_ov", CONFIG.replace('"OUTPUT1"', '"OUTPUT9"'))
    write_ir(repository / "wrong_name_ov" / "1")
    write_model(repository, "wrong_type_ov", CONFIG.replace("TYPE_FP32", "TYPE_INT32"))
    write_ir(repository / "wrong_type_ov" / "1")
    write_model(repository, "no_weights_ov", CONFIG)
    write_ir(repository / "no_weights_ov" / "1")
    (repository / "no_weights_ov" / "1" / "model.bin").unlink()
    process = ServerProcess(repository).start()
    yield process
    assert process.stop() == 0, process.log()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_openvino_model_answers_over_both_protocols(served, protocol):
    assert_add_sub_answers(served, protocol, "add_sub_ov", batch=2, b=3.0)


def test_the_config_reads_as_tritons_and_requests_batch(served):
    config = httpx.get(f"http://{served.http_url}/v2/models/add_sub_ov/config").json()
    assert config["backend"] == "openvino" and config["default_model_filename"] == "model.xml"
    client = httpclient.InferenceServerClient(served.http_url, concurrency=16)
    one = np.ones((1, 16), dtype=np.float32)
    pending = []
    for index in range(16):
        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(one * index)
        inputs[1].set_data_from_numpy(one)
        pending.append((index, client.async_infer("add_sub_ov", inputs)))
    for index, request in pending:
        assert request.get_result().as_numpy("OUTPUT0").tolist() == [[index + 1.0] * 16]
    stats = httpx.get(f"http://{served.http_url}/v2/models/add_sub_ov/stats").json()["model_stats"][0]
    assert stats["inference_count"] >= 16 + 4  # with the two above
    assert stats["execution_count"] < stats["inference_count"]  # some requests ran together


def test_mismatched_or_incomplete_models_are_unavailable_with_the_reason(served):
    index = {row["name"]: row for row in httpx.post(f"http://{served.http_url}/v2/repository/index").json()}
    assert index["add_sub_ov"]["state"] == "READY"
    assert "config output 'OUTPUT9' is not in the OpenVINO model" in index["wrong_name_ov"]["reason"]
    assert "config input 'INPUT0' is INT32 but the model's is f32" in index["wrong_type_ov"]["reason"]
    assert "missing weights file 'model.bin'" in index["no_weights_ov"]["reason"]
