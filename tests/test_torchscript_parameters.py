"""TorchScript parameters as Triton's pytorch backend names them, applied by the real handler on real torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from examples.build_models import build_linear_torchscript
from handlers.base import HandlerContext
from handlers.torchscript import TorchScriptHandler
from runtime.config.pbtxt import parse_model_config
from runtime.errors import ModelLoadError

CONFIG = """
    platform: "pytorch_libtorch"
    max_batch_size: 8
    input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def handler_for(tmp_path, parameters: dict[str, str]) -> TorchScriptHandler:
    text = CONFIG + "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
                            for k, v in parameters.items())
    build_linear_torchscript(tmp_path / "m" / "1" / "model.pt")
    handler = TorchScriptHandler(HandlerContext(parse_model_config(text, "m"), 1, tmp_path, use_gpu=False))
    handler.load()
    return handler


@pytest.fixture
def torch_settings():
    """Put back the process-wide settings the parameters change."""
    saved = (torch._C._get_graph_executor_optimize(), torch.get_num_threads())
    yield
    torch._C._set_graph_executor_optimize(saved[0])
    torch.set_num_threads(saved[1])


def test_process_wide_settings_and_grad_mode_follow_the_parameters(tmp_path, torch_settings):
    handler = handler_for(tmp_path, {"DISABLE_OPTIMIZED_EXECUTION": "true", "INTRA_OP_THREAD_COUNT": "1",
                                     "INFERENCE_MODE": "false", "ENABLE_NVFUSER": "true"})
    assert torch._C._get_graph_executor_optimize() is False
    assert torch.get_num_threads() == 1
    seen = []
    handler.module = _Recorder(handler.module, seen)
    outputs = handler.run({"INPUT__0": np.ones((2, 4), dtype=np.float32)})
    assert outputs["OUTPUT__0"].shape == (2, 3)
    assert seen == [(False, False)]  # no_grad, not inference_mode
    default = handler_for(tmp_path, {})
    default.module = _Recorder(default.module, seen)
    default.run({"INPUT__0": np.ones((1, 4), dtype=np.float32)})
    assert seen[-1] == (False, True)  # inference_mode, Triton's default


def test_bad_values_fail_the_load_with_the_parameter_named(tmp_path, torch_settings):
    with pytest.raises(ModelLoadError, match="parameter 'INFERENCE_MODE' must be true or false"):
        handler_for(tmp_path, {"INFERENCE_MODE": "sometimes"})
    with pytest.raises(ModelLoadError, match="parameter 'INTRA_OP_THREAD_COUNT' must be a positive whole number"):
        handler_for(tmp_path, {"INTRA_OP_THREAD_COUNT": "-2"})


class _Recorder:
    """Wraps the scripted module to record the grad mode each call runs under."""

    def __init__(self, module, seen: list) -> None:
        self.module, self.seen = module, seen

    def __call__(self, *arguments):
        self.seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        return self.module(*arguments)
