"""Ensembles: a preprocess (Python) -> classifier (ONNX) -> postprocess (Python) pipeline over HTTP and gRPC,
parallel steps, ensembles of ensembles, BLS into an ensemble, composing models going away and coming back,
and the checks of a graph."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_models import save_onnx
from runtime.config.ensemble_config import load_order
from runtime.config.pbtxt import parse_model_config
from runtime.errors import ModelLoadError
from runtime.scheduling.ensemble import check_composing_models
from tests.support import ServerProcess, python_model_source, write_model

WIDTH, CLASSES = 16, 4
LABELS = ["circle", "square", "stripe", "noise"]

PREPROCESS = """
import numpy as np
import triton_python_backend_utils as pb_utils


def decode_pgm(data: bytes) -> np.ndarray:
    # a binary PGM (P5) image: 'P5 <width> <height> 255' then one byte per pixel
    fields = data.split(maxsplit=4)
    if len(fields) != 5 or fields[0] != b"P5":
        raise ValueError("not a binary PGM image")
    width, height = int(fields[1]), int(fields[2])
    return np.frombuffer(fields[4], dtype=np.uint8, count=width * height).reshape(height, width)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy().reshape(-1)
            try:
                pixels = np.stack([decode_pgm(image).astype(np.float32).reshape(-1) / 255.0 for image in images])
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PIXELS", pixels)]))
        return responses
