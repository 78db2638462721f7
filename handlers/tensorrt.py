"""TensorRT plans (``platform: "tensorrt_plan"``, ``model.plan``): they run only on an NVIDIA GPU.

On a host without one the model is UNAVAILABLE saying so. Running plans on a GPU host is not built yet (no GPU
has been available to build and test it): there too the model says so, rather than failing later.
"""

from __future__ import annotations

from handlers.base import ModelHandler
from runtime.devices import gpu_count
from runtime.errors import ModelLoadError


class TensorRtHandler(ModelHandler):
    def load(self) -> None:
        self.context.require_model_file()
        if not (self.context.use_gpu and gpu_count()):
            raise ModelLoadError("tensorrt_plan models run only on an NVIDIA GPU, and this host has none "
                                 "(or the server runs with --device cpu)")
        raise ModelLoadError("tensorrt_plan models are not served by this server yet: convert the model to ONNX "
                             "and use ONNX Runtime's tensorrt execution accelerator on this GPU")

    def execute(self, requests):  # never reached: load always fails
        raise NotImplementedError
