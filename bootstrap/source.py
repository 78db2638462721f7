"""The object-storage repository source: a RepositorySync behind ModelControl's interface."""

from __future__ import annotations

from pathlib import Path

from bootstrap.early_sync import EarlySync
from bootstrap.storage import StorageSettings, parse_location
from bootstrap.sync import RepositorySync


class ObjectStoreSource:
    """Syncs ``url`` into ``cache_dir`` on every refresh; failures come back per model."""

    def __init__(self, url: str, settings: StorageSettings, cache_dir: Path, deadline_seconds: float) -> None:
        self.sync = RepositorySync(parse_location(url), settings, cache_dir, deadline_seconds)
        self.early: EarlySync | None = None  # the first full refresh, begun in a child (bootstrap/early_sync.py)

    @property
    def repository_dir(self) -> Path:
        return self.sync.repository_dir

    def refresh(self, model: str | None = None) -> dict[str, str]:
        early, self.early = self.early, None
        if early is not None:
            failures = early.outcome()  # the first refresh is a full one: the child's
            if failures is not None and model is None:
                return failures
        reports = self.sync.sync(only=model)
        return {name: report.error for name, report in reports.items() if report.error}

    def prune(self) -> None:
        self.sync.prune()

    def model_names(self) -> list[str]:
        return self.sync.model_names()
