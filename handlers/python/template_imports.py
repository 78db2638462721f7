"""Imported in the workers' template process only (``template.py``): the heavy frameworks the repository's models
import, named by the server in ``FRAMEWORKS_ENV``. A framework that fails to import is left to the model to report
in its own worker: the template must start whatever happens (the forkserver's preload forgives only ImportError)."""

from __future__ import annotations

import importlib
import os

from handlers.python.template import FRAMEWORKS_ENV

for _framework in filter(None, os.environ.get(FRAMEWORKS_ENV, "").split(",")):
    try:
        importlib.import_module(_framework)
    except Exception:  # noqa: BLE001, S110 - the model's worker imports it again and reports what fails
        pass
