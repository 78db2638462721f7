"""Triton's repository layout, as every layer reads it (the object-storage sync too, which imports nothing heavier):
model folders hold config.pbtxt, version folders are positive decimal numbers, and a model's file lies in one of
them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PYTHON_MODEL_FILE = "model.py"
CONFIG_FILE = "config.pbtxt"
MAX_CONFIG_BYTES = 1 << 20
# With auto-complete on, a model holding one of these may come without config.pbtxt (as in Triton).
CONFIG_OPTIONAL_MODEL_FILES = (PYTHON_MODEL_FILE, "model.onnx")
# handler name (runtime/config/pbtxt.py) -> the model file (or folder) a version holds unless the config names another
DEFAULT_MODEL_FILENAMES = {"onnxruntime": "model.onnx", "pytorch": "model.pt", "python": PYTHON_MODEL_FILE,
                           "openvino": "model.xml", "tensorflow_savedmodel": "model.savedmodel",
                           "tensorflow_graphdef": "model.graphdef", "tensorrt": "model.plan"}
_HANDLER_BY_MODEL_FILE = {file: handler for handler, file in DEFAULT_MODEL_FILENAMES.items()}


def is_model_folder_name(name: str) -> bool:
    return bool(name) and not name.startswith(".") and name not in ("..",)


def is_version_folder_name(name: str) -> bool:
    """Triton version folders are positive decimal integers."""
    return name.isascii() and name.isdigit() and int(name) > 0


def newest_model_file(model_dir: Path, file_name: str) -> Path | None:
    """``<N>/<file_name>`` of the newest version holding it (what auto-complete reads), inside ``model_dir``."""
    versions = sorted((int(p.name) for p in model_dir.iterdir() if p.is_dir() and is_version_folder_name(p.name)),
                      reverse=True)
    for version in versions:
        path = model_dir / str(version) / file_name
        if path.is_file() and path.resolve().is_relative_to(model_dir.resolve()):
            return path
    return None


def handlers_listed(relative_paths: Iterable[str]) -> set[str]:
    """The handlers a repository's listing suggests (paths relative to its root, ``<model>/<version>/<file>...``):
    each version's default model file names one, and a model holding ``model.py`` is a Python model whatever
    else it holds (a TorchScript file its code loads, say). A guess, for work done ahead only: a config may name
    another file or platform."""
    by_model: dict[str, set[str]] = {}
    for relative in relative_paths:
        parts = relative.split("/")
        if len(parts) >= 3 and is_version_folder_name(parts[1]) and parts[2] in _HANDLER_BY_MODEL_FILE:
            by_model.setdefault(parts[0], set()).add(_HANDLER_BY_MODEL_FILE[parts[2]])
    return {handler for handlers in by_model.values()
            for handler in ({"python"} if "python" in handlers else handlers)}
