"""The add/sub model (INPUT0, INPUT1 [batch, 16] FP32 -> OUTPUT0 = sum, OUTPUT1 = difference) in every backend this
server runs, each file made by its framework's own tools, so that a feature can be tested over all of them."""

from __future__ import annotations

from pathlib import Path

from examples.build_models import build_add_sub_onnx
from tests.support import write_model

PYTHON_ADD_SUB = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b),
                                                         pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
"""
# The config line naming each backend, as a Triton user writes it.
HEADERS = {
    "onnx": 'platform: "onnxruntime_onnx"',
    "torchscript": 'platform: "pytorch_libtorch"',
    "openvino": 'backend: "openvino"',
    "tensorflow": 'platform: "tensorflow_savedmodel"',
    "python": 'backend: "python"',
}
BACKENDS = tuple(HEADERS)


def write_ir(folder: Path) -> None:
    """The add/sub model as OpenVINO IR (model.xml + model.bin), converted from ONNX by OpenVINO itself."""
    import openvino as ov

    onnx_path = folder / "source.onnx"
    build_add_sub_onnx(onnx_path, datatype="FP32")
    ov.save_model(ov.convert_model(str(onnx_path)), str(folder / "model.xml"))
    onnx_path.unlink()


def _write_torchscript(path: Path) -> None:
    import torch

    class AddSub(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a + b, a - b

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(AddSub()), str(path))


def write_savedmodel(path: Path) -> None:
    """The add/sub model as a TensorFlow SavedModel (signature ``serving_default``, keys the config's names)."""
    import tensorflow as tf

    spec = [tf.TensorSpec([None, 16], tf.float32, name="INPUT0"), tf.TensorSpec([None, 16], tf.float32, name="INPUT1")]

    class AddSub(tf.Module):
        @tf.function(input_signature=spec)
        def serve(self, INPUT0, INPUT1):  # noqa: N803 - the signature's keys are the config's names
            return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}

    model = AddSub()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})


def write_model_files(folder: Path, backend: str) -> None:
    """Version 1 of the add/sub model in ``backend`` under ``folder`` (the model's folder)."""
    version = folder / "1"
    version.mkdir(parents=True, exist_ok=True)
    if backend == "onnx":
        build_add_sub_onnx(version / "model.onnx")
    elif backend == "torchscript":
        _write_torchscript(version / "model.pt")
    elif backend == "openvino":
        write_ir(version)
    elif backend == "tensorflow":
        write_savedmodel(version / "model.savedmodel")
    elif backend == "python":
        (version / "model.py").write_text(PYTHON_ADD_SUB)
    else:
        raise ValueError(f"no add/sub model for backend '{backend}'")


def config(backend: str, extra: str = "", output0: str = "") -> str:
    """The add/sub config for ``backend``, then ``extra``; ``output0``: more fields of OUTPUT0 (a label file)."""

    def tensor(name: str, more: str = "") -> str:
        return f'{{ name: "{name}" data_type: TYPE_FP32 dims: [ 16 ] {more}}}'

    return (f"{HEADERS[backend]}\nmax_batch_size: 8\n"
            f"input [ {tensor('INPUT0')}, {tensor('INPUT1')} ]\n"
            f"output [ {tensor('OUTPUT0', output0)}, {tensor('OUTPUT1')} ]\n{extra}")


def write_add_sub(repository: Path, name: str, backend: str, extra: str = "", output0: str = "",
                  files: dict[str, str | bytes] | None = None) -> Path:
    """``<repository>/<name>``: the add/sub model in ``backend`` with ``config(backend, extra, output0)``."""
    folder = write_model(repository, name, config(backend, extra, output0), files)
    write_model_files(folder, backend)
    return folder
