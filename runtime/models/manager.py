"""Loads the repository's models, reloads them as the repository changes, and resolves lookups."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from runtime.config.ensemble_config import load_order
from runtime.config.layout import CONFIG_FILE
from runtime.config.spec import ENSEMBLE, ModelSpec
from runtime.errors import ModelLoadError
from runtime.handler import DEFAULT_EXECUTE_TIMEOUT_SECONDS, HandlerContext, HandlerRegistry, ServerServices
from runtime.models.ensemble_version import EnsembleVersion
from runtime.models.lookup import LoadedModels, ModelEntry
from runtime.models.model import UNLOADED, ModelState, ModelVersion
from runtime.models.repository import ModelRepository
from runtime.scheduling.ensemble import check_composing_models
from runtime.scheduling.rate_limiter import RateLimiter
from runtime.scheduling.scheduler import DEFAULT_MAX_QUEUE_SIZE
from runtime.scheduling.sequence import DEFAULT_SLOT_TIMEOUT_SECONDS
from runtime.scheduling.wait_graph import WaitGraph

logger = logging.getLogger(__name__)


class ModelManager(LoadedModels):
    """Owns every loaded model (loading, reloading, retiring; the lookups are :class:`LoadedModels`'); knows
    nothing of protocols."""

    def __init__(
        self,
        repository: ModelRepository,
        use_gpu: bool = True,
        load_concurrency: int = 4,
        drain_timeout: float = 30.0,
        max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
        sequence_slot_timeout: float = DEFAULT_SLOT_TIMEOUT_SECONDS,
        execute_timeout: float = DEFAULT_EXECUTE_TIMEOUT_SECONDS,
        rate_limiter: RateLimiter | None = None,
        handlers: HandlerRegistry | None = None,
        environments_dir: Path | None = None,
    ) -> None:
        super().__init__(repository)
        self.environments_dir = environments_dir  # where Python models' packed environments are unpacked
        self.handlers = handlers  # the backends' registry (handler name -> class), from the composition root
        self.rate_limiter = rate_limiter  # --rate-limit=execution_count: shared by every model version
        self.max_queue_size = max_queue_size
        self.sequence_slot_timeout = sequence_slot_timeout
        self.execute_timeout = execute_timeout
        self.waits = WaitGraph()  # every version's executions and the waits between them (BLS cycles)
        self.use_gpu = use_gpu
        self.drain_timeout = drain_timeout
        self._load_slots = asyncio.Semaphore(load_concurrency)
        self._model_locks: dict[str, asyncio.Lock] = {}
        self._retiring: set[asyncio.Task] = set()
        self.drain_incomplete = False  # some retired version still had requests in flight at its deadline
        self.services: ServerServices | None = None  # what models may call (BLS, ...); set by the core
        self.retire_hooks: list[Callable[[ModelVersion], None]] = []  # told of each version being retired

    # -- loading and reloading -------------------------------------------------
    async def load_all(self) -> None:
        """Load every model of the repository; failures are recorded, never raised."""
        await self._load_in_order(self.repository.model_names())

    async def _load_in_order(self, names: list[str]) -> None:
        """Load ``names`` concurrently, except that an ensemble loads after the models its steps call."""
        for batch in load_order(names, self.ensemble_dependencies):
            await asyncio.gather(*(self.load_model(name) for name in batch))

    def _never_loaded_or_unloaded(self, name: str) -> bool:
        """Not loaded yet, or every version unloaded on purpose (a model that failed to load is not retried)."""
        entry = self.models.get(name)
        return entry is None or (bool(entry.versions) and all(m.retired for m in entry.versions.values()))

    def ensemble_dependencies(self, name: str) -> list[str]:
        """The models an ensemble's config says it calls ([] for any other model, or a config that does not
        read: loading it will say why)."""
        try:
            config = self.repository.raw_config(name)
        except ModelLoadError:
            return []
        if config.platform != ENSEMBLE:
            return []
        return list(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step))

    async def reconcile(self) -> None:
        """Bring loaded models in line with the repository: load new, reload changed, unload removed."""
        on_disk = set(self.repository.model_names())
        for name in sorted(set(self.models) - on_disk):
            if not self.models[name].removed:
                await self.unload_model(name)
                self.models[name].removed = True  # as Triton: unlisted, but 'has no available versions'
        changed = [name for name in sorted(on_disk) if self._changed(name)]
        await self._load_in_order(changed)

    def _changed(self, name: str) -> bool:
        entry = self.models.get(name)
        if entry is None:
            return True
        if entry.config_digest != self._config_digest(name):
            return True
        spec = entry.spec
        if spec is None:
            return False
        try:
            wanted = self.repository.select_versions(spec)
        except ModelLoadError:
            return bool(entry.attempted)
        return entry.attempted != {v: self._version_signature(name, v) for v in wanted}

    def _config_digest(self, name: str) -> str:
        try:
            return hashlib.sha256((self.repository.model_dir(name) / CONFIG_FILE).read_bytes()).hexdigest()
        except OSError:
            return ""

    def _version_signature(self, name: str, version: int) -> str:
        folder = self.repository.model_dir(name) / str(version)
        digest = hashlib.sha256()
        try:
            for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
                stat = path.stat()
                digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        except OSError:
            return ""
        return digest.hexdigest()

    async def load_model(self, name: str, config_override: str | None = None) -> ModelEntry:
        """(Re)load a model from the repository (``config_override``: a JSON config used instead of its
        config.pbtxt, as Triton's load ``config`` parameter; the files still come from the repository).

        New or changed versions load beside the serving ones and take traffic only once
        ready; versions no longer wanted drain, then unload.  If any new version fails,
        the versions already serving stay, and the failure shows in the index.
        """
        for dependency in self.ensemble_dependencies(name) if config_override is None else ():
            if self._never_loaded_or_unloaded(dependency) and dependency in self.repository.model_names():
                await self.load_model(dependency)  # as Triton: loading an ensemble loads what it calls
        lock = self._model_locks.setdefault(name, asyncio.Lock())
        async with lock, self._load_slots:
            return await self._load_model_locked(name, config_override)

    async def _load_model_locked(self, name: str, config_override: str | None = None) -> ModelEntry:
        old = self.models.get(name)
        serving = {v: m for v, m in old.versions.items() if m.in_service} if old else {}
        digest = (hashlib.sha256(config_override.encode()).hexdigest() if config_override is not None
                  else self._config_digest(name))
        started = time.perf_counter()
        external = self.external_failures.get(name)
        try:
            if external and not self.repository.model_dir(name).exists():
                raise ModelLoadError(external)
            spec = await asyncio.to_thread(self.repository.read_spec, name, config_override)
            versions = self.repository.select_versions(spec)
            if spec.is_ensemble:
                spec = check_composing_models(spec, self.loaded_spec)
        except ModelLoadError as exc:
            return self._record_failure(name, old, serving, str(exc), digest)
        config_same = old is not None and old.spec is not None and old.spec.proto == spec.proto
        fresh: dict[int, ModelVersion] = {}
        attempted = {v: self._version_signature(name, v) for v in versions}
        for version, signature in attempted.items():
            current = serving.get(version)
            if config_same and current is not None and current.signature == signature:
                fresh[version] = current
                continue
            fresh[version] = await self._load_version(spec, version, signature, started)
        failed = {v: m for v, m in fresh.items() if not m.in_service}
        if failed and serving:
            reasons = "; ".join(f"version {v}: {m.reason}" for v, m in failed.items())
            logger.error("model '%s': new version(s) failed, the serving ones stay: %s", name, reasons)
            for model_version in fresh.values():
                if model_version.in_service and model_version not in serving.values():
                    self._retire(model_version)
            assert old is not None  # versions are serving: the model was loaded before
            entry = ModelEntry(name=name, spec=old.spec, versions=dict(serving), config_digest=digest,
                               attempted=attempted, reason=f"reload failed: {reasons}",
                               version_errors={v: m.reason for v, m in failed.items()})
            for version, model_version in failed.items():
                entry.versions.setdefault(version, model_version)
            self.models[name] = entry
            return entry
        entry = ModelEntry(name=name, spec=spec, versions=fresh, config_digest=digest, attempted=attempted,
                           version_errors={v: m.reason for v, m in failed.items()})
        self.models[name] = entry
        for version, model_version in (old.versions.items() if old else ()):
            if model_version in fresh.values():
                continue
            if model_version.in_service or model_version.retired:  # listed as 'unloaded', as Triton does
                entry.versions.setdefault(version, model_version)
            if model_version.loaded or model_version.in_service:
                self._retire(model_version)
        return entry

    async def _load_version(self, spec: ModelSpec, version: int, signature: str, started: float) -> ModelVersion:
        for warning in spec.ignored_fields:
            logger.warning("%s", warning)
        version_type = EnsembleVersion if spec.is_ensemble else ModelVersion
        model_version = version_type(spec=spec, version=version, signature=signature,
                                     max_queue_size=self.max_queue_size,
                                     sequence_slot_timeout=self.sequence_slot_timeout, waits=self.waits,
                                     rate_limiter=self.rate_limiter, handlers=self.handlers,
                                     model_dir=self.repository.model_dir(spec.name))
        if isinstance(model_version, EnsembleVersion):
            model_version.services = self.services
        contexts = [
            HandlerContext(
                spec=spec,
                version=version,
                repository_dir=self.repository.root,
                instance_index=index,
                use_gpu=self.use_gpu,
                device_id=device_id,
                instance_name=instance_name,
                kind=kind,
                services=self.services,
                execute_timeout=self.execute_timeout,
                environments_dir=self.environments_dir,
            )
            for index, (instance_name, kind, device_id) in enumerate(_instances(spec))
        ]
        await asyncio.to_thread(model_version.load, contexts)
        if model_version.loaded:
            model_version.start()
            model_version.load_seconds = time.perf_counter() - started
            logger.info(
                "loaded model '%s' version %d (%s, %d instance(s) on %s) in %.2fs",
                spec.name, version, spec.handler, len(model_version.instances),
                model_version.device, model_version.load_seconds,
            )
        else:
            logger.error("model '%s' version %d UNAVAILABLE: %s", spec.name, version, model_version.reason)
        return model_version

    def _record_failure(self, name: str, old: ModelEntry | None, serving: dict, reason: str,
                        digest: str) -> ModelEntry:
        if serving:
            assert old is not None  # versions are serving: the model was loaded before
            logger.error("model '%s': reload failed, the serving versions stay: %s", name, reason)
            old.reason = f"reload failed: {reason}"
            old.config_digest = digest
            old.config_error, old.version_errors = reason, {}
            return old
        entry = ModelEntry(name=name, reason=reason, config_digest=digest, config_error=reason)
        if old is not None:
            entry.versions = {v: m for v, m in old.versions.items() if not m.loaded}
        self.models[name] = entry
        logger.error("model '%s' UNAVAILABLE: %s", name, reason)
        return entry

    def _retire(self, model_version: ModelVersion, deadline: float | None = None) -> None:
        """Stop routing to a version, let its in-flight requests finish, then unload it.

        Draining and finalizing together take at most ``drain_timeout`` (or until ``deadline``,
        a ``time.monotonic()`` value); instances still busy then are killed.
        """
        if model_version.state is ModelState.READY:
            model_version.state = ModelState.UNLOADING
        for hook in self.retire_hooks:
            hook(model_version)
        if deadline is None:
            deadline = time.monotonic() + self.drain_timeout
        task = asyncio.create_task(self._drain_and_unload(model_version, deadline))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _drain_and_unload(self, model_version: ModelVersion, deadline: float) -> None:
        if not await model_version.drain(max(0.0, deadline - time.monotonic())):
            self.drain_incomplete = True
            logger.warning("model '%s' version %d: in-flight requests did not finish in time",
                           model_version.name, model_version.version)
        await model_version.stop(deadline)
        logger.info("unloaded model '%s' version %d", model_version.name, model_version.version)

    async def unload_model(self, name: str) -> None:
        """Unload every version of a model (draining first); its versions stay in the index as 'unloaded' (as in
        Triton).  Unloading a model that is not loaded does nothing, as in Triton."""
        lock = self._model_locks.setdefault(name, asyncio.Lock())
        async with lock:
            entry = self.models.get(name)
            if entry is None:
                return
            self.models[name] = ModelEntry(name=name, spec=entry.spec, reason=UNLOADED, config_digest=UNLOADED,
                                           versions=dict(entry.versions))
            for model_version in entry.versions.values():
                if model_version.loaded or model_version.in_service:
                    self._retire(model_version)
            await self.wait_retired()

    async def wait_retired(self) -> None:
        """Wait for every version being retired to finish unloading."""
        while self._retiring:
            await asyncio.gather(*list(self._retiring), return_exceptions=True)

    async def unload_all(self, deadline: float | None = None) -> None:
        """Drain in-flight requests, then unload (finalize) every model version, all by ``deadline``."""
        for entry in self.models.values():
            for model_version in entry.versions.values():
                if model_version.loaded and model_version.state is not ModelState.UNLOADING:
                    self._retire(model_version, deadline)  # those already UNLOADING are being retired
        await self.wait_retired()


def _instances(spec: ModelSpec) -> list[tuple[str, str, int]]:
    """(name, kind, device id) of every instance, group by group."""
    return [(name, group.kind, device) for group in spec.instance_groups for name, device in group.placed()]
