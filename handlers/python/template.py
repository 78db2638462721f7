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

import importlib.machinery
import importlib.util
import multiprocessing
import multiprocessing.forkserver
import os
import re
import sys
import threading
from collections.abc import Iterable, Sequence
from multiprocessing.context import ForkServerContext, SpawnContext

START_METHOD_ENV = "SERVERLESS_TRITON_PYTHON_WORKERS"
PRELOAD = ["handlers.python.worker"]  # the workers' own side, imported once in the template
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


def start_template(background: bool = True, frameworks: Sequence[str] = ()) -> None:
    """Start the template process now (in a thread: the caller goes on with its own imports meanwhile), importing
    ``frameworks`` too (see :func:`frameworks_imported`). Only the first start's arguments count."""
    if not uses_template():
        return
    global _configured
    with _lock:
        if not _configured:
            preload = list(PRELOAD)
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


def workers_skip_the_entry_script() -> None:
    """Workers do not run the server's entry script again. multiprocessing runs the parent's ``__main__`` again
    in each process it starts (spawn, forkserver: its file as ``__mp_main__``, or its module where ``-m`` ran
    it), for targets defined there; a worker's target is in handlers.python.worker, and the entry script
    (``bootstrap``) imports the whole command line: 20-25 ms of each worker's start, or, imported ahead in the
    template, about 100 ms of the template's CPU while the server starts beside it. A ``__main__`` whose spec
    names it ``__main__`` is left alone (what multiprocessing does for a package's ``__main__.py``)."""
    sys.modules["__main__"].__spec__ = importlib.machinery.ModuleSpec("__main__", None)


def worker_context() -> SpawnContext | ForkServerContext:
    """Where worker processes come from: forks of the template, or fresh interpreters."""
    if not uses_template():
        return multiprocessing.get_context("spawn")
    start_template(background=False)
    return multiprocessing.get_context("forkserver")
