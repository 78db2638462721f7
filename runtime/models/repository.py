"""A local model repository in Triton's layout: ``<root>/<model>/config.pbtxt``, ``<root>/<model>/<N>/``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from runtime.config.config_text import read_model_config
from runtime.config.layout import (
    CONFIG_FILE,
    CONFIG_OPTIONAL_MODEL_FILES,
    MAX_CONFIG_BYTES,
    is_model_folder_name,
    is_version_folder_name,
)
from runtime.config.pbtxt import read_model_config_json, spec_from_config
from runtime.config.spec import ModelSpec
from runtime.errors import ModelLoadError
from runtime.protocol.model_config_pb2 import ModelConfig

# Completes a model's config as written (Triton's auto-complete: a Python model's auto_complete_config, an ONNX
# model's graph).
ConfigCompleter = Callable[[ModelConfig, Path], ModelConfig]

# As Triton: a config naming neither platform nor backend gets them from the model file found (the newest
# version first): (file name or suffix, platform, backend).
_BACKEND_BY_MODEL_FILE = (
    ("model.onnx", ".onnx", "onnxruntime_onnx", "onnxruntime"),
    ("model.pt", ".pt", "pytorch_libtorch", "pytorch"),
    ("model.py", ".py", "", "python"),
    ("model.xml", ".xml", "", "openvino"),
    ("model.plan", ".plan", "tensorrt_plan", "tensorrt"),
    ("model.savedmodel", ".savedmodel", "tensorflow_savedmodel", "tensorflow"),
    ("model.graphdef", ".graphdef", "tensorflow_graphdef", "tensorflow"),
)


class ModelRepository:
    """Reads model folders of a repository on local disk; never follows client input."""

    def __init__(self, root: Path | str, gpu_count: int = 0, completer: ConfigCompleter | None = None) -> None:
        self.root = Path(root).resolve()
        self.gpu_count = gpu_count  # KIND_AUTO and default instance groups resolve against it
        self.completer = completer  # None: configs are used as written, and every model needs one

    def model_names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            entry.name
            for entry in self.root.iterdir()
            if entry.is_dir() and is_model_folder_name(entry.name) and self._inside(entry)
        )

    def _inside(self, path: Path) -> bool:
        """True if ``path`` resolves inside the repository (refuses symlinks out of it)."""
        return path.resolve().is_relative_to(self.root)

    def model_dir(self, name: str) -> Path:
        return self.root / name

    def read_spec(self, name: str, config_override: str | None = None) -> ModelSpec:
        """Parse the model's config.pbtxt (or ``config_override``, a JSON config a load request gives in its
        place), completed by the completer (if any), as Triton completes either; ModelLoadError with the reason on
        failure.  With a completer, a Python or ONNX model (``<N>/model.py``, ``<N>/model.onnx``) may come without
        a config, as in Triton."""
        if config_override is not None:
            config = read_model_config_json(config_override, name)
        else:
            config = self.raw_config(name)
        self._detect_backend(config, name)
        if self.completer is not None:
            config = self.completer(config, self.model_dir(name))
        return spec_from_config(config, name, self.gpu_count)

    def gpu_placement(self, name: str) -> dict[int, int]:
        """How many instances of a model would run on each GPU, from its config; empty without GPUs or when its
        config cannot be read (its load will say why)."""
        if not self.gpu_count:
            return {}
        try:
            spec = self.read_spec(name)
        except ModelLoadError:
            return {}
        return dict(Counter(device for group in spec.instance_groups if group.kind != "KIND_CPU"
                            for _, device in group.placed()))

    def raw_config(self, name: str) -> ModelConfig:
        """The model's config as written (nothing completed or filled in); ModelLoadError if it cannot be read."""
        config_path = self.model_dir(name) / CONFIG_FILE
        if not config_path.exists() and self.completer is not None and self._has_config_optional_file(name):
            return ModelConfig(name=name)  # platform and backend: from the model file (read_spec)
        if not config_path.is_file() or not self._inside(config_path):
            raise ModelLoadError(f"model '{name}': no {CONFIG_FILE}")
        if config_path.stat().st_size > MAX_CONFIG_BYTES:
            raise ModelLoadError(f"model '{name}': {CONFIG_FILE} is larger than {MAX_CONFIG_BYTES} bytes")
        try:
            text = config_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"model '{name}': cannot read {CONFIG_FILE}: {exc.__class__.__name__}") from None
        return read_model_config(text, name)

    def _detect_backend(self, config: ModelConfig, name: str) -> None:
        """Fill in platform and backend from the model file, when the config names neither."""
        if config.platform or config.backend:
            return
        wanted = config.default_model_filename
        if wanted and ("/" in wanted or "\\" in wanted or wanted in (".", "..")):
            return  # an invalid file name: the config check says so
        for version in reversed(self.versions_on_disk(name)):
            folder = self.model_dir(name) / str(version)
            for file_name, suffix, platform, backend in _BACKEND_BY_MODEL_FILE:
                if (wanted and wanted.endswith(suffix) and (folder / wanted).exists()) or (
                        not wanted and (folder / file_name).exists()):
                    config.platform, config.backend = platform, backend
                    return

    def _has_config_optional_file(self, name: str) -> bool:
        return any((self.model_dir(name) / str(v) / file_name).is_file() for v in self.versions_on_disk(name)
                   for file_name in CONFIG_OPTIONAL_MODEL_FILES)

    def versions_on_disk(self, name: str) -> list[int]:
        folder = self.model_dir(name)
        return sorted(
            int(entry.name)
            for entry in folder.iterdir()
            if entry.is_dir() and is_version_folder_name(entry.name) and self._inside(entry)
        )

    def select_versions(self, spec: ModelSpec) -> list[int]:
        """The versions the config's version_policy picks from those on disk."""
        on_disk = self.versions_on_disk(spec.name)
        selected = spec.version_policy.select(on_disk)
        if not selected:
            raise ModelLoadError(
                f"model '{spec.name}': no version folder matches its version_policy "
                f"(on disk: {on_disk or 'none'})"
            )
        return selected
