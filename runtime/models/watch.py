"""Watches a local repository folder (watchdog) and signals an asyncio event on any change.

watchdog is imported when a watcher is made (poll mode on a local folder), not at server start.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def _change_signal(loop: asyncio.AbstractEventLoop, changed: asyncio.Event) -> Any:
    """A watchdog event handler that sets ``changed`` (from watchdog's thread) on any change but reads."""
    from watchdog.events import FileSystemEvent, FileSystemEventHandler

    class ChangeSignal(FileSystemEventHandler):
        def on_any_event(self, event: FileSystemEvent) -> None:
            if event.event_type in ("opened", "closed_no_write"):
                return
            if "__pycache__" in str(event.src_path):
                return
            loop.call_soon_threadsafe(changed.set)

    return ChangeSignal()


class RepositoryWatcher:
    """``changed`` is set whenever something under ``root`` is created, modified, moved or deleted."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.changed = asyncio.Event()
        from watchdog.observers import Observer

        self._observer = Observer()

    def start(self) -> None:
        signal = _change_signal(asyncio.get_running_loop(), self.changed)
        self._observer.schedule(signal, str(self.root), recursive=True)
        self._observer.daemon = True
        self._observer.start()
        logger.info("watching %s for model changes", self.root)

    def stop(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=5)
