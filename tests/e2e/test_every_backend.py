"""Every feature over every backend: the response cache, classification, system shared memory and sequence batching,
each exercised with the same add/sub model in ONNX Runtime, TorchScript, OpenVINO, TensorFlow and Python, called
with tritonclient (a feature tested with Python models only once answered 500 to every ONNX request)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.add_sub_models import BACKENDS, write_add_sub
from tests.support import ServerProcess

LABELS = "\n".join(f"class-{index}" for index in range(16)) + "\n"
A = np.arange(32, dtype=np.float32).reshape(2, 16)
B = np.full((2, 16), 0.5, dtype=np.float32)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repository = tmp_path_factory.mktemp("every_backend") / "models"
    for backend in BACKENDS:
        write_add_sub(repository, f"{backend}_cached", backend, "response_cache { enable: true }\n",
                      output0='label_filename: "labels.txt" ', files={"labels.txt": LABELS})
        write_add_sub(repository, f"{backend}_sequence", backend, "sequence_batching { }\n")
    process = ServerProcess(repository, "--response-cache-byte-size", str(1 << 20), "--allow-client-shm", "true",
                            strict=True)
    process.start(timeout=180)
    yield process
    assert process.stop() == 0, process.log()


def _inputs(module, a: np.ndarray, b: np.ndarray) -> list:
    inputs = [module.InferInput("INPUT0", list(a.shape), "FP32"), module.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_response_cache_answers_repeats_without_the_model(served, backend, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(served.http_url if protocol == "http" else served.grpc_url)
    model = f"{backend}_cached"
    b = B + (1 if protocol == "http" else 2)  # each protocol's first request misses
    before = client.get_inference_statistics(model, as_json=True) if protocol == "grpc" else \
        client.get_inference_statistics(model)
    hits_before = int(before["model_stats"][0]["inference_stats"]["cache_hit"]["count"])
    for _ in range(3):
        result = client.infer(model, _inputs(module, A, b))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - b)
    after = client.get_inference_statistics(model, as_json=True) if protocol == "grpc" else \
        client.get_inference_statistics(model)
    assert int(after["model_stats"][0]["inference_stats"]["cache_hit"]["count"]) - hits_before == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_classification_names_the_top_classes(served, backend):
    client = httpclient.InferenceServerClient(served.http_url)
    output = httpclient.InferRequestedOutput("OUTPUT0", class_count=2)
    result = client.infer(f"{backend}_cached", _inputs(httpclient, A, B), outputs=[output])
    top = result.as_numpy("OUTPUT0")
    assert top.shape == (2, 2)
    assert top[0].tolist() == [b"15.500000:15:class-15", b"14.500000:14:class-14"]
    assert top[1].tolist() == [b"31.500000:15:class-15", b"30.500000:14:class-14"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_system_shared_memory_inputs_and_outputs(served, backend, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(served.http_url if protocol == "http" else served.grpc_url)
    tag = uuid.uuid4().hex[:8]
    size = A.nbytes
    inputs = shm.create_shared_memory_region(f"in-{tag}", f"/st_every_in_{tag}", 2 * size)
    outputs = shm.create_shared_memory_region(f"out-{tag}", f"/st_every_out_{tag}", size)
    try:
        shm.set_shared_memory_region(inputs, [A, B])
        client.register_system_shared_memory(f"in-{tag}", f"/st_every_in_{tag}", 2 * size)
        client.register_system_shared_memory(f"out-{tag}", f"/st_every_out_{tag}", size)
        first, second = module.InferInput("INPUT0", [2, 16], "FP32"), module.InferInput("INPUT1", [2, 16], "FP32")
        first.set_shared_memory(f"in-{tag}", size)
        second.set_shared_memory(f"in-{tag}", size, offset=size)
        summed = module.InferRequestedOutput("OUTPUT0")
        summed.set_shared_memory(f"out-{tag}", size)
        result = client.infer(f"{backend}_cached", [first, second],
                              outputs=[summed, module.InferRequestedOutput("OUTPUT1")])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, [2, 16]), A + B)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    finally:
        client.unregister_system_shared_memory(f"in-{tag}")
        client.unregister_system_shared_memory(f"out-{tag}")
        shm.destroy_shared_memory_region(inputs)
        shm.destroy_shared_memory_region(outputs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sequences_run_in_order_to_their_end(served, backend, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(served.http_url if protocol == "http" else served.grpc_url)
    sequence_id = int(uuid.uuid4().int % 1_000_000) + 1
    steps = 4
    for step in range(steps):
        a = np.full((1, 16), step, dtype=np.float32)
        result = client.infer(f"{backend}_sequence", _inputs(module, a, B[:1]), sequence_id=sequence_id,
                              sequence_start=step == 0, sequence_end=step == steps - 1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + B[:1])
    with pytest.raises(Exception, match="must specify the START flag|sequence"):
        client.infer(f"{backend}_sequence", _inputs(module, A[:1], B[:1]), sequence_id=sequence_id)