"""
PREPROCESS_CONFIG = f"""
backend: "python"
max_batch_size: 8
input [ {{ name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "PIXELS" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
"""
CLASSIFIER_CONFIG = f"""
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "PIXELS" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
output [ {{ name: "SCORES" data_type: TYPE_FP32 dims: [ {CLASSES} ] }} ]
dynamic_batching {{ }}
"""
POSTPROCESS = f"""
import numpy as np
import triton_python_backend_utils as pb_utils

LABELS = {LABELS!r}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            scores = pb_utils.get_input_tensor_by_name(request, "SCORES").as_numpy()
            exp = np.exp(scores - scores.max(axis=1, keepdims=True))
            probabilities = (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)
            labels = np.array([[LABELS[i].encode()] for i in scores.argmax(axis=1)], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PROBABILITIES", probabilities),
                                                         pb_utils.Tensor("LABEL", labels)]))
        return responses
"""
POSTPROCESS_CONFIG = f"""
backend: "python"
max_batch_size: 8
input [ {{ name: "SCORES" data_type: TYPE_FP32 dims: [ {CLASSES} ] }} ]
output [ {{ name: "PROBABILITIES" data_type: TYPE_FP32 dims: [ {CLASSES} ] }},
         {{ name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""
PIPELINE_CONFIG = f"""
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }},
         {{ name: "PROBABILITIES" data_type: TYPE_FP32 dims: [ {CLASSES} ] }},
         {{ name: "SCORES" data_type: TYPE_FP32 dims: [ {CLASSES} ] label_filename: "labels.txt" }} ]
ensemble_scheduling {{ step [
  {{ model_name: "preprocess" model_version: -1
     input_map {{ key: "IMAGE" value: "IMAGE" }} output_map {{ key: "PIXELS" value: "pixels" }} }},
  {{ model_name: "classifier" model_version: -1
     input_map {{ key: "PIXELS" value: "pixels" }} output_map {{ key: "SCORES" value: "SCORES" }} }},
  {{ model_name: "postprocess" model_version: -1
     input_map {{ key: "SCORES" value: "SCORES" }}
     output_map {{ key: "PROBABILITIES" value: "PROBABILITIES" }} output_map {{ key: "LABEL" value: "LABEL" }} }}
] }}
"""
# Two steps that can finish only together: each writes its own file, then waits for the other's.  Run one after
# the other, the first gives up after 10 s and fails the request.
MEET = """
import time
from pathlib import Path
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = Path(args["model_repository"]).parent

    def execute(self, requests):
        me, other = %r, %r
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            tag = str(int(x.reshape(-1)[0]))
            (self.folder / f"{me}-{tag}").write_text("here")
            deadline = time.monotonic() + 10
            while not (self.folder / f"{other}-{tag}").exists():
                if time.monotonic() > deadline:
                    responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("ran alone")))
                    break
                time.sleep(0.01)
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return responses
"""
MEET_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
PARALLEL_CONFIG = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "LEFT" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "RIGHT" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "meet_left" model_version: -1 input_map { key: "X" value: "X" }
    output_map { key: "Y" value: "LEFT" } },
  { model_name: "meet_right" model_version: -1 input_map { key: "X" value: "X" }
    output_map { key: "Y" value: "RIGHT" } }
] }
"""
OUTER_CONFIG = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "pipeline" model_version: -1 input_map { key: "IMAGE" value: "IMAGE" }
    output_map { key: "LABEL" value: "LABEL" } }
] }
"""
BLS_CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE")
            answer = pb_utils.InferenceRequest(model_name="pipeline", requested_output_names=["LABEL"],
                                               inputs=[image]).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                label = pb_utils.get_output_tensor_by_name(answer, "LABEL").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LABEL", label)]))
        return responses
"""
BLS_CALLER_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


# A decoupled step that answers once per pixel row of the image, then the classifier on each: a stream.
ROWS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            pixels = pb_utils.get_input_tensor_by_name(request, "PIXELS").as_numpy()
            for row in range(pixels.shape[0]):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("ROW", pixels[row:row + 1])]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
ROWS_CONFIG = f"""
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "PIXELS" data_type: TYPE_FP32 dims: [ -1, {WIDTH} ] }} ]
output [ {{ name: "ROW" data_type: TYPE_FP32 dims: [ 1, {WIDTH} ] }} ]
"""
STREAMING_CONFIG = f"""
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "PIXELS" data_type: TYPE_FP32 dims: [ -1, {WIDTH} ] }} ]
output [ {{ name: "SCORES" data_type: TYPE_FP32 dims: [ 1, {CLASSES} ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "rows" model_version: -1 input_map {{ key: "PIXELS" value: "PIXELS" }}
     output_map {{ key: "ROW" value: "row" }} }},
  {{ model_name: "classifier" model_version: -1 input_map {{ key: "PIXELS" value: "row" }}
     output_map {{ key: "SCORES" value: "SCORES" }} }}
] }}
"""


def build_classifier(path: Path) -> np.ndarray:
    """An ONNX linear classifier over WIDTH pixels; its weights (to compute expected answers)."""
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(7).standard_normal((WIDTH, CLASSES)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["PIXELS", "W"], ["SCORES"])], "classifier",
        [helper.make_tensor_value_info("PIXELS", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("SCORES", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(weights, "W")])
    save_onnx(graph, path)
    return weights


def pgm(pixels: np.ndarray) -> bytes:
    return f"P5 {pixels.shape[1]} {pixels.shape[0]} 255\n".encode() + pixels.astype(np.uint8).tobytes()


def expected(image: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, str]:
    scores = (image.reshape(-1).astype(np.float32) / 255.0) @ weights
    return scores, LABELS[int(scores.argmax())]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensembles") / "models"
    weights = build_classifier(root / "classifier" / "1" / "model.onnx")
    write_model(root, "classifier", CLASSIFIER_CONFIG)
    write_model(root, "preprocess", PREPROCESS_CONFIG, {"1/model.py": PREPROCESS})
    write_model(root, "postprocess", POSTPROCESS_CONFIG, {"1/model.py": POSTPROCESS})
    write_model(root, "pipeline", PIPELINE_CONFIG, {"labels.txt": "\n".join(LABELS) + "\n"})
    write_model(root, "meet_left", MEET_CONFIG, {"1/model.py": MEET % ("left", "right")})
    write_model(root, "meet_right", MEET_CONFIG, {"1/model.py": MEET % ("right", "left")})
    write_model(root, "parallel", PARALLEL_CONFIG)
    write_model(root, "outer", OUTER_CONFIG)
    write_model(root, "rows", ROWS_CONFIG, {"1/model.py": ROWS})
    write_model(root, "streaming", STREAMING_CONFIG)
    write_model(root, "bls_caller", BLS_CALLER_CONFIG, {"1/model.py": BLS_CALLER})
    for name in ("pipeline", "parallel", "outer", "streaming"):
        (root / name / "1").mkdir()
    # explicit mode: the ensembles bring the models they call
    models = ["pipeline", "parallel", "outer", "bls_caller", "streaming"]
    process = ServerProcess(root, "--model-control-mode", "explicit",
                            *[argument for model in models for argument in ("--load-model", model)])
    with process:
        process.wait_loaded()
        yield process, weights, root


def _images(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(count)
    return [rng.integers(0, 256, size=(4, 4)) for _ in range(count)]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_preprocess_classifier_postprocess_pipeline(served, protocol):
    process, weights, _ = served
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(process.http_url if protocol == "http" else process.grpc_url)
    images = _images(3)
    tensor = module.InferInput("IMAGE", [3, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[pgm(image)] for image in images], dtype=object))
    result = client.infer("pipeline", [tensor])
    scores = result.as_numpy("SCORES")
    for row, image in zip(range(3), images, strict=True):
        want_scores, want_label = expected(image, weights)
        np.testing.assert_allclose(scores[row], want_scores, rtol=1e-5)
        assert result.as_numpy("LABEL")[row][0] in (want_label, want_label.encode())
        np.testing.assert_allclose(result.as_numpy("PROBABILITIES")[row].sum(), 1.0, rtol=1e-5)
    top = client.infer("pipeline", [tensor], outputs=[module.InferRequestedOutput("SCORES", class_count=1)])
    first = top.as_numpy("SCORES")[0][0]
    first = first.decode() if isinstance(first, bytes) else first
    assert first.split(":")[2] == expected(images[0], weights)[1]  # the ensemble output's own label file


def test_a_decoupled_step_makes_the_ensemble_stream_one_response_per_branch(served):
    process, weights, _ = served
    pixels = np.random.default_rng(3).random((5, WIDTH), dtype=np.float32)
    client = grpcclient.InferenceServerClient(process.grpc_url)
    assert client.get_model_config("streaming").config.model_transaction_policy.decoupled  # as Triton says
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    tensor = grpcclient.InferInput("PIXELS", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels)
    client.async_stream_infer("streaming", [tensor], request_id="rows")
    scores = []
    while True:
        result, error = answers.get(timeout=30)
        assert error is None, error
        scores.append(result.as_numpy("SCORES")[0])
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    expected_scores = pixels @ weights
    assert len(scores) == 5  # one per row; the last one carries the final flag
    for row in scores:  # branches finish in any order
        assert np.isclose(expected_scores, row, rtol=1e-5).all(axis=1).any()
    with pytest.raises(InferenceServerException, match="decoupled"):
        client.infer("streaming", [tensor])


def test_a_failing_step_fails_the_request_with_its_error(served):
    client = httpclient.InferenceServerClient(served[0].http_url)
    tensor = httpclient.InferInput("IMAGE", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"GIF89a not a pgm"]], dtype=object))
    with pytest.raises(InferenceServerException, match="not a binary PGM image"):
        client.infer("pipeline", [tensor])
    wrong = httpclient.InferInput("IMAGE", [1, 1], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 1), np.float32))
    with pytest.raises(InferenceServerException, match="data-type is 'FP32'"):
        client.infer("pipeline", [wrong])


def test_independent_steps_run_at_the_same_time(served):
    client = httpclient.InferenceServerClient(served[0].http_url, network_timeout=60)
    tensor = httpclient.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.array([41.0], np.float32))
    result = client.infer("parallel", [tensor])  # each step waits for the other: only concurrent steps finish
    assert result.as_numpy("LEFT").tolist() == [42.0] and result.as_numpy("RIGHT").tolist() == [42.0]


def test_ensemble_of_ensembles_bls_into_an_ensemble_and_statistics(served):
    process, weights, _ = served
    client = httpclient.InferenceServerClient(process.http_url)
    image = _images(1)[0]
    tensor = httpclient.InferInput("IMAGE", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[pgm(image)]], dtype=object))
    before = {m["name"]: m["inference_count"] for m in client.get_inference_statistics()["model_stats"]}
    for model in ("outer", "bls_caller"):
        label = client.infer(model, [tensor]).as_numpy("LABEL")[0][0]
        assert label in (expected(image, weights)[1], expected(image, weights)[1].encode())
    after = {m["name"]: m["inference_count"] for m in client.get_inference_statistics()["model_stats"]}
    assert after["outer"] - before.get("outer", 0) == 1
    assert after["pipeline"] - before.get("pipeline", 0) == 2  # once inside 'outer', once through BLS
    assert after["classifier"] - before.get("classifier", 0) == 2


def test_composing_model_unload_reload_and_unload_dependents(served):
    process, weights, root = served
    client = httpclient.InferenceServerClient(process.http_url)
    image = _images(1)[0]
    tensor = httpclient.InferInput("IMAGE", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[pgm(image)]], dtype=object))

    failures: list[str] = []
    answered = 0
    stop = threading.Event()

    def load() -> None:
        nonlocal answered
        own = httpclient.InferenceServerClient(process.http_url)
        while not stop.is_set():
            try:
                own.infer("pipeline", [tensor])
                answered += 1
            except InferenceServerException as exc:
                failures.append(str(exc))
        own.close()  # in the thread that made it: gevent's pool cannot be joined from another thread

    worker = threading.Thread(target=load)
    worker.start()
    try:
        for _ in range(3):  # a composing model reloaded under load: no ensemble request fails
            time.sleep(0.3)
            (root / "postprocess" / "1" / "model.py").write_text(POSTPROCESS + "\n# touched\n")
            client.load_model("postprocess")
        time.sleep(0.3)
    finally:
        stop.set()
        worker.join(30)
    assert failures == [] and answered > 0

    client.unload_model("classifier")
    assert not client.is_model_ready("pipeline")
    index = {row["name"]: row for row in client.get_model_repository_index()}
    assert index["pipeline"]["state"] == "UNAVAILABLE" and "classifier" in index["pipeline"]["reason"]
    with pytest.raises(InferenceServerException):
        client.infer("pipeline", [tensor])
    client.load_model("classifier")
    assert client.is_model_ready("pipeline")
    client.infer("pipeline", [tensor])

    client.unload_model("classifier", unload_dependents=True)  # takes 'pipeline' and 'outer' with it
    for name in ("pipeline", "outer"):
        assert not client.is_model_ready(name)
    client.load_model("outer")  # loading an ensemble loads what it calls
    assert client.is_model_ready("outer") and client.is_model_ready("pipeline")


def test_graph_checks_and_load_order():
    with pytest.raises(ModelLoadError, match="not connected"):  # a cycle between two steps
        parse_model_config("""
            platform: "ensemble"
            input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] } ]
            output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
            ensemble_scheduling { step [
              { model_name: "m" input_map { key: "X" value: "A" } input_map { key: "Y" value: "t1" }
                output_map { key: "Z" value: "t2" } },
              { model_name: "m" input_map { key: "X" value: "t2" } output_map { key: "Z" value: "t1" } },
              { model_name: "m" input_map { key: "X" value: "t2" } output_map { key: "Z" value: "OUT" } } ] }
        """, "cyclic")
    deps = {"outer": ["pipeline", "sink"], "pipeline": ["pre", "post"], "a": ["b"], "b": ["a"]}
    batches = load_order(["outer", "pipeline", "pre", "post", "sink", "a", "b"], lambda n: deps.get(n, []))
    assert batches == [["pre", "post", "sink"], ["pipeline"], ["outer"], ["a", "b"]]


def _ensemble(steps: str, outputs: str = '{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }') -> str:
    return f"""platform: "ensemble"
        max_batch_size: 8
        input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {outputs} ]
        ensemble_scheduling {{ step [ {steps} ] }}"""


STEP = '{{ model_name: "{model}" model_version: -1 input_map {{ key: "{key}" value: "{source}" }} ' \
       'output_map {{ key: "{out}" value: "{target}" }} }}'


def _step(source: str = "A", target: str = "OUT", model: str = "m", key: str = "X", out: str = "Y") -> str:
    return STEP.format(model=model, key=key, source=source, out=out, target=target)


@pytest.mark.parametrize(("steps", "words"), [
    ("", "must specify 'step' for ensemble 'e'"),
    (f"{_step()}, {_step()}", "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'e' step 1"),
    (_step(target="other"), "ensemble output 'OUT' for ensemble e' is not used"),
    (_step(source="ghost"), "ensemble input 'A' for ensemble e' is not used"),
    (f"{_step(target='t')}, {_step(source='ghost')}", "depending tensors, 'ghost', is not connected"),
    (f"{_step()}, {_step(target='spare')}", "ensemble tensor 'spare' is unused in ensemble 'e'"),
])
def test_graph_checks_in_tritons_words(steps, words):
    with pytest.raises(ModelLoadError) as error:
        parse_model_config(_ensemble(steps), "e")
    assert words in str(error.value)


@pytest.mark.parametrize(("step", "model_config", "words"), [
    (_step(model="nope"), None, "ensemble e contains models that are not available or ambiguous: nope"),
    (_step(key="Z"), "", "ensemble tensor A is mapping to non-existing input Z in model m"),
    (_step(out="Z"), "", "ensemble tensor OUT is mapped from non-existing output Z in model m"),
    (_step(), 'dims: [ 5 ]', "ensemble tensor A: inconsistent shape: [-1,4] is inferred from model e while "
                             "[-1,5] is inferred from model m"),
    (_step(), "TYPE_INT32", "ensemble tensor A: inconsistent data type: TYPE_FP32 is inferred from model e while "
                            "TYPE_INT32 is inferred from model m"),
    (_step(), "max_batch_size: 4", "ensemble e allows maximum batch size 8, but it contains model m which only "
                                   "allows maximum batch size to be 4"),
])
def test_checks_against_the_composing_models(step, model_config, words):
    config = ('backend: "python"\nmax_batch_size: 8\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
              'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    if model_config == "dims: [ 5 ]":
        config = config.replace("dims: [ 4 ] } ]\noutput", "dims: [ 5 ] } ]\noutput")
    elif model_config == "TYPE_INT32":
        config = config.replace('"X" data_type: TYPE_FP32', '"X" data_type: TYPE_INT32')
    elif model_config:
        config = config.replace("max_batch_size: 8", model_config)
    composing = parse_model_config(config, "m")
    ensemble = parse_model_config(_ensemble(step), "e")
    with pytest.raises(ModelLoadError) as error:
        check_composing_models(ensemble, lambda name, version: composing if name == "m" else None)
    assert words in str(error.value)


HALF_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "B" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
HALF = python_model_source("return [pb_utils.InferenceResponse([pb_utils.Tensor('A', "
                           "pb_utils.get_input_tensor_by_name(r, 'IN').as_numpy())]) for r in requests]")
HALF_ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "YA" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "YB" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "half" model_version: -1 input_map { key: "IN" value: "X" }
                               output_map [ { key: "A" value: "YA" }, { key: "B" value: "YB" } ] } ] }
"""


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_output_no_step_produced_is_left_out(tmp_path, protocol):
    """Triton 2.52 (core #399): the ensemble answers with the outputs its composing models produced (2.51 failed
    the request); a model asked directly for an output it does not produce still fails, as in Triton."""
    root = tmp_path / "models"
    write_model(root, "half", HALF_CONFIG, {"1/model.py": HALF})
    write_model(root, "half_ensemble", HALF_ENSEMBLE_CONFIG)
    (root / "half_ensemble" / "1").mkdir()
    module = httpclient if protocol == "http" else grpcclient
    with ServerProcess(root) as process:
        client = module.InferenceServerClient(process.http_url if protocol == "http" else process.grpc_url)
        tensor = module.InferInput("X", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
        for outputs in (None, [module.InferRequestedOutput("YA"), module.InferRequestedOutput("YB")]):
            answer = client.infer("half_ensemble", [tensor], outputs=outputs)
            assert answer.as_numpy("YA").tolist() == [1.0, 2.0] and answer.as_numpy("YB") is None
        direct = module.InferInput("IN", [2], "FP32")
        direct.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
        with pytest.raises(InferenceServerException, match="did not produce output 'B'"):
            client.infer("half", [direct], outputs=[module.InferRequestedOutput("B")])


COUNTING_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 4 kind: KIND_CPU } ]
parameters { key: "isolation" value { string_value: "thread" } }
"""
# Each execute notes how many executes run at that moment (a file each in a folder), then takes 0.3 s.
COUNTING = python_model_source("""
folder = os.environ["COUNTING_DIR"]
mine = os.path.join(folder, "running", f"{os.getpid()}-{id(requests)}-{time.monotonic_ns()}")
open(mine, "w").close()
with open(os.path.join(folder, "seen"), "a") as seen:
    seen.write(f"{len(os.listdir(os.path.join(folder, 'running')))}\\n")
