"""Threads that do not preempt one another: every thread of the process, the event loop's included, runs under
Linux's SCHED_BATCH, and so do the Python models' workers (``server.batch_scheduled_threads``).

On a CPU that the loop shares with its helpers (gRPC's pool threads, the listeners' threads, the workers), the
kernel's default policy lets a woken thread preempt the running one at once, and one of the two usually holds the
GIL: a woken helper runs only to wait for the GIL the loop holds; the loop, woken by a helper that still holds it
(granian's bridge thread resolving a request's future), runs only to wait for it, and the GIL's hand-over then
bounces between them (six switches for one hand-off, traced). A SCHED_BATCH thread does not preempt on wake-up (the
fair scheduler leaves its preemption to the tick), so a woken thread runs when the running one waits, and the
hand-offs of many requests share their switches. Their share of the CPU is unchanged. Measured in
docs/benchmarks.md ("Helper threads that do not preempt the loop"; "The event loop under SCHED_BATCH too").
"""

from __future__ import annotations

import asyncio
import logging
import os

from runtime.idle_timers import aligned_delay

logger = logging.getLogger(__name__)

RESCAN_SECONDS = 1.0  # threads that escaped (started under another policy) join at the next look
RESCAN_BACKOFF = 8  # while looks find none, they come up to this many times further apart
_batching = False  # on from batch_threads() until its rescans end


def threads_batched() -> bool:
    """Whether this process batches its threads (the Python backend then starts its workers batched too)."""
    return _batching


def run_as_batch() -> bool:
    """Put the calling thread (and what it starts from now on: threads, processes) under SCHED_BATCH; False where
    the system has no such policy or refuses it."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True


def batch_existing_threads() -> int:
    """Put every thread of this process still under the default policy under SCHED_BATCH; how many there were."""
    try:
        threads = [int(entry) for entry in os.listdir("/proc/self/task")]
    except OSError:
        return 0
    changed = 0
    for thread in threads:
        try:
            if os.sched_getscheduler(thread) == os.SCHED_OTHER:
                os.sched_setscheduler(thread, os.SCHED_BATCH, os.sched_param(0))
                changed += 1
        except OSError:  # it ended meanwhile
            continue
    return changed


def batch_threads(interval: float = RESCAN_SECONDS) -> asyncio.Task | None:
    """Batch every thread of this process, the running loop's first (what it starts from now on inherits the
    policy), now and every ``interval`` seconds (the task doing it); None, said in the log, where the system has
    no SCHED_BATCH or refuses it."""
    global _batching
    if not os.path.isdir("/proc/self/task") or not run_as_batch():
        logger.info("threads keep the default scheduling policy: SCHED_BATCH is not available here")
        return None
    _batching = True
    batch_existing_threads()
    task = asyncio.ensure_future(_rescan(interval))
    task.add_done_callback(_stopped)
    return task


def _stopped(_: asyncio.Task) -> None:
    """The rescans ended (the server is stopping): workers started from now on keep the default policy."""
    global _batching
    _batching = False


async def _rescan(interval: float) -> None:
    """Every ``interval``, and less and less often (up to RESCAN_BACKOFF times it) while rescans find no thread to
    change: an idle server is not woken for them."""
    wait = interval
    while True:
        await asyncio.sleep(aligned_delay(wait))  # woken with the server's other looks
        wait = interval if batch_existing_threads() else min(wait * 2, interval * RESCAN_BACKOFF)
