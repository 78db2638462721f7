"""glibc malloc tuned for a server that moves large tensors.

By default glibc serves every allocation above a (dynamic) threshold with a fresh ``mmap`` and returns
it with ``munmap`` when freed, so each request's input and output buffers (hundreds of KiB each) come
back as new pages: the kernel zeroes them and faults them in one by one.  Measured on a 600 KB
identity model over gRPC, that was over half of the server's time per request.  Here buffers up to
``MMAP_THRESHOLD_BYTES`` come from the heap and are reused; free memory above
``TRIM_THRESHOLD_BYTES`` at the heap's top still goes back to the system, so memory stays bounded.
Larger buffers (a 55 MiB JSON body) are still mapped and unmapped on their own.

The trim threshold only shrinks a heap from its top, and a thread's arena (at most 64 MiB) hardly ever reaches it:
after four slow readers of 50 MiB answers left, glibc still held 190 MiB they had freed.  So the serving process
also looks once a second at how much freed memory glibc holds (``mallinfo2``), and where that reaches
``FREE_HELD_TRIM_BYTES`` has ``malloc_trim`` give it back, off the event loop (about 20 ms for 500 MiB): a burst's
memory goes back within seconds, and the request path keeps its reused heap.

Python's own arenas and frame-stack chunks come from that heap too (``runtime/python_arenas.cc``): by default each is
a fresh mapping, and CPython 3.11 and 3.12 map and unmap a 16 KiB chunk on every call a loop makes at the depth where
one ends (gh-142183), which the server's start met (3,300 times: 60-100 ms).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import importlib
import importlib.util
import logging
from collections.abc import Callable

from runtime.idle_timers import aligned_delay

logger = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest allowed value on 64-bit systems
TRIM_THRESHOLD_BYTES = 64 << 20
_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
FREE_HELD_TRIM_BYTES = 32 << 20  # freed memory glibc may keep before it is told to give it back
TRIM_CHECK_SECONDS = 1.0
IDLE_BACKOFF = 8  # an idle server's checks come up to this many intervals apart
NATIVE_ARENAS_BUILT = importlib.util.find_spec("runtime._python_arenas") is not None


class _Mallinfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later)."""

    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc by its soname; else whatever ``find_library`` names (which runs ``ldconfig -p``: a process, 3 ms of a
    start, in the server and in every worker)."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        pass
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name is not None else None
    except OSError:
        return None


def free_held_bytes() -> int | None:
    """Bytes glibc holds freed, in every arena (None: not glibc 2.33 or later)."""
    libc = _libc()
    mallinfo2 = getattr(libc, "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _Mallinfo2
    return int(mallinfo2().fordblks)


def give_back_free_memory() -> None:
    """Have glibc return the freed memory it holds, in every arena (whole pages, wherever they lie)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


async def keep_giving_back_free_memory(interval: float = TRIM_CHECK_SECONDS,
                                       threshold: int = FREE_HELD_TRIM_BYTES,
                                       last_activity: Callable[[], float] | None = None) -> None:
    """Until cancelled: every ``interval``, off the loop, give back glibc's freed memory where it holds
    ``threshold`` bytes or more. With ``last_activity`` (when the server last served a request), a look that found
    nothing to give back is not made again until the server has served since: an idle server is not woken for it
    (a look costs a thread's wake-up)."""
    if free_held_bytes() is None:
        return
    looked_after = None  # the activity the last look followed, where it found nothing to give back
    wait = interval
    while True:
        await asyncio.sleep(aligned_delay(wait))  # woken with the server's other looks
        activity = last_activity() if last_activity is not None else None
        if activity is not None and activity == looked_after:
            wait = min(wait * 2, interval * IDLE_BACKOFF)  # idle: the loop is woken less and less often
            continue
        wait = interval
        held = await asyncio.to_thread(free_held_bytes)
        if held is not None and held >= threshold:
            await asyncio.to_thread(give_back_free_memory)
            looked_after = None  # look once more: the next may find what was still held
        else:
            looked_after = activity


def tune_allocator() -> bool:
    """Apply the thresholds (glibc only; elsewhere nothing happens); True if applied."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    if not applied:
        logger.debug("mallopt refused the allocator thresholds")
        return False
    python_arenas_from_heap()  # the threshold now keeps their sizes on the heap
    return True


def python_arenas_from_heap() -> bool:
    """Have Python take its arenas and frame-stack chunks from malloc from now on (once per process); False where
    the native part is not built."""
    try:
        arenas = importlib.import_module("runtime._python_arenas")
    except ImportError:
        return False
    arenas.install()
    return True
