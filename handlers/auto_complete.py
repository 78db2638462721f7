"""Triton's auto-complete, per backend: a Python model's ``auto_complete_config``, an ONNX model's graph.

Each backend's completer is imported only when a model of that backend is completed.
"""

from __future__ import annotations

from pathlib import Path

from runtime.protocol.model_config_pb2 import ModelConfig


def complete_config(config: ModelConfig, model_dir: Path, environments_dir: Path | None = None) -> ModelConfig:
    """``config`` completed as its backend completes it in Triton (unchanged for other backends);
    ``environments_dir``: where a Python model's packed environment is unpacked to run its completer."""
    if config.backend == "python" and not config.platform:
        from handlers.python.auto_complete import complete_config as complete_python

        return complete_python(config, model_dir, environments_dir)
    if config.platform == "onnxruntime_onnx" or config.backend == "onnxruntime":
        from handlers.onnx.auto_complete import complete_onnx_config

        return complete_onnx_config(config, model_dir)
    return config
