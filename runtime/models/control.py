"""Model control modes (Triton's ``--model-control-mode``): none, poll, explicit; and on_demand, ours (models load at
their first call: ``on_demand.py``), which also takes explicit loads and unloads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from runtime.config.layout import is_model_folder_name
from runtime.errors import InvalidArgument, Unavailable
from runtime.models.manager import ModelManager
from runtime.models.watch import RepositoryWatcher

logger = logging.getLogger(__name__)

MODES = ("none", "poll", "explicit", "on_demand")
ALL_MODELS = "*"
_DEBOUNCE_SECONDS = 0.5


class RepositorySource(Protocol):
    """Where the repository folder comes from (e.g. an object-storage sync). Methods block."""

    def refresh(self, model: str | None = None) -> dict[str, str]:
        """Bring the local folder up to date; returns {model: reason} for models that failed."""

    def prune(self) -> None:
        """Drop local copies nothing refers to any more."""

    def model_names(self) -> list[str]:
        """The models the source holds, listed without downloading them."""


class ModelControl:
    """Keeps loaded models in step with the repository, by polling or on explicit request."""

    def __init__(
        self,
        manager: ModelManager,
        mode: str = "none",
        poll_interval: float = 5.0,
        source: RepositorySource | None = None,
        startup_models: tuple[str, ...] = (),
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"model control mode must be one of {MODES}")
        self.manager = manager
        self.mode = mode
        self.poll_interval = poll_interval
        self.source = source
        self.startup_models = startup_models  # explicit mode: what to load at start ("*": everything)

    async def refresh(self, model: str | None = None) -> None:
        """Update the local repository from its source (no-op for a local folder)."""
        if self.source is None:
            return
        failures = await asyncio.to_thread(self.source.refresh, model)
        if model is None:
            self.manager.external_failures = dict(failures)
        else:
            self.manager.external_failures.pop(model, None)
            self.manager.external_failures.update(failures)
        for name, reason in failures.items():
            entry = self.manager.models.get(name)
            if entry is not None and entry.ready_versions():
                entry.reason = f"sync failed, still serving the previous copy: {reason}"

    async def initial_load(self) -> None:
        """Load the repository (explicit mode: only ``startup_models``, as Triton's ``--load-model``)."""
        if self.mode == "on_demand":  # nothing loads (nor downloads) at start but what is kept always loaded
            if self.source is not None:
                self.manager.listed_elsewhere = set(await asyncio.to_thread(self.source.model_names))
            return
        if self.mode == "explicit" and ALL_MODELS not in self.startup_models:
            for name in self.startup_models:
                await self.refresh(name)
                await self.manager.load_model(name)
        else:
            await self.refresh()
            await self.manager.load_all()
        self._prune()

    async def poll_forever(self) -> None:
        """Poll mode: reconcile on every watched change, and at least every ``poll_interval``."""
        watcher = RepositoryWatcher(self.manager.repository.root) if self.source is None else None
        if watcher is not None:
            watcher.start()
        try:
            while True:
                if watcher is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(watcher.changed.wait(), self.poll_interval)
                    await asyncio.sleep(_DEBOUNCE_SECONDS)
                    watcher.changed.clear()
                else:
                    await asyncio.sleep(self.poll_interval)
                try:
                    await self.refresh()
                    await self.manager.reconcile()
                    self._prune()
                except Exception:  # noqa: BLE001 - keep polling; the serving models stay
                    logger.exception("repository poll failed; will retry")
        finally:
            if watcher is not None:
                watcher.stop()

    def _prune(self) -> None:
        if self.source is not None:
            self.source.prune()

    def _require_explicit(self) -> None:
        if self.mode not in ("explicit", "on_demand"):  # Triton's words, whatever the mode
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")

    @staticmethod
    def _check_request(name: str, parameters: dict, allowed: tuple[str, ...] = ()) -> None:
        if not is_model_folder_name(name) or "/" in name or "\\" in name or name in (".", ".."):
            raise InvalidArgument(f"invalid model name '{name}'")
        refused = sorted(set(parameters) - set(allowed))
        if refused:
            raise InvalidArgument(
                f"parameters {refused} are not accepted: models load only from the configured repository"
            )

    async def load(self, name: str, parameters: dict | None = None) -> None:
        """Explicit mode: (re)load a model of the repository by name, in Triton's words when it fails.

        A ``config`` parameter (a JSON model config) replaces its config.pbtxt for this load; files are
        never taken from the request."""
        self._require_explicit()
        parameters = parameters or {}
        self._check_request(name, parameters, allowed=("config",))
        override = parameters.get("config")
        if override is not None and not isinstance(override, str):
            raise InvalidArgument("parameter 'config' must be a string holding the model config as JSON")
        await self.refresh(name)
        unknown = f"failed to load '{name}', failed to poll from model repository"
        try:
            self.manager.require_known(name)
        except InvalidArgument:
            raise InvalidArgument(unknown) from None
        entry = await self.manager.load_model(name, override)
        if entry.config_error:
            raise InvalidArgument(f"{unknown}: {entry.config_error}")
        if entry.version_errors:
            reasons = "".join(f"version {v} is at UNAVAILABLE state: {reason};\n"
                              for v, reason in sorted(entry.version_errors.items()))
            raise InvalidArgument(f"load failed for model '{name}': {reasons}")

    async def unload(self, name: str, parameters: dict | None = None) -> None:
        """Explicit mode: drain and unload every version of a model (a model not loaded: nothing to do)."""
        self._require_explicit()
        parameters = parameters or {}
        self._check_request(name, parameters, allowed=("unload_dependents",))
        await self.manager.unload_model(name)
        if parameters.get("unload_dependents") is True:  # the ensembles that call it (and those calling them)
            for dependent in self.manager.dependents(name):
                await self.manager.unload_model(dependent)
