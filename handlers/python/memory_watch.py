"""A Python model's worker recycled when its memory passes the model's ``worker_max_memory_bytes`` parameter.

A model that keeps what each call allocates (a cache without bound, a leak) grows its worker without limit, until
the platform kills the whole function.  With the parameter set, a thread reads the worker's resident memory (its
own: the shared memory it maps with the server is not counted, ``runtime/process_memory.py``) every ``INTERVAL``
seconds and, past the limit, has the handler replace the worker as soon as it is idle (its next request waits for
the new one, as after a crash).  Off (0) by default, as in Triton, which has no such bound.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from runtime.process_memory import own_resident_bytes

logger = logging.getLogger(__name__)

PARAMETER = "worker_max_memory_bytes"
INTERVAL = 1.0


def watch_memory(label: str, limit: int, worker_pid: Callable[[], int | None],
                 recycle_if_idle: Callable[[str], bool], stop: threading.Event) -> threading.Thread:
    """Start the watch of one instance's worker (until ``stop``): ``recycle_if_idle(why)`` is called while the
    worker is past ``limit``, until it returns True."""

    def run() -> None:
        while not stop.wait(INTERVAL):
            pid = worker_pid()
            used = own_resident_bytes(pid) if pid else 0
            if used > limit:
                why = f"its worker held {used} bytes, past {PARAMETER} ({limit})"
                if recycle_if_idle(why):
                    logger.warning("%s: %s: replaced it", label, why)

    thread = threading.Thread(target=run, daemon=True, name=f"memory-{label}")
    thread.start()
    return thread
