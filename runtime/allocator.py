"""glibc malloc tuned for a server that moves large tensors.

By default glibc serves every allocation above a (dynamic) threshold with a fresh ``mmap`` and returns
it with ``munmap`` when freed, so each request's input and output buffers (hundreds of KiB each) come
back as new pages: the kernel zeroes them and faults them in one by one.  Measured on a 600 KB
identity model over gRPC, that was over half of the server's time per request.  Here buffers up to
``MMAP_THRESHOLD_BYTES`` come from the heap and are reused; free memory above
``TRIM_THRESHOLD_BYTES`` at the heap's top still goes back to the system, so memory stays bounded.
Larger buffers (a 55 MiB JSON body) are still mapped and unmapped on their own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest allowed value on 64-bit systems
TRIM_THRESHOLD_BYTES = 64 << 20
_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3


def tune_allocator() -> bool:
    """Apply the thresholds (glibc only; elsewhere nothing happens); True if applied."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    if not applied:
        logger.debug("mallopt refused the allocator thresholds")
    return applied
