"""The cold start's download, begun before the server's own imports.

The first answer of a function whose repository lies in object storage waited for the server's imports (0.2 s), then
botocore's import and client (0.17 s), then the listing and the downloads, one after the other. So ``bootstrap run``
forks, as soon as its settings are read and while it is still small and has no other thread, a child that imports
the sync and syncs the repository exactly as the server's first refresh would (the same ObjectStoreSource, the same
deadline) and tells it the outcome through a pipe; meanwhile the parent imports and starts its listeners on another
core. The server's first full refresh takes that outcome instead of syncing again (:meth:`EarlySync.outcome`); a
child that died without telling leaves the refresh to sync itself. The child ends with the parent
(PR_SET_PDEATHSIG). Once it has listed the repository, the child tells whether any model may be a Python model (a
``.py`` file): where none is, the server does not start the Python workers' template process, which would take a
core from the cold start."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pickle
import signal
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


Tell = Callable[[object], None]  # what the child's sync tells the parent before its outcome (a note)


class EarlySync:
    """A repository sync running in a child process (see the module)."""

    def __init__(self, sync: Callable[[Tell], dict[str, str]]) -> None:
        """Fork a child that runs ``sync`` (the failures per model, as ObjectStoreSource.refresh gives them),
        which may tell the parent a note first (``sync``'s argument)."""
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read_end)
            _end_with_parent()
            _report(write_end, sync)
        os.close(write_end)
        self.pid = pid
        self._pipe = os.fdopen(read_end, "rb")
        self._note: object = None
        self._noted = False
        self._ahead: tuple[str, Any] | None = None  # the outcome, where wait_note() read it (no note came)
        self._reading = threading.Lock()  # one reader of the pipe at a time (wait_note runs in a thread)

    def wait_note(self) -> object:
        """The child's note, waiting for it; None where the child tells its outcome (or ends) without one."""
        with self._reading:
            if not self._noted and self._ahead is None and not self._pipe.closed:  # closed: outcome() took all
                message = self._take()
                if message is not None and message[0] != "note":
                    self._ahead = message
            return self._note

    def outcome(self) -> dict[str, str] | None:
        """The child's failures per model (waiting for it), raising what its sync raised; None where it died
        without telling (the caller syncs itself)."""
        try:
            with self._reading:
                message = self._ahead or self._take()
                while message is not None and message[0] == "note":
                    message = self._take()
        finally:
            self._pipe.close()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
        if message is None:
            logger.warning("the cold start's early download ended without a result: downloading again")
            return None
        kind, value = message
        if kind == "ok":
            return dict(value)
        from bootstrap.storage import StorageError
        from bootstrap.sync import SyncError

        raise (StorageError if kind == "StorageError" else SyncError)(value)

    def _take(self) -> tuple[str, Any] | None:
        """The child's next message (None: it ended without one)."""
        try:
            message = pickle.load(self._pipe)  # noqa: S301 - our own child's bytes, through a pipe only it holds
        except (EOFError, pickle.UnpicklingError):
            return None
        if message[0] == "note" and not self._noted:
            self._note, self._noted = message[1], True
        return message


def start_early_sync(sync: Callable[[Tell], dict[str, str]]) -> EarlySync | None:
    """An EarlySync of ``sync``, where forking is safe (this process has no other thread yet); else None."""
    if threading.active_count() != 1 or not hasattr(os, "fork"):
        return None
    return EarlySync(sync)


def _end_with_parent() -> None:
    """Linux: the child is killed when the parent ends (a stopped server leaves no download behind)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _report(write_end: int, sync: Callable[[Tell], dict[str, str]]) -> None:
    """Run ``sync``, write its note and outcome, and leave without running anything of the parent's (atexit,
    buffers)."""
    code = 0
    try:
        with os.fdopen(write_end, "wb") as pipe:

            def tell(note: object) -> None:
                pickle.dump(("note", note), pipe)
                pipe.flush()

            try:
                outcome: tuple[str, object] = ("ok", sync(tell))
            except BaseException as exc:  # noqa: BLE001 - whatever happens, the parent hears of it
                from bootstrap.errors import BootstrapError

                known = isinstance(exc, BootstrapError) and type(exc).__name__ in ("SyncError", "StorageError")
                outcome = (type(exc).__name__, str(exc)) if known else ("SyncError", f"{type(exc).__name__}: {exc}")
            pickle.dump(outcome, pipe)
    except BaseException:  # noqa: BLE001 - the parent went away (a broken pipe): nothing to tell
        code = 1
    finally:
        logging.shutdown()
        os._exit(code)
