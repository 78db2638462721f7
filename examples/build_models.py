"""Build the example repository's model files (weights are generated, never downloaded).

    python -m examples.build_models [REPOSITORY]

Writes ``simple_onnx/1/model.onnx`` and ``simple_torch/1/model.pt`` into the
repository (default: examples/model_repository); configs and ``model.py`` files
are committed beside them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

EXAMPLE_REPOSITORY = Path(__file__).resolve().parent / "model_repository"

# The TorchScript example computes  y = x @ TORCH_WEIGHT + TORCH_BIAS.
TORCH_WEIGHT = (np.arange(12, dtype=np.float32).reshape(4, 3) / 10).astype(np.float32)
TORCH_BIAS = np.array([0.1, 0.2, 0.3], dtype=np.float32)


def save_onnx(graph, path: Path, check: bool = False) -> None:
    """Save an ONNX graph as a model (opset 17, IR version 8, which every onnxruntime here reads) at ``path``."""
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if check:
        onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def build_add_sub_onnx(path: Path, dims: int = 16, datatype: str = "FP32") -> None:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, inputs of shape [batch, dims]."""
    from onnx import TensorProto, helper

    element = {"FP32": TensorProto.FLOAT, "INT32": TensorProto.INT32}[datatype]
    shape = ["batch", dims]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        [helper.make_tensor_value_info(n, element, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, element, shape) for n in ("OUTPUT0", "OUTPUT1")],
    )
    save_onnx(graph, path, check=True)


def build_dense_onnx(path: Path, width: int = 1024, layers: int = 4, seed: int = 0) -> None:
    """A compute-bound MLP: ``layers`` MatMul+Relu of ``width`` x ``width`` (INPUT0 -> OUTPUT0)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, initializers = [], []
    current = "INPUT0"
    for index in range(layers):
        weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        initializers.append(numpy_helper.from_array(weight, f"W{index}"))
        nodes.append(helper.make_node("MatMul", [current, f"W{index}"], [f"M{index}"]))
        out = "OUTPUT0" if index == layers - 1 else f"R{index}"
        nodes.append(helper.make_node("Relu", [f"M{index}"], [out]))
        current = out
    graph = helper.make_graph(
        nodes,
        "dense",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", width])],
        initializer=initializers,
    )
    save_onnx(graph, path)


def build_linear_torchscript(path: Path) -> None:
    """A scripted ``y = x @ W + b`` with W, b from TORCH_WEIGHT / TORCH_BIAS."""
    import torch

    class Linear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.from_numpy(TORCH_WEIGHT.copy()), requires_grad=False)
            self.bias = torch.nn.Parameter(torch.from_numpy(TORCH_BIAS.copy()), requires_grad=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.weight + self.bias

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(Linear()), str(path))


TINY_LLM_SPECIAL_TOKENS = ["[UNK]", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_word_tokenizer(corpus: Path, path: Path) -> None:
    """A word-level tokenizer (Hugging Face ``tokenizers``) trained on ``corpus``, with ChatML's special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train([str(corpus)], trainers.WordLevelTrainer(special_tokens=TINY_LLM_SPECIAL_TOKENS))
    tokenizer.save(str(path))


def build_example_models(repository: Path = EXAMPLE_REPOSITORY) -> None:
    """Write the generated model files of the example repository."""
    build_add_sub_onnx(repository / "simple_onnx" / "1" / "model.onnx")
    build_linear_torchscript(repository / "simple_torch" / "1" / "model.pt")
    build_word_tokenizer(repository / "tiny_llm" / "corpus.txt", repository / "tiny_llm" / "tokenizer.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repository", nargs="?", type=Path, default=EXAMPLE_REPOSITORY)
    args = parser.parse_args()
    build_example_models(args.repository)
    print(f"built example models in {args.repository}")


if __name__ == "__main__":
    main()
