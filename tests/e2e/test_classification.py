"""The classification extension: tritonclient's ``class_count`` over HTTP and gRPC, labels, and bad requests."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_models import build_add_sub_onnx
from runtime.extensions.classification import classify
from tests.support import ServerProcess, write_model

CONFIG = """
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "%s" },
             { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
TEXT_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "OUT" data_type: TYPE_STRING dims: [ 2 ] } ]
"""
TEXT_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([b"a", b"b"], dtype=object))])
                for _ in requests]
"""
SCORES = np.array([[0.5, 2.0, -1.0, 2.0], [9.0, 0.0, 1.0, 3.0]], dtype=np.float32)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("classification") / "models"
    for name, labels in (("scores", "labels.txt"), ("escaping_labels", "../../outside.txt"),
                         ("missing_labels", "nope.txt")):
        build_add_sub_onnx(root / name / "1" / "model.onnx", dims=4)
        write_model(root, name, CONFIG % labels)
    (root / "scores" / "labels.txt").write_text("cat\ndog\nbird\n")  # three labels for four classes
    (root.parent / "outside.txt").write_text("secret\n")
    write_model(root, "text", TEXT_CONFIG, {"1/model.py": TEXT_MODEL})
    with ServerProcess(root) as process:
        process.wait_loaded()
        yield process


def _inputs(module, scores: np.ndarray) -> list:
    tensors = [module.InferInput("INPUT0", list(scores.shape), "FP32"),
               module.InferInput("INPUT1", list(scores.shape), "FP32")]
    tensors[0].set_data_from_numpy(scores)
    tensors[1].set_data_from_numpy(np.zeros_like(scores))
    return tensors


@pytest.mark.parametrize("binary", [True, False])
def test_http_class_count_gives_top_classes_with_labels(served, binary):
    client = httpclient.InferenceServerClient(served.http_url)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=3),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary)]
    result = client.infer("scores", _inputs(httpclient, SCORES), outputs=outputs)
    classes = [[c.decode() if isinstance(c, bytes) else c for c in row] for row in result.as_numpy("OUTPUT0")]
    assert classes == [
        ["2.000000:1:dog", "2.000000:3", "0.500000:0:cat"],  # equal scores in index order; no label for 3
        ["9.000000:0:cat", "3.000000:3", "1.000000:2:bird"],
    ]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), SCORES)  # the other output as it is


def test_grpc_class_count_and_more_classes_than_exist(served):
    client = grpcclient.InferenceServerClient(served.grpc_url)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0", class_count=10)]
    result = client.infer("scores", _inputs(grpcclient, SCORES[:1]), outputs=outputs)
    assert result.as_numpy("OUTPUT0").shape == (1, 4)  # clipped to the number of classes
    assert result.get_response().outputs[0].datatype == "BYTES"


def test_bad_class_counts_and_non_numeric_outputs_are_refused(served):
    client = httpclient.InferenceServerClient(served.http_url)
    for count in (-1, "2", 1.5, True):
        body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
                           for n in ("INPUT0", "INPUT1")],
                "outputs": [{"name": "OUTPUT0", "parameters": {"classification": count}}]}
        response = httpx.post(f"http://{served.http_url}/v2/models/scores/infer", json=body)
        assert response.status_code == 400, count
        assert "classification" in response.json()["error"]
    text = httpclient.InferInput("IN", [2], "FP32")
    text.set_data_from_numpy(np.ones(2, dtype=np.float32))
    with pytest.raises(InferenceServerException, match="classification needs numeric scores"):
        client.infer("text", [text], outputs=[httpclient.InferRequestedOutput("OUT", class_count=1)])


def test_a_label_file_outside_the_model_folder_or_missing_fails_the_load(served):
    client = httpclient.InferenceServerClient(served.http_url)
    index = {row["name"]: row for row in client.get_model_repository_index()}
    for name in ("escaping_labels", "missing_labels"):
        assert index[name]["state"] == "UNAVAILABLE"
        assert "label file" in index[name]["reason"]
    assert index["scores"]["state"] == "READY"


def test_formatting_follows_the_datatype():
    assert classify(np.array([3, 7, 7], dtype=np.int64), 2, [], batched=False).tolist() == [b"7:1", b"7:2"]
    assert classify(np.array([[0.25, 1.5]], dtype=np.float16), 1, ["a", "b"], batched=True).tolist() == [
        [b"1.500000:1:b"]]
    matrix = np.array([[1, 2, 3], [6, 5, 4]], dtype=np.float32)  # unbatched: the whole tensor is one row
    assert classify(matrix, 2, [], batched=False).tolist() == [b"6.000000:3", b"5.000000:4"]
