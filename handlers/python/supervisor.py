"""The worker process of one Python-backend instance: started, held for one batch at a time, lost, restarted.

A crash, ``os._exit`` or hang in user code fails only the batch it was executing: the worker is dropped and
restarted in the background, with backoff while ``initialize`` keeps failing; meanwhile the instance reports itself
unavailable, with the reason.  A worker found dead while idle is replaced before the next batch.  Triton runs one
execute at a time per instance: a batch holds the supervisor from the send until its answer is taken.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from handlers.python.link import WorkerGone, WorkerLink
from runtime.errors import ModelLoadError

logger = logging.getLogger(__name__)

START_TIMEOUT = 120.0
FINALIZE_TIMEOUT = 30.0
RESTART_BACKOFF = (0.5, 30.0)  # first delay, largest delay (seconds); doubles after each failure


class WorkerSupervisor:
    """Starts, hands out and replaces the worker of one instance (see the module)."""

    def __init__(self, label: str, start: Callable[[], WorkerLink], on_lost: Callable[[str], None]) -> None:
        """``start``: a new worker, not yet ready; ``on_lost(why)``: called when a worker is lost (its requests'
        streams end)."""
        self.label = label
        self._start = start
        self._on_lost = on_lost
        self._worker: WorkerLink | None = None
        self._lock = threading.Lock()
        self.closing = threading.Event()
        self.down_reason = ""
        self.restarts = 0  # workers lost and restarted (each loss counts once, however many attempts it takes)
        self._restarter: threading.Thread | None = None

    @property
    def worker(self) -> WorkerLink | None:
        """The current worker (None while it is being restarted)."""
        return self._worker

    def start(self) -> None:
        """The first worker, ready; ModelLoadError if it does not start."""
        self._worker = self._ready_worker()

    def _ready_worker(self) -> WorkerLink:
        worker = self._start()
        try:
            worker.wait_ready(START_TIMEOUT)
        except (ModelLoadError, WorkerGone) as exc:
            worker.kill()
            message = str(exc) if isinstance(exc, ModelLoadError) else f"{worker.gone} while loading"
            raise ModelLoadError(message) from None
        return worker

    # -- holding the worker for a batch ----------------------------------------------------------------------------
    def hold_if_live(self) -> WorkerLink | None:
        """The worker, held, if it is free and alive now (without blocking); None (not held) otherwise."""
        if not self._lock.acquire(blocking=False):
            return None
        worker = self._worker
        if worker is None or not worker.alive:
            self._lock.release()
            return None
        return worker

    def hold(self) -> WorkerLink | None:
        """Wait for the worker and hold it; one found dead while idle is replaced first (synchronously).  None if
        there is none: the supervisor is held all the same."""
        self._lock.acquire()
        worker = self._worker
        if worker is None or worker.alive or self.closing.is_set():
            return worker
        what = f"worker process {worker.exit_description()} while idle"
        logger.warning("%s: %s; restarting it before dispatching", self.label, what)
        worker.kill()
        self._on_lost(what)
        try:
            self._worker = self._ready_worker()
        except ModelLoadError as exc:
            self._worker = None
            self._down(f"{what}, and its restart failed: {exc}")
        return self._worker

    def release(self) -> None:
        self._lock.release()

    def lose_if_current(self, worker: WorkerLink, what: str) -> None:
        """A worker found gone or stuck outside a batch (a request a lane sent it): dropped and restarted in the
        background, as a batch's failure has it, unless it was replaced meanwhile."""
        with self._lock:
            if self._worker is worker:
                self.lose(what)

    def lose(self, what: str) -> None:
        """While held: drop the worker (killed) and restart one in the background (unless closing)."""
        if self._worker is not None:
            self._worker.kill()
            self._worker = None
        self._on_lost(what)
        self._down(what)

    def recycle_if_idle(self, why: str) -> bool:
        """Replace the worker now if it is idle (True), else leave it (False: asked again later)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._worker is None or self.closing.is_set():
                return False
            # A call a front end sent past the core (a lane) holds no lock here: the side door closes first,
            # after that call, so that the worker is never replaced under it (its client got the kill's error)
            self._worker.close_direct(wait=True)
            self.lose(why)
            return True
        finally:
            self._lock.release()

    def send_cancel(self, key: object) -> bool:
        """Tell the worker that the request under ``key`` was cancelled; False if there is no worker to tell."""
        worker = self._worker
        if worker is None:
            return False
        try:
            worker.send(("cancel", key))
        except OSError:
            pass  # the worker is going away: its requests end with it
        return True

    def worker_pid(self) -> int | None:
        worker = self._worker
        return worker.process.pid if worker is not None else None

    # -- stopping ------------------------------------------------------------------------------------------------
    def stop(self, deadline: float | None = None) -> None:
        """Finalize the model in its worker; a worker still busy (hung) at ``deadline`` is killed instead."""
        self.closing.set()
        if self._restarter is not None:
            self._restarter.join()
        wait = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._lock.acquire(timeout=wait):
            worker = self._worker
            if worker is not None:
                logger.warning("%s: still executing at the shutdown deadline: killing its worker", self.label)
                worker.kill()  # the blocked execute sees the worker gone and returns
            self._lock.acquire()
        try:
            worker, self._worker = self._worker, None
            if worker is None:
                return
            budget = FINALIZE_TIMEOUT if deadline is None else min(FINALIZE_TIMEOUT, deadline - time.monotonic())
            if worker.alive and budget > 0 and not worker.finalize(budget):
                logger.warning("%s: the worker did not finalize cleanly", self.label)
            worker.kill()
            self._on_lost("the model was unloaded")
        finally:
            self._lock.release()

    # -- restarting ----------------------------------------------------------------------------------------------
    def _down(self, what: str) -> None:
        self.down_reason = what
        if self.closing.is_set():
            return
        logger.warning("%s: %s; restarting its worker", self.label, what)
        self.restarts += 1
        if self._restarter is None or not self._restarter.is_alive():
            self._restarter = threading.Thread(target=self._restart_until_up, args=(what,), daemon=True,
                                               name=f"restart-{self.label}")
            self._restarter.start()

    def _restart_until_up(self, what: str) -> None:
        delay, longest = RESTART_BACKOFF
        attempt = 0
        while not self.closing.is_set():
            attempt += 1
            try:
                worker = self._ready_worker()
            except ModelLoadError as exc:
                self.down_reason = f"{what}; restart attempt {attempt} failed: {exc}; next attempt in {delay:g}s"
                logger.error("%s: %s", self.label, self.down_reason)
                self.closing.wait(delay)
                delay = min(delay * 2, longest)
                continue
            with self._lock:
                if self.closing.is_set():
                    worker.kill()
                    return
                self._worker, self.down_reason = worker, ""
            logger.info("%s: worker restarted (attempt %d)", self.label, attempt)
            return
