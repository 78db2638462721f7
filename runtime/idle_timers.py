"""The periodic looks of a quiet server, woken together.

A server with nothing to do still looks around now and then: the lanes at the core's offer, each HTTP listener's
shedding watch at the sockets in use, the thread-policy rescan, the allocator at glibc's freed memory. Each slept its
interval from its own last look, so an idle server woke at as many moments as it had watches, and a wake-up after a
quiet while costs 1-2 ms of cold caches whatever the look does. Their intervals are powers of two times a quarter
second; waking at multiples of the interval on the monotonic clock, a 2 s look and an 8 s one share a wake-up, in
this process and in its workers alike.
"""

from __future__ import annotations

import time

SHORTEST_DELAY_SHARE = 0.01  # a wake-up this close to the next multiple goes to the one after it


def aligned_delay(interval: float, now: float | None = None) -> float:
    """Seconds from ``now`` (``time.monotonic()``, the event loop's clock) to the next multiple of ``interval``:
    more than 1% of ``interval`` and at most ``interval`` (the look never comes later than it would have)."""
    if interval <= 0:
        return 0.0
    delay = interval - ((time.monotonic() if now is None else now) % interval)
    return delay + interval if delay < interval * SHORTEST_DELAY_SHARE else delay
