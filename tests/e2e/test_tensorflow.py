"""TensorFlow SavedModel and GraphDef models (built here with TensorFlow itself), served beside ONNX and TorchScript
models in one server as the deployment guide's multi-model repository does, called with tritonclient."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from examples.build_models import EXAMPLE_REPOSITORY, build_example_models
from tests.add_sub_models import write_savedmodel
from tests.support import ServerProcess, add_sub_config, assert_add_sub_answers, write_model


def tf_add_sub_config(platform: str) -> str:
    return add_sub_config(f'platform: "{platform}"', extra="dynamic_batching { }\n")


UPPER_CONFIG = """
    platform: "tensorflow_savedmodel"
    max_batch_size: 0
    input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
    output [ { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


def build_models(repository: Path) -> None:
    """An add/sub SavedModel, the same as a frozen GraphDef, and a string SavedModel."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    spec = [tf.TensorSpec([None, 16], tf.float32, name="INPUT0"), tf.TensorSpec([None, 16], tf.float32, name="INPUT1")]

    class Upper(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="TEXT")])
        def serve(self, TEXT):  # noqa: N803
            return {"UPPER": tf.strings.upper(TEXT)}

    write_savedmodel(repository / "add_sub_savedmodel" / "1" / "model.savedmodel")
    write_model(repository, "add_sub_savedmodel", tf_add_sub_config("tensorflow_savedmodel"))
    upper = Upper()
    tf.saved_model.save(upper, str(repository / "upper_savedmodel" / "1" / "model.savedmodel"),
                        signatures={"serving_default": upper.serve})
    write_model(repository, "upper_savedmodel", UPPER_CONFIG)

    @tf.function(input_signature=spec)
    def graph(INPUT0, INPUT1):  # noqa: N803
        return tf.identity(INPUT0 + INPUT1, name="OUTPUT0"), tf.identity(INPUT0 - INPUT1, name="OUTPUT1")

    frozen = convert_variables_to_constants_v2(graph.get_concrete_function()).graph.as_graph_def()
    (repository / "add_sub_graphdef" / "1").mkdir(parents=True)
    (repository / "add_sub_graphdef" / "1" / "model.graphdef").write_bytes(frozen.SerializeToString())
    write_model(repository, "add_sub_graphdef", tf_add_sub_config("tensorflow_graphdef"))
    shutil.copytree(repository / "add_sub_savedmodel", repository / "wrong_signature")
    write_model(repository, "wrong_signature", tf_add_sub_config("tensorflow_savedmodel")
                + 'parameters { key: "TF_SIGNATURE_DEF" value: { string_value: "predict" } }\n')
    shutil.copytree(repository / "add_sub_savedmodel", repository / "wrong_output")
    write_model(repository, "wrong_output", tf_add_sub_config("tensorflow_savedmodel")
                .replace('"OUTPUT1"', '"OUTPUT7"'))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repository = tmp_path_factory.mktemp("tensorflow") / "models"
    shutil.copytree(EXAMPLE_REPOSITORY, repository, ignore=shutil.ignore_patterns("model.onnx", "model.pt"))
    build_example_models(repository)  # ONNX and TorchScript beside TensorFlow, as the guide's repository has
    build_models(repository)
    process = ServerProcess(repository, log=repository.parent / "server.log").start(timeout=120)
    yield process
    assert process.stop() == 0, process.log()


@pytest.mark.parametrize("model", ["add_sub_savedmodel", "add_sub_graphdef"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tensorflow_models_answer_over_both_protocols(served, model, protocol):
    assert_add_sub_answers(served, protocol, model, batch=3, b=0.5)


def test_string_tensors_round_trip(served):
    client = grpcclient.InferenceServerClient(served.grpc_url)
    text = grpcclient.InferInput("TEXT", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"saved", b"model"], dtype=object))
    assert client.infer("upper_savedmodel", [text]).as_numpy("UPPER").tolist() == [b"SAVED", b"MODEL"]


def test_every_framework_serves_in_one_repository_and_mistakes_say_why(served):
    index = {row["name"]: row for row in httpx.post(f"http://{served.http_url}/v2/repository/index").json()}
    for model in ("simple_onnx", "simple_torch", "text_python", "add_sub_savedmodel", "add_sub_graphdef",
                  "upper_savedmodel"):
        assert index[model]["state"] == "READY", index[model]
    reason = index["wrong_signature"]["reason"]
    assert "the SavedModel has no signature 'predict' (it has ['serving_default'])" in reason
    assert "config output 'OUTPUT7' is not in the TensorFlow model" in index["wrong_output"]["reason"]
    config = httpx.get(f"http://{served.http_url}/v2/models/add_sub_savedmodel/config").json()
    assert (config["platform"], config["backend"], config["default_model_filename"]) == (
        "tensorflow_savedmodel", "tensorflow", "model.savedmodel")