time.sleep(0.3)
os.remove(mine)
return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
        for r in requests]
""")
LIMITED_ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { %s step [ { model_name: "counting" model_version: -1 input_map { key: "IN" value: "X" }
                                 output_map { key: "OUT" value: "Y" } } ] }
"""


@pytest.mark.parametrize("limit", [2, 0])
def test_max_inflight_requests_bounds_a_steps_requests_across_the_ensembles_requests(tmp_path, limit):
    """Triton 2.63/2.68 (core #455, #482): 6 requests at once to an ensemble whose step model has 4 instances; with
    max_inflight_requests 2 at most 2 of the step's requests are in flight at any time, and with none (0) more are."""
    root = tmp_path / "models"
    (tmp_path / "count" / "running").mkdir(parents=True)
    write_model(root, "counting", COUNTING_CONFIG, {"1/model.py": COUNTING})
    write_model(root, "limited", LIMITED_ENSEMBLE_CONFIG % (f"max_inflight_requests: {limit}" if limit else ""))
    (root / "limited" / "1").mkdir()
    with ServerProcess(root, env={"COUNTING_DIR": str(tmp_path / "count")}) as process:
        def ask(value: float) -> list[float]:
            client = httpclient.InferenceServerClient(process.http_url)
            tensor = httpclient.InferInput("X", [1], "FP32")
            tensor.set_data_from_numpy(np.array([value], np.float32))
            return client.infer("limited", [tensor]).as_numpy("Y").tolist()

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            assert list(pool.map(ask, range(6))) == [[float(v)] for v in range(6)]
    seen = [int(line) for line in (tmp_path / "count" / "seen").read_text().split()]
    assert len(seen) == 6
    assert max(seen) <= 2 if limit else max(seen) > 2, seen
