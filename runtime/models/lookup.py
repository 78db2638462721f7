"""The loaded models and what is read of them: which version a request goes to (in Triton's words when none can
take it), the repository index, readiness.

:class:`~runtime.models.manager.ModelManager` loads, reloads and retires what :class:`LoadedModels` holds; every
request's lookup (``get``, asked once a request, and ``serving_spec``, asked before it) reads only this table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from runtime.config.ensemble_config import composing_models
from runtime.config.spec import ModelSpec
from runtime.errors import InvalidArgument, NotFound, Unavailable
from runtime.models.model import UNLOADED, ModelState, ModelVersion
from runtime.models.repository import ModelRepository

_LEADING_INTEGER = re.compile(r"\s*[+-]?\d+")


@dataclass
class ModelEntry:
    """A model folder: its config (if it parsed) and its versions."""

    name: str
    spec: ModelSpec | None = None
    reason: str = ""
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    config_digest: str = ""  # config.pbtxt as of the last load attempt
    attempted: dict[int, str] = field(default_factory=dict)  # version -> folder signature, last attempt
    config_error: str = ""  # why the last load attempt could not use the config
    version_errors: dict[int, str] = field(default_factory=dict)  # version -> why it failed, last attempt
    removed: bool = False  # its folder left the repository: unloaded, and no longer listed

    def ready_versions(self) -> list[int]:
        return sorted(v for v, m in self.versions.items() if m.ready)

    def newest_ready(self) -> ModelVersion | None:
        """The ready version with the highest number, if any."""
        if len(self.versions) == 1:  # the common case, without sorting
            (only,) = self.versions.values()
            return only if only.ready else None
        ready = self.ready_versions()
        return self.versions[ready[-1]] if ready else None


class LoadedModels:
    """Every model folder the server has tried to load, by name, and what requests, ensembles and the repository
    endpoints read of them."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self.models: dict[str, ModelEntry] = {}
        self.external_failures: dict[str, str] = {}  # model -> reason, from outside (e.g. storage sync)
        self.listed_elsewhere: set[str] = set()  # models of object storage not synced yet (on-demand loading)

    def dependents(self, name: str) -> list[str]:
        """The loaded ensembles that call ``name``, directly or through other ensembles (callers last)."""
        found: list[str] = []
        frontier = [name]
        while frontier:
            callee = frontier.pop()
            for entry in self.models.values():
                spec = entry.spec
                if (spec is not None and spec.is_ensemble and entry.name not in found and entry.name != name
                        and callee in composing_models(spec.steps)
                        and any(m.in_service for m in entry.versions.values())):
                    found.append(entry.name)
                    frontier.append(entry.name)
        return found

    def loaded_spec(self, name: str, version: int) -> ModelSpec | None:
        """The config of a ready model version (``version`` -1: the newest), None if there is none."""
        entry = self.models.get(name)
        if entry is None or entry.spec is None:
            return None
        model_version = entry.newest_ready() if version < 0 else entry.versions.get(version)
        return model_version.spec if model_version is not None and model_version.ready else None

    def serving_spec(self, name: str, version: str = "") -> ModelSpec | None:
        """The config of the version a request for ``name`` goes to, when that is plain: the version asked for,
        or the model's only one, in service (its readiness not asked: :meth:`get` does that for the request
        itself).  None otherwise (unknown, not in service, several versions without one asked for)."""
        entry = self.models.get(name)
        if entry is None:
            return None
        versions = entry.versions
        if version:
            plain = len(version) < 19 and version.isascii() and version.isdigit()
            model_version = versions.get(int(version)) if plain else None
        elif len(versions) == 1:
            (model_version,) = versions.values()
        else:
            return None
        return model_version.spec if model_version is not None and model_version.in_service else None

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The ready version asked for (or the newest ready one), in Triton's words when there is none:
        NotFound for an unknown or failed model or version, Unavailable while a loaded version's instances
        are all being restarted; our reason follows Triton's text."""
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        number = parse_version(version)
        if entry.spec is None:  # its config did not parse: Triton never knew the model
            raise NotFound(f"Request for unknown model: '{name}' is not found" + _detail(entry.reason))
        if number is not None:
            model_version = entry.versions.get(number)
            if model_version is None:
                raise NotFound(f"Request for unknown model: '{name}' version {number} is not found")
            if not model_version.ready:
                error = Unavailable if model_version.in_service else NotFound  # 503: its workers are restarting
                raise error(f"Request for unknown model: '{name}' version {number} is not at ready state"
                            + _detail(model_version.status()[1]))
            return model_version
        newest = entry.newest_ready()
        if newest is None:
            reason = entry.reason or "; ".join(r for m in entry.versions.values() if (r := m.status()[1]))
            error = Unavailable if any(m.in_service for m in entry.versions.values()) else NotFound
            raise error(f"Request for unknown model: '{name}' has no available versions" + _detail(reason))
        return newest

    def entry(self, name: str) -> ModelEntry:
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return entry

    def index(self) -> list[dict]:
        """Triton's repository index: one row per model version (or per failed model)."""
        rows: list[dict] = []
        names = (set(self.repository.model_names()) | set(self.models) | set(self.external_failures)
                 | self.listed_elsewhere)
        for name in sorted(names):
            entry = self.models.get(name)
            if entry is not None and entry.removed:
                continue
            if entry is None:
                reason = self.external_failures.get(name, "")
                rows.append({"name": name, "state": ModelState.UNAVAILABLE.value, "reason": reason} if reason
                            else {"name": name})
            elif not entry.versions:
                rows.append({"name": name, "state": ModelState.UNAVAILABLE.value, "reason": entry.reason})
            else:
                for version, model_version in sorted(entry.versions.items()):
                    state, reason = model_version.status()
                    row = {"name": name, "version": str(version), "state": state}
                    rows.append(row | {"reason": reason} if reason else row)
        return rows

    def ready_model_versions(self) -> list[ModelVersion]:
        """Every version that is ready now (unloaded or retired ones not)."""
        return [m for entry in self.models.values() for m in entry.versions.values() if m.ready and not m.retired]

    def all_ready(self) -> bool:
        """Whether every model the server tried to load (and was not told to unload) is ready."""
        for name in set(self.models) | set(self.external_failures):
            entry = self.models.get(name)
            if entry is None or not entry.ready_versions():
                if entry is None or entry.reason != UNLOADED:
                    return False
                continue
            if any(not m.ready for m in entry.versions.values() if not m.retired):
                return False
        return True

    def require_known(self, name: str) -> None:
        """Explicit loads take only model names that are folders of the repository."""
        if name not in self.repository.model_names() and name not in self.models:
            raise InvalidArgument(f"failed to load '{name}': no such model folder in the repository")


def parse_version(version: str) -> int | None:
    """A requested version as Triton reads it (C++ ``stol``: the leading integer); None for the newest."""
    if not version:
        return None
    match = _LEADING_INTEGER.match(version)
    if match is None:
        raise InvalidArgument(f"failed to get model version from specified version string '{version[:64]}' "
                              "(details: stol), version should be an integral value > 0")
    number = int(match.group(0))
    return None if number == -1 else number


def _detail(reason: str) -> str:
    return f": {reason}" if reason else ""
