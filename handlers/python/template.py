"""The template process Python-backend workers are forked from.

Starting a worker from nothing costs an interpreter and its imports (numpy, pb_utils, the runner: about 0.2 s)
on every load, every instance and every restart. Instead one template process, started as the server starts
(``start_template``, in the background, while the server imports its own stack), imports all of that once; each
worker is then a fork of it (multiprocessing's forkserver) and only imports the model itself. The template holds
no CUDA context and no models, so forking it is safe; it exits when the server does. Where a model's ``model.py``
imports a heavy framework (torch: about 1 s to import), the template imports it too (``frameworks_imported``), so
that a worker of that model starts with it already imported; a worker of any other model does not pay for it, for
a fork shares the template's pages.

``SERVERLESS_TRITON_PYTHON_WORKERS=spawn`` starts every worker from nothing instead (as multiprocessing's
``spawn``), and so does a platform without fork.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import multiprocessing.forkserver
import os
import re
import threading
from collections.abc import Iterable, Sequence
from multiprocessing.context import ForkServerContext, SpawnContext

START_METHOD_ENV = "SERVERLESS_TRITON_PYTHON_WORKERS"
# "__main__": the entry script (`bootstrap`), imported once in the template rather than in every worker, where the
# interpreter's forkserver does so (3.13 and later: CPython gh-137996; see ``entry_modules`` below).
PRELOAD = ["__main__", "handlers.python.worker"]
# Frameworks worth importing in the template where a model imports them (fork-safe without a GPU context), named
# to the template in FRAMEWORKS_ENV and imported there by template_imports.py.
HEAVY_FRAMEWORKS = ("torch",)
FRAMEWORKS_ENV = "SERVERLESS_TRITON_TEMPLATE_FRAMEWORKS"

_configured = False
_lock = threading.Lock()


def uses_template() -> bool:
    return (os.environ.get(START_METHOD_ENV, "template") != "spawn"
            and "forkserver" in multiprocessing.get_all_start_methods())


def frameworks_imported(sources: Iterable[str]) -> list[str]:
    """The heavy frameworks (HEAVY_FRAMEWORKS) that these ``model.py`` sources import and that are installed."""
    found = []
    for framework in HEAVY_FRAMEWORKS:
        statement = re.compile(rf"^[ \t]*(?:import|from)[ \t]+{re.escape(framework)}\b", re.MULTILINE)
        if any(statement.search(source) for source in sources) and importlib.util.find_spec(framework) is not None:
            found.append(framework)
    return found


def start_template(background: bool = True, frameworks: Sequence[str] = (), entry_modules: Sequence[str] = ()) -> None:
    """Start the template process now (in a thread: the caller goes on with its own imports meanwhile), importing
    ``frameworks`` too (see :func:`frameworks_imported`) and ``entry_modules``, what the server's entry script
    imports: each worker runs that script again as it starts (multiprocessing's fix-up of ``__main__``, which
    CPython 3.11's forkserver never preloads), which then finds them imported (about 20 ms of each worker's start
    for ``bootstrap``). Only the first start's arguments count."""
    if not uses_template():
        return
    global _configured
    with _lock:
        if not _configured:
            preload = [*PRELOAD, *entry_modules]
            if frameworks:
                os.environ[FRAMEWORKS_ENV] = ",".join(frameworks)  # the template inherits the environment
                preload.append("handlers.python.template_imports")
            multiprocessing.get_context("forkserver").set_forkserver_preload(preload)
            _configured = True
    if background:
        threading.Thread(target=multiprocessing.forkserver.ensure_running, daemon=True,
                         name="worker-template").start()
    else:
        multiprocessing.forkserver.ensure_running()


def worker_context() -> SpawnContext | ForkServerContext:
    """Where worker processes come from: forks of the template, or fresh interpreters."""
    if not uses_template():
        return multiprocessing.get_context("spawn")
    start_template(background=False)
    return multiprocessing.get_context("forkserver")
