"""What the early sync's child tells the server once it has listed the repository, before it downloads
(bootstrap/early_sync.py): whether a Python model may be there (where none is, the workers' template is never started
and its core stays with the cold start), the heavy frameworks those models' ``model.py`` import, and the backends the
listed model files suggest. The server imports those backends while the download goes on: otherwise the first
answer waits, after the download, for ONNX Runtime's import too (40-50 ms of a core)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from runtime.config.layout import PYTHON_MODEL_FILE, handlers_listed

logger = logging.getLogger(__name__)


class Listed(Protocol):
    @property
    def relative(self) -> str:
        """The object's key below the repository's prefix: ``<model>/<version>/<file>...``."""


Object = TypeVar("Object", bound=Listed)


@dataclass(frozen=True)
class ListingNote:
    python_models: bool  # a .py file is listed
    frameworks: tuple[str, ...] = ()  # what the model.py files import that the template should import too
    backends: tuple[str, ...] = ()  # handler names the model files suggest, Python's aside


def listing_note(objects: Iterable[Object], model_sources: Callable[[list[Object]], list[str]],
                 frameworks_imported: Callable[[list[str]], list[str]]) -> ListingNote:
    """The note for ``objects``: ``model_sources`` reads the listed ``model.py`` files (their first bytes),
    ``frameworks_imported`` names the heavy frameworks they import."""
    objects = list(objects)
    backends = tuple(sorted(handlers_listed(item.relative for item in objects) - {"python"}))
    if not any(item.relative.endswith(".py") for item in objects):
        return ListingNote(python_models=False, backends=backends)
    models = [item for item in objects if item.relative.endswith(f"/{PYTHON_MODEL_FILE}")]
    try:
        frameworks = frameworks_imported(model_sources(models))
    except Exception:  # noqa: BLE001 - a look ahead: the download goes on whatever it met
        logger.exception("unexpected error reading what the models import")
        frameworks = []
    return ListingNote(python_models=True, frameworks=tuple(frameworks), backends=backends)
