"""The GPU paths, on a host with an NVIDIA GPU (``pytest -m gpu``; scripts/gpu_check.sh installs what they need).

Skipped where CUDA is absent, so CI on CPU hosts never runs them; on a GPU host each can fail:
- ONNX Runtime on the CUDA provider and TorchScript on CUDA for KIND_GPU instances (the load log names cuda:N),
  with correct answers; KIND_CPU stays on the CPU on that same host;
- the deployment guide's Python model: it moves its model and inputs to CUDA and returns a CUDA tensor through
  DLPack; ``model_instance_kind`` says GPU.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from examples.build_models import EXAMPLE_REPOSITORY, TORCH_BIAS, TORCH_WEIGHT, build_add_sub_onnx, build_example_models
from tests.support import GPU_TESTS, ServerProcess, add_sub_config, cuda_available, write_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason=GPU_TESTS)]

GUIDE_MODEL = '''
import json

import torch
import triton_python_backend_utils as pb_utils
from torch.utils.dlpack import from_dlpack, to_dlpack


class TritonPythonModel:
    def initialize(self, args):
        self.kind = args["model_instance_kind"]
        self.device = torch.device(f"cuda:{args['model_instance_device_id']}" if self.kind == "GPU" else "cpu")
        self.scale = torch.tensor([2.0], device=self.device)

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            values = from_dlpack(tensor.to_dlpack()).to(self.device)
            doubled = values * self.scale
            kind = pb_utils.Tensor("KIND", torch.tensor([ord(c) for c in self.kind], dtype=torch.int32).numpy())
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor.from_dlpack("OUTPUT0", to_dlpack(doubled)), kind]))
        return responses
'''
GUIDE_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "KIND" data_type: TYPE_INT32 dims: [ -1 ] } ]
    instance_group [ { kind: KIND_GPU count: 1 } ]
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repository = tmp_path_factory.mktemp("gpu") / "models"
    shutil.copytree(EXAMPLE_REPOSITORY, repository, ignore=shutil.ignore_patterns("model.onnx", "model.pt"))
    build_example_models(repository)  # simple_torch asks for KIND_GPU
    for kind in ("GPU", "CPU"):
        name = f"add_sub_{kind.lower()}"
        build_add_sub_onnx(repository / name / "1" / "model.onnx")
        write_model(repository, name, add_sub_config('platform: "onnxruntime_onnx"',
                                                     extra=f"instance_group [ {{ kind: KIND_{kind} count: 1 }} ]\n"))
    write_model(repository, "guide_python", GUIDE_CONFIG, {"1/model.py": GUIDE_MODEL})
    process = ServerProcess(repository, "--device", "gpu", log=Path(repository.parent) / "server.log").start(
        timeout=300)
    yield process
    assert process.stop() == 0, process.log()


def test_kind_gpu_instances_run_on_cuda_and_kind_cpu_stays_on_the_cpu(served):
    log = served.log()
    assert "loaded model 'add_sub_gpu' version 1 (onnxruntime, 1 instance(s) on cuda:0)" in log
    assert "loaded model 'add_sub_cpu' version 1 (onnxruntime, 1 instance(s) on cpu)" in log
    assert "loaded model 'simple_torch' version 1 (pytorch, 1 instance(s) on cuda:0)" in log


@pytest.mark.parametrize("model", ["add_sub_gpu", "add_sub_cpu"])
def test_onnx_answers_on_either_device(served, model):
    client = grpcclient.InferenceServerClient(served.grpc_url)
    a = np.random.default_rng(0).random((8, 16), dtype=np.float32)
    inputs = [grpcclient.InferInput(n, [8, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    result = client.infer(model, inputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), 2 * a, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), np.zeros_like(a), atol=1e-6)


def test_torchscript_on_cuda_answers(served):
    client = httpclient.InferenceServerClient(served.http_url)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    value = httpclient.InferInput("INPUT__0", [2, 4], "FP32")
    value.set_data_from_numpy(x)
    result = client.infer("simple_torch", [value]).as_numpy("OUTPUT__0")
    np.testing.assert_allclose(result, x @ TORCH_WEIGHT + TORCH_BIAS, rtol=1e-5)


def test_the_guides_python_model_returns_a_cuda_tensor_through_dlpack(served):
    client = httpclient.InferenceServerClient(served.http_url)
    value = httpclient.InferInput("INPUT0", [4], "FP32")
    value.set_data_from_numpy(np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32))
    result = client.infer("guide_python", [value])
    assert result.as_numpy("OUTPUT0").tolist() == [2.0, 4.0, 6.0, 8.0]
    assert "".join(chr(c) for c in result.as_numpy("KIND")) == "GPU"


def test_gpu_metric_families_name_each_gpu(served):
    import httpx

    text = httpx.get(f"http://127.0.0.1:{served.metrics_port}/metrics").text
    for family in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
                   "nv_gpu_power_usage"):
        assert f"# TYPE {family} gauge" in text
        assert f'{family}{{gpu_uuid="GPU-' in text
