"""Triton's repository layout, as every layer reads it (the object-storage sync too, which imports nothing heavier):
model folders hold config.pbtxt, version folders are positive decimal numbers, and a model's file lies in one of
them."""

from __future__ import annotations

from pathlib import Path

PYTHON_MODEL_FILE = "model.py"
CONFIG_FILE = "config.pbtxt"
MAX_CONFIG_BYTES = 1 << 20
# With auto-complete on, a model holding one of these may come without config.pbtxt (as in Triton).
CONFIG_OPTIONAL_MODEL_FILES = (PYTHON_MODEL_FILE, "model.onnx")


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
