"""Helper threads that do not preempt the event loop: every thread of the process but the loop's runs under Linux's
SCHED_BATCH, and so do the Python models' workers (``server.batch_scheduled_helpers``).

On a CPU that the loop shares with its helpers (gRPC's pool threads, the listeners' threads, the workers), the
kernel's default policy lets a woken helper preempt the loop at once, while the loop holds the GIL: the helper runs
only to wait for the GIL, and the loop comes back, two context switches per hand-off. A SCHED_BATCH thread does not
preempt on wake-up (the fair scheduler leaves its preemption to the tick), so helpers run when the loop waits for
I/O, and the hand-offs of many requests share their switches. Their share of the CPU is unchanged. Measured in
docs/benchmarks.md ("Helper threads that do not preempt the loop").
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading

logger = logging.getLogger(__name__)

RESCAN_SECONDS = 1.0  # threads started since the last look (libraries start some as they need them) join then
_loop_thread: int | None = None  # the thread left under the default policy, once batching is on


def helpers_batched() -> bool:
    """Whether this process batches its helpers (the Python backend then starts its workers batched too)."""
    return _loop_thread is not None


def batch_new_helpers() -> None:
    """Batch the threads started since the last look now (the listeners' and gRPC's, once they have started)."""
    if _loop_thread is not None:
        batch_threads_but(_loop_thread)


def run_as_batch() -> bool:
    """Put the calling thread (and what it starts from now on: threads, processes) under SCHED_BATCH; False where
    the system has no such policy or refuses it."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True


def batch_threads_but(keep: int) -> int:
    """Put every thread of this process still under the default policy, but ``keep`` (a native thread id), under
    SCHED_BATCH; how many there were."""
    try:
        threads = [int(entry) for entry in os.listdir("/proc/self/task")]
    except OSError:
        return 0
    changed = 0
    for thread in threads:
        if thread == keep:
            continue
        try:
            if os.sched_getscheduler(thread) == os.SCHED_OTHER:
                os.sched_setscheduler(thread, os.SCHED_BATCH, os.sched_param(0))
                changed += 1
        except OSError:  # it ended meanwhile
            continue
    return changed


def _supported(loop_thread: int) -> bool:
    try:
        os.sched_setscheduler(loop_thread, os.sched_getscheduler(loop_thread), os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return hasattr(os, "SCHED_BATCH") and os.path.isdir("/proc/self/task")


def batch_helpers(interval: float = RESCAN_SECONDS) -> asyncio.Task | None:
    """Batch every thread of this process but the running loop's, now and every ``interval`` seconds (the task
    doing it); None, said in the log, where the system has no SCHED_BATCH or refuses it."""
    global _loop_thread
    loop_thread = threading.get_native_id()
    if not _supported(loop_thread):
        logger.info("helper threads keep the default scheduling policy: SCHED_BATCH is not available here")
        return None
    _loop_thread = loop_thread
    batch_threads_but(loop_thread)
    task = asyncio.ensure_future(_rescan(loop_thread, interval))
    task.add_done_callback(_stopped)
    return task


def _stopped(_: asyncio.Task) -> None:
    """The rescans ended (the server is stopping): workers started from now on keep the default policy."""
    global _loop_thread
    _loop_thread = None


async def _rescan(loop_thread: int, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        batch_threads_but(loop_thread)
