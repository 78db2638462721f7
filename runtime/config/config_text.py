"""``config.pbtxt`` text read into Triton's ModelConfig message, and the version policy it sets: with protobuf alone.
The object-storage sync chooses a model's versions from its config before it downloads them, in the cold start's
early child (bootstrap/early_sync.py), where the rest of a config's reading (runtime/config/pbtxt.py, with numpy and
the config's vocabulary) cost 100-150 ms of imports on the first answer's path."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import text_format

from runtime.errors import ModelLoadError
from runtime.protocol import model_config_pb2


@dataclass(frozen=True)
class VersionPolicy:
    """Which numbered versions to serve: ``latest`` n, ``all``, or ``specific`` ones."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        """The versions to load, ascending, out of those on disk."""
        ordered = sorted(set(available))
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.num_versions :] if self.num_versions > 0 else []


def read_model_config(text: str, folder_name: str) -> model_config_pb2.ModelConfig:
    """``config.pbtxt`` text as a ModelConfig, as written (nothing filled in)."""
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ModelLoadError(f"model '{folder_name}': config.pbtxt syntax error: {exc}") from None
    return config


def version_policy(config: model_config_pb2.ModelConfig) -> VersionPolicy:
    """The versions ``config`` asks for (the newest one where it says nothing)."""
    which = config.version_policy.WhichOneof("policy_choice")
    if which == "all":
        return VersionPolicy(kind="all")
    if which == "specific":
        return VersionPolicy(kind="specific", versions=tuple(config.version_policy.specific.versions))
    if which == "latest":
        return VersionPolicy(kind="latest", num_versions=config.version_policy.latest.num_versions)
    return VersionPolicy()


def version_policy_of(text: str, folder_name: str) -> VersionPolicy:
    """Only the version policy of a config's text (what a sync needs to choose versions); ModelLoadError if the
    text does not parse. The rest is checked when the model loads."""
    return version_policy(read_model_config(text, folder_name))
