"""The cyclic garbage collector, held off while a server starts.

A start imports some 600 modules and builds their objects: about 78,000 allocations that set off the collector's
young generations again and again to find next to nothing, since what an import builds lives as long as the process
(15 ms of a 0.3 s start's CPU here). The composition root pauses the collector once it knows it will serve; the
server resumes it when the cold start is over, first moving what the start built to the permanent generation
(``gc.freeze``), so that no later collection walks it again.
"""

from __future__ import annotations

import gc


def pause_collection() -> None:
    """Hold off the cyclic collector until :func:`resume_collection`."""
    gc.disable()


def resume_collection() -> None:
    """Where the collector is off (:func:`pause_collection`), freeze what exists now and turn it back on."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()
