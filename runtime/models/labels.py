"""An output's label file (config.pbtxt's ``label_filename``), read when its model version loads: the labels the
classification extension (``runtime/extensions/classification.py``) puts beside each class it returns."""

from __future__ import annotations

from pathlib import Path

from runtime.errors import ModelLoadError


def load_labels(model_dir: Path, filename: str, output: str) -> list[str]:
    """The lines of an output's label file, which must lie inside the model's folder."""
    root = model_dir.resolve()
    path = (root / filename).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise ModelLoadError(f"label file '{filename}' of output '{output}' is not a file in the model's folder")
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise ModelLoadError(f"cannot read label file '{filename}' of output '{output}': {exc}") from None
