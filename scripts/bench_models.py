"""The models ``scripts.bench_vs_triton`` serves with real Triton and with ours, built by script (no download),
and the answers each should give.

- ``add_sub_batch``: a tiny Python model with dynamic batching: the per-request overhead.
- ``identity_big``: 600 KB in and out per request: the data path (copies, IPC).
- ``resnet50_pt``: the deployment guide's model.py over a *one-convolution stand-in* for ResNet-50 (a 7x7 conv
  stem, a mean and a linear layer: [N,3,H,W] -> [N,1000]): the guide's request path at a small model's cost.
- ``resnet50_full``: the same model.py over a ResNet-50 (torchvision's architecture: bottleneck blocks 3-4-6-3,
  25.6 M parameters, seeded random weights): what a real image model costs, where the server's share is small.
- ``add_sub_onnx`` (ours only): add_sub_batch as an ONNX model on our ONNX Runtime backend. The wheel's Triton has
  only the Python backend, so its row is held against Triton's Python ``add_sub_batch``: *not like for like* (two
  backends), labelled so wherever it is printed.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

# The deployment guide's model.py for resnet50_pt, unmodified in what it does, is RESNET.
ADD_SUB = '''
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        out0 = pb_utils.get_output_config_by_name(config, "OUTPUT0")
        out1 = pb_utils.get_output_config_by_name(config, "OUTPUT1")
        self.dtype0 = pb_utils.triton_string_to_numpy(out0["data_type"])
        self.dtype1 = pb_utils.triton_string_to_numpy(out1["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype0)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype1))]))
        return responses
'''
ADD_SUB_CONFIG = '''
name: "add_sub_batch"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
'''
IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]))
        return responses
'''
IDENTITY_CONFIG = '''
name: "identity_big"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 150528 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 150528 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
'''
# The deployment guide's model.py, unmodified in what it does.
RESNET = '''
import json, os, torch
from torch.utils.dlpack import from_dlpack, to_dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT__0")
        self.output_dtype = pb_utils.triton_string_to_numpy(output_config["data_type"])
        self.model_directory = os.path.dirname(os.path.realpath(__file__))
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model_path = os.path.join(self.model_directory, "model.pt")
        if not os.path.exists(model_path):
            raise pb_utils.TritonModelException("Cannot find the pytorch model")
        self.model = torch.jit.load(model_path).to(self.device)

    def execute(self, requests):
        responses = []
        for request in requests:
            input_tensor = pb_utils.get_input_tensor_by_name(request, "INPUT__0")
            pytorch_tensor = from_dlpack(input_tensor.to_dlpack())
            if pytorch_tensor.shape[2] > 1000 or pytorch_tensor.shape[3] > 1000:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                    "Image shape should not be larger than 1000")))
                continue
            prediction = self.model(pytorch_tensor.to(self.device))
            out_tensor = pb_utils.Tensor.from_dlpack("OUTPUT__0", to_dlpack(prediction))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_tensor]))
        return responses
'''
RESNET_CONFIG = '''
name: "resnet50_pt"
backend: "python"
max_batch_size: 128
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, -1, -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1000 ] } ]
parameters: { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }
'''
ADD_SUB_ONNX_CONFIG = ADD_SUB_CONFIG.replace('name: "add_sub_batch"\nbackend: "python"',
                                            'name: "add_sub_onnx"\nplatform: "onnxruntime_onnx"')
RESNET_FULL_CONFIG = RESNET_CONFIG.replace('name: "resnet50_pt"', 'name: "resnet50_full"')
SHAPES = {"add_sub_batch": [("INPUT0", [1, 4]), ("INPUT1", [1, 4])], "identity_big": [("INPUT0", [1, 150528])],
          "resnet50_pt": [("INPUT__0", [1, 3, 224, 224])], "resnet50_full": [("INPUT__0", [1, 3, 224, 224])],
          "add_sub_onnx": [("INPUT0", [1, 4]), ("INPUT1", [1, 4])]}
OUTPUTS = {"add_sub_batch": ["OUTPUT0", "OUTPUT1"], "identity_big": ["OUTPUT0"], "resnet50_pt": ["OUTPUT__0"],
           "resnet50_full": ["OUTPUT__0"], "add_sub_onnx": ["OUTPUT0", "OUTPUT1"]}
MODELS = tuple(SHAPES)
OURS_ONLY = {"add_sub_onnx": "add_sub_batch"}  # a model Triton's wheel cannot serve -> the Triton row it is held to
LABELS = {"resnet50_pt": "one-conv stand-in", "resnet50_full": "ResNet-50",
          "add_sub_onnx": "our ONNX backend vs Triton's Python add_sub_batch: not like for like"}
TORCH_MODELS = ("resnet50_pt", "resnet50_full")


def point_requests(model: str, requests: int, concurrency: int = 1) -> int:
    """The measured requests of a point: ``requests`` for the small models, a third of it for the 600 KB ones, and
    for ResNet-50 (~0.1 s of CPU a request) a 75th, at least two per client."""
    if model.startswith("add_sub"):
        return requests
    if model == "resnet50_full":
        return max(requests // 75, 2 * concurrency)
    return requests // 3


def warm_up_requests(model: str) -> int:
    return 5 if model == "resnet50_full" else 20


def build_repository(root: Path, server: str = "ours") -> Path:
    """The models ``server`` serves: Triton gets the Python-backend ones, we get those and ``add_sub_onnx``."""
    import torch

    from examples.build_models import build_add_sub_onnx

    models = (("add_sub_batch", ADD_SUB, ADD_SUB_CONFIG), ("identity_big", IDENTITY, IDENTITY_CONFIG),
              ("resnet50_pt", RESNET, RESNET_CONFIG), ("resnet50_full", RESNET, RESNET_FULL_CONFIG))
    for name, source, config in models:
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(textwrap.dedent(source).lstrip())
        (root / name / "config.pbtxt").write_text(textwrap.dedent(config).lstrip())
    if server == "ours":
        build_add_sub_onnx(root / "add_sub_onnx" / "1" / "model.onnx", dims=4)
        (root / "add_sub_onnx" / "config.pbtxt").write_text(textwrap.dedent(ADD_SUB_ONNX_CONFIG).lstrip())
    torch.manual_seed(0)
    torch.jit.script(_conv_stand_in().eval()).save(str(root / "resnet50_pt" / "1" / "model.pt"))
    torch.manual_seed(0)
    torch.jit.script(resnet50_module().eval()).save(str(root / "resnet50_full" / "1" / "model.pt"))
    return root


def expected_outputs(model: str, inputs: list[np.ndarray], repository: Path) -> dict[str, np.ndarray]:
    """What ``model`` answers to ``inputs`` (a TorchScript model run from ``repository``'s file, in this process)."""
    if model in ("add_sub_batch", "add_sub_onnx"):
        return {"OUTPUT0": inputs[0] + inputs[1], "OUTPUT1": inputs[0] - inputs[1]}
    if model == "identity_big":
        return {"OUTPUT0": inputs[0]}
    import torch

    module = torch.jit.load(str(repository / model / "1" / "model.pt"))
    with torch.no_grad():
        return {"OUTPUT__0": module(torch.from_numpy(inputs[0])).numpy()}


def answer_problem(expected: np.ndarray, got: np.ndarray) -> str | None:
    """Why ``got`` is not ``expected`` (None when it is): exact, but within 1e-3 of the largest value for a float
    result a convolution computes (the order of its sums depends on the threads and the batch it ran in)."""
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return f"shape {list(got.shape)} {got.dtype}, expected {list(expected.shape)} {expected.dtype}"
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    error = float(np.abs(got - expected).max()) if expected.size else 0.0
    return None if error <= 1e-3 * scale + 1e-6 else f"off by {error:.3g} (largest value {scale:.3g})"


def _conv_stand_in():
    import torch

    class ConvStandIn(torch.nn.Module):  # a conv stem, pool and linear: [N,3,H,W] -> [N,1000]
        def __init__(self) -> None:
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 32, kernel_size=7, stride=4, padding=3)
            self.fc = torch.nn.Linear(32, 1000)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.relu(self.stem(x)).mean(dim=(2, 3)))

    return ConvStandIn()


def resnet50_module():
    """ResNet-50 as torchvision builds it (v1.5: the stride on the 3x3 convolution), without torchvision."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, inplanes: int, planes: int, stride: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3, self.bn3 = nn.Conv2d(planes, planes * 4, 1, bias=False), nn.BatchNorm2d(planes * 4)
            self.downsample: nn.Module = (
                nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False),
                              nn.BatchNorm2d(planes * 4))
                if stride != 1 or inplanes != planes * 4 else nn.Identity())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.relu(self.bn1(self.conv1(x)))
            out = torch.relu(self.bn2(self.conv2(out)))
            return torch.relu(self.bn3(self.conv3(out)) + self.downsample(x))

    class ResNet50(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                                      nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))
            blocks, inplanes = [], 64
            for planes, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                for index in range(count):
                    blocks.append(Bottleneck(inplanes, planes, stride if index == 0 else 1))
                    inplanes = planes * 4
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(2048, 1000)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))

    return ResNet50()
