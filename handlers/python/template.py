"""The template process Python-backend workers are forked from.

Starting a worker from nothing costs an interpreter and its imports (numpy, pb_utils, the runner: about 0.2 s)
on every load, every instance and every restart. Instead one template process, started as the server starts
(``start_template``, in the background, while the server imports its own stack), imports all of that once; each
worker is then a fork of it (multiprocessing's forkserver) and only imports the model itself. The template holds
no threads, no CUDA context and no models, so forking it is safe; it exits when the server does.

``SERVERLESS_TRITON_PYTHON_WORKERS=spawn`` starts every worker from nothing instead (as multiprocessing's
``spawn``), and so does a platform without fork.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import threading
from multiprocessing.context import ForkServerContext, SpawnContext

START_METHOD_ENV = "SERVERLESS_TRITON_PYTHON_WORKERS"
# "__main__": the entry script (`bootstrap`), imported once in the template rather than in every worker.
PRELOAD = ["__main__", "handlers.python.worker"]

_configured = False
_lock = threading.Lock()


def uses_template() -> bool:
    return (os.environ.get(START_METHOD_ENV, "template") != "spawn"
            and "forkserver" in multiprocessing.get_all_start_methods())


def start_template(background: bool = True) -> None:
    """Start the template process now (in a thread: the caller goes on with its own imports meanwhile)."""
    if not uses_template():
        return
    global _configured
    with _lock:
        if not _configured:
            multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
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
