"""Watches a local repository folder (watchdog) and signals an asyncio event on any change."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

logger = logging.getLogger(__name__)


class _Signal(FileSystemEventHandler):
    def __init__(self, loop: asyncio.AbstractEventLoop, changed: asyncio.Event) -> None:
        self.loop = loop
        self.changed = changed

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        if "__pycache__" in str(event.src_path):
            return
        self.loop.call_soon_threadsafe(self.changed.set)


class RepositoryWatcher:
    """``changed`` is set whenever something under ``root`` is created, modified, moved or deleted."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.changed = asyncio.Event()
        self._observer = Observer()

    def start(self) -> None:
        self._observer.schedule(_Signal(asyncio.get_running_loop(), self.changed), str(self.root), recursive=True)
        self._observer.daemon = True
        self._observer.start()
        logger.info("watching %s for model changes", self.root)

    def stop(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=5)
