"""Loads the repository's models and resolves ``(name, version)`` lookups."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from handlers import HandlerContext
from runtime.config import ModelSpec
from runtime.errors import ModelLoadError, NotFound, Unavailable
from runtime.model import ModelState, ModelVersion
from runtime.repository import ModelRepository

logger = logging.getLogger(__name__)


@dataclass
class ModelEntry:
    """A model folder: its config (if it parsed) and its loaded versions."""

    name: str
    spec: ModelSpec | None = None
    reason: str = ""
    versions: dict[int, ModelVersion] = field(default_factory=dict)

    def ready_versions(self) -> list[int]:
        return sorted(v for v, m in self.versions.items() if m.ready)


class ModelManager:
    """Owns every loaded model; knows nothing of protocols."""

    def __init__(self, repository: ModelRepository, use_gpu: bool = True, load_concurrency: int = 4) -> None:
        self.repository = repository
        self.use_gpu = use_gpu
        self.models: dict[str, ModelEntry] = {}
        self._load_slots = asyncio.Semaphore(load_concurrency)

    async def load_all(self) -> None:
        """Load every model of the repository; failures are recorded, never raised."""
        names = self.repository.model_names()
        await asyncio.gather(*(self.load_model(name) for name in names))

    async def load_model(self, name: str) -> ModelEntry:
        async with self._load_slots:
            entry = ModelEntry(name=name)
            started = time.perf_counter()
            try:
                entry.spec = await asyncio.to_thread(self.repository.read_spec, name)
                versions = self.repository.select_versions(entry.spec)
            except ModelLoadError as exc:
                entry.reason = str(exc)
                self.models[name] = entry
                logger.error("model '%s' UNAVAILABLE: %s", name, entry.reason)
                return entry
            for version in versions:
                model_version = ModelVersion(spec=entry.spec, version=version)
                contexts = [
                    HandlerContext(
                        spec=entry.spec,
                        version=version,
                        repository_dir=self.repository.root,
                        instance_index=index,
                        use_gpu=self.use_gpu,
                        device_id=_device_id(entry.spec, index),
                    )
                    for index in range(entry.spec.instance_count)
                ]
                await asyncio.to_thread(model_version.load, contexts)
                if model_version.ready:
                    model_version.bind_loop()
                    logger.info(
                        "loaded model '%s' version %d (%s, %d instance(s) on %s) in %.2fs",
                        name, version, entry.spec.handler, len(model_version.instances),
                        model_version.device, time.perf_counter() - started,
                    )
                else:
                    logger.error(
                        "model '%s' version %d UNAVAILABLE: %s", name, version, model_version.reason
                    )
                entry.versions[version] = model_version
            self.models[name] = entry
            return entry

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The ready version asked for (or the newest ready one); NotFound / Unavailable otherwise."""
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        if version:
            if not (version.isascii() and version.isdigit()):
                raise NotFound(f"Request for unknown model: '{name}' version '{version}' is not found")
            model_version = entry.versions.get(int(version))
            if model_version is None:
                raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
            if not model_version.ready:
                raise Unavailable(
                    f"Request for unknown model: '{name}' version {version} is not at ready state"
                    + (f": {model_version.reason}" if model_version.reason else "")
                )
            return model_version
        ready = entry.ready_versions()
        if not ready:
            reason = entry.reason or "; ".join(m.reason for m in entry.versions.values() if m.reason)
            raise Unavailable(
                f"Request for unknown model: '{name}' has no available versions"
                + (f": {reason}" if reason else "")
            )
        return entry.versions[ready[-1]]

    def entry(self, name: str) -> ModelEntry:
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return entry

    def index(self) -> list[dict]:
        """Triton's repository index: one row per model version (or per failed model)."""
        rows: list[dict] = []
        for name in sorted(set(self.repository.model_names()) | set(self.models)):
            entry = self.models.get(name)
            if entry is None:
                rows.append({"name": name})
            elif not entry.versions:
                rows.append({"name": name, "state": ModelState.UNAVAILABLE.value, "reason": entry.reason})
            else:
                for version, model_version in sorted(entry.versions.items()):
                    rows.append(
                        {
                            "name": name,
                            "version": str(version),
                            "state": model_version.state.value,
                            "reason": model_version.reason,
                        }
                    )
        return rows

    async def unload_all(self, drain_timeout: float = 30.0) -> None:
        """Drain in-flight requests, then unload (finalize) every model version."""
        versions = [m for e in self.models.values() for m in e.versions.values()]
        for model_version in versions:
            if model_version.ready:
                model_version.state = ModelState.UNLOADING
        await asyncio.gather(*(m.drain(drain_timeout) for m in versions if m.instances))
        for model_version in versions:
            await asyncio.to_thread(model_version.unload)
            logger.info("unloaded model '%s' version %d", model_version.name, model_version.version)


def _device_id(spec: ModelSpec, instance_index: int) -> int:
    gpus = [gpu for group in spec.instance_groups for gpu in group.gpus]
    return gpus[instance_index % len(gpus)] if gpus else 0
