"""The server's side of one Python worker process: the process, its connection, the shared memory both ways,
and the routing of what the worker says (batch results, decoupled responses, BLS calls, logs, metrics, model
control) to the handler.

What the worker says is read on the server's event loop, where the batches are awaited, so an answer reaches its
requests with no thread hand-off; without a loop (a handler used on its own) a reader thread reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import select
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from multiprocessing.reduction import send_handle
from typing import Any, Protocol

import numpy as np

from handlers.python.direct_answer import answer_outputs
from handlers.python.environment import PythonEnvironment
from handlers.python.environment_process import start_in_environment
from handlers.python.readiness import ReadinessProbe, open_readiness
from handlers.python.runner import RunnerSpec
from handlers.python.template import worker_context
from handlers.python.transport import (
    DIRECT_SEGMENT,
    POOL_SEGMENTS,
    REQUEST_INPUT,
    Arena,
    PeerMemory,
    TensorRef,
    announce_segments,
    pool_ref,
    recv_pickled,
    request_input,
    send_pickled,
)
from handlers.python.worker import worker_main
from runtime.direct_path import DirectChannel
from runtime.errors import InternalError, ModelLoadError
from runtime.memfd_arena import MemfdSegment
from runtime.tensor_pool import TensorPool

RETURN_BATCH = 64
# Told a batch's answer, wherever the link reads it: (answer, None), or (None, why) when the worker went away.
BatchSettled = Callable[[Any, "str | None"], None]


def _own_input(request_inputs: Sequence[Any], ref: TensorRef) -> np.ndarray:
    array = request_input(request_inputs, ref)
    if array is None:  # the worker names only inputs read in place from the pool: never another
        raise InternalError(f"the worker returned output '{ref[0]}' as an input it was not given in place")
    return array


class LinkEvents(Protocol):
    """What the handler does with what a worker says besides answering a batch."""

    def on_response(self, link: WorkerLink, key: Any, result: Any, flags: int) -> None: ...
    def on_reschedule(self, key: Any) -> None: ...
    def on_call(self, link: WorkerLink, kind: str, call_id: int | None, message: tuple) -> None: ...
    def on_log(self, level: str, message: str) -> None: ...


class WorkerGone(ConnectionError):
    """The worker process ended (crashed, was killed) or closed its connection."""


class WorkerLink:
    """Spawns a worker for ``spec`` (under ``environment``'s interpreter, if given) and talks to it."""

    def __init__(self, spec: RunnerSpec, events: LinkEvents, arena_bytes: int, growth_bytes: int,
                 loop: asyncio.AbstractEventLoop | None = None, pool: TensorPool | None = None,
                 environment: PythonEnvironment | None = None) -> None:
        name = f"triton-python-{spec.model_name}"
        self.process: Any
        if environment is not None:
            self.process, self.connection, self._progress = start_in_environment(environment, "worker", spec, name)
        else:
            context = worker_context()
            self.connection, child = context.Pipe()
            # (batch id, index): the request of requests handed over together that the worker began last,
            # written by it before each, read here once it is lost (shared memory outlives it)
            self._progress = context.RawArray("q", 2)
            self.process = context.Process(target=worker_main, args=(child, spec, os.getpid(), self._progress),
                                           daemon=True, name=name)
            self.process.start()
            child.close()
        self._exit_watch = select.poll()  # the sentinel becomes readable when the process has ended
        self._exit_watch.register(self.process.sentinel, select.POLLIN)
        self.events = events
        self.arena = Arena(arena_bytes, growth_bytes)  # inputs, and BLS outputs
        self.pool = pool  # the server's tensor pool: large inputs received there are read in place
        self._pool_announced = 0
        self.memory = PeerMemory()  # the worker's outputs, and its BLS inputs
        self._send_lock = threading.Lock()
        self._returned: list[TensorRef] = []  # the worker's memory we no longer use, told with the next message
        self._returned_lock = threading.RLock()  # a finalizer may run inside it (garbage collection)
        self._batches: dict[int, BatchSettled] = {}
        self._batch_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._ready: Future = Future()
        self._finalized: Future = Future()
        self.gone: str = ""
        self._fd = self.connection.fileno()
        self._direct: DirectChannel | None = None  # the side door, once a front end asks for it
        self._direct_ends: tuple[socket.socket, MemfdSegment] | None = None
        self._loop = loop if loop is not None and loop.is_running() else None
        self._reader: threading.Thread | None = None
        self._exit_lock = threading.Lock()
        self.readiness: ReadinessProbe | None = None  # the model's is_ready, where it has one
        if self._loop is not None:
            self._on_loop(self._watch_on_loop)
        else:
            self._reader = threading.Thread(target=self._read, daemon=True, name=f"link-{spec.model_name}")
            self._reader.start()

    # -- lifecycle --------------------------------------------------------------------------------------
    def wait_ready(self, timeout: float) -> None:
        try:
            outcome = self._ready.result(timeout)
        except TimeoutError:
            raise ModelLoadError(f"the worker did not start within {timeout:.0f}s") from None
        if outcome is not None:
            raise ModelLoadError(outcome)

    @property
    def alive(self) -> bool:
        """Whether the process runs and its connection is open: its sentinel polled in one syscall
        (``Process.is_alive`` through the fork server built a selector each time, 24 us, twice per batch)."""
        return not self.gone and not self._exit_watch.poll(0)

    def wait_exit(self, timeout: float) -> int | None:
        """The process's exit code once it has exited, waiting ``timeout`` seconds at most (None: it runs).  One
        thread at a time: the fork server hands an exit code over once, on a pipe, and a second reader gets 255."""
        with self._exit_lock:
            self.process.join(timeout)
            return self.process.exitcode

    def exit_description(self, timeout: float = 1.0) -> str:
        """How the process ended, waiting ``timeout`` seconds at most for it to."""
        code = self.wait_exit(timeout)
        if code is None:
            return "did not answer"
        return f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"

    def finalize(self, timeout: float) -> bool:
        self.close_direct(wait=True)
        try:
            self.send(("finalize",))
            self._finalized.result(timeout)
            return True
        except (OSError, TimeoutError, WorkerGone):
            return False

    def kill(self) -> None:
        """Kill the process (if alive) and release its pipe and memory; safe to call more than once."""
        self.close_direct()
        with self._exit_lock:
            if self.process.exitcode is None:
                self.process.kill()
            self.process.join(timeout=5)
        if self._loop is not None:
            self._on_loop(self._loop.remove_reader, self._fd)
        self.connection.close()
        if self.readiness is not None:
            self.readiness.close()
        if self._reader is not None:
            self._reader.join(timeout=5)
        self.memory.close()
        self.arena.close()
        if self._direct_ends is not None:
            ours, buffer = self._direct_ends
            self._direct, self._direct_ends = None, None  # the door's failure() refers to this link: no cycle left
            ours.close()
            buffer.close()

    # -- messages -----------------------------------------------------------------------------------------
    def send(self, message: tuple) -> None:
        with self._send_lock:
            self.arena.announce(self.connection, self.process.pid)
            if self.pool is not None:
                self._pool_announced = announce_segments(self.connection, self.process.pid, self.pool.segments,
                                                         self._pool_announced, POOL_SEGMENTS)
            self._send_returned()
            send_pickled(self.connection, message)

    def direct_channel(self, buffer_bytes: int, execute_timeout: float,
                       failure: Callable[[WorkerLink, bool], str]) -> DirectChannel | None:
        """This worker's side door (``runtime/direct_path.py``), opened on first asking: a socket it takes batches
        on and answers them, and a buffer it reads their inputs from in place.  None once the worker is gone."""
        with self._send_lock:
            if self.gone:
                return None
            if self._direct is not None:
                return self._direct
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            ours.setblocking(True)  # whatever socket.setdefaulttimeout says: both ends read whole frames
            theirs.setblocking(True)
            buffer = MemfdSegment(buffer_bytes, name="triton-direct")
            try:
                send_pickled(self.connection, ("direct",))
                send_handle(self.connection, theirs.fileno(), self.process.pid)
                announce_segments(self.connection, self.process.pid, [buffer], 0, DIRECT_SEGMENT)
            except OSError:
                ours.close()
                buffer.close()
                return None
            finally:
                theirs.close()
            self._direct_ends = (ours, buffer)
            self._direct = DirectChannel(ours.fileno(), buffer.fd, buffer.size, DIRECT_SEGMENT, execute_timeout,
                                         lambda timed_out: failure(self, timed_out), answer_outputs)
            return self._direct

    def close_direct(self, wait: bool = False) -> None:
        """Close the side door: before the worker stops (``wait``: for a batch under way there), or after it went
        away."""
        direct = self._direct
        if direct is not None:
            direct.close(wait)

    def input_ref(self, name: str, array: np.ndarray, datatype: str, in_place: bool = True) -> TensorRef:
        """A request's input for the worker: where it lies in the tensor pool, read there without a copy (while
        ``in_place`` allows: the caller holds the array until the worker is done with it), else copied into
        the arena."""
        if in_place and self.pool is not None:
            ref = pool_ref(self.pool, name, array, datatype)
            if ref is not None:
                return ref
        return self.arena.write(name, array, datatype)

    def _send_returned(self) -> None:
        """Called with the send lock held."""
        with self._returned_lock:
            returned, self._returned = self._returned, []
        if returned:
            send_pickled(self.connection, ("release", returned))

    def borrow(self, refs: list[TensorRef], request_inputs: Sequence[Any] = ()) -> list[tuple[str, Any]]:
        """The worker's tensors in place (no copy); each is returned to the worker once nothing uses it (told
        with the next message, or at once past RETURN_BATCH of them).  A small one came in the message: nothing
        to return.  One the worker named by its request's input is that input's own array (``request_inputs``)."""
        memory, give_back = self.memory, self._give_back
        return [(ref[0], memory.borrow(ref, give_back) if ref[3] != REQUEST_INPUT else _own_input(request_inputs, ref))
                for ref in refs]

    def _give_back(self, ref: TensorRef) -> None:
        """Runs wherever the last use of a borrowed tensor ends, even inside a send of this thread (garbage
        collection): it only queues, and sends only when no send is under way."""
        with self._returned_lock:
            self._returned.append(ref)
            if len(self._returned) < RETURN_BATCH or self.gone:
                return
        if self._send_lock.acquire(blocking=False):
            try:
                self._send_returned()
            except OSError:
                pass  # the worker is gone, and its memory with it
            finally:
                self._send_lock.release()

    def execute(self, requests: list[tuple], settled: BatchSettled, separately: bool = False) -> int:
        """Send a batch (``separately``: each request to be executed alone, the results sent together); ``settled``
        is told its answer once (the results, None for a decoupled execute that returned) where the link reads, or
        why the worker went away.  The batch's id; WorkerGone if it cannot be sent."""
        batch_id = next(self._batch_ids)
        with self._lock:
            if self.gone:
                raise WorkerGone(self.gone)
            self._batches[batch_id] = settled
        try:
            self.send(("execute", batch_id, requests, separately))
        except OSError as exc:
            with self._lock:
                self._batches.pop(batch_id, None)
            raise WorkerGone(str(exc) or type(exc).__name__) from None
        return batch_id

    def begun(self, batch_id: int) -> int:
        """How many of batch ``batch_id``'s requests, sent to be executed separately, the worker had begun (the
        last of them is the one it was executing); 0 when none.  Meant for after the worker is lost."""
        return self._progress[1] + 1 if self._progress[0] == batch_id else 0

    def reply(self, call_id: int, payload: Any, final: bool = True) -> None:
        try:
            self.send(("reply", call_id, payload, final))
        except OSError:
            pass  # the worker is gone: nobody waits for the reply

    def release(self, refs: list[TensorRef]) -> None:
        if refs:
            try:
                self.send(("release", refs))
            except OSError:
                pass

    def _on_loop(self, call: Any, *arguments: Any) -> None:
        """Run ``call`` on the loop, waiting for it from another thread (a loop that has stopped: not at all)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            if asyncio.get_running_loop() is loop:
                call(*arguments)
                return
        except RuntimeError:
            pass  # not on a loop's thread
        if not loop.is_running():  # stopped: nothing else touches it now
            call(*arguments)
            return
        done: Future = Future()

        def run() -> None:
            try:
                call(*arguments)
            finally:
                done.set_result(None)

        try:
            loop.call_soon_threadsafe(run)
            done.result(5)
        except (RuntimeError, TimeoutError):
            pass  # the loop is closed or stopped: nothing reads on it any more

    def _watch_on_loop(self) -> None:
        assert self._loop is not None  # watched on the loop only where there is one
        self._loop.add_reader(self._fd, self._read_on_loop)
        # uvloop made it non-blocking; the connection reads and writes whole messages, on the loop and off it
        os.set_blocking(self._fd, True)

    def _read_on_loop(self) -> None:
        """The connection is readable (on the loop): one message."""
        try:
            message = recv_pickled(self.connection)
            self._route(message[0], message)
        except (EOFError, OSError):
            loop = self._loop
            assert loop is not None  # called by the loop's reader
            loop.remove_reader(self._fd)
            loop.run_in_executor(None, self._process_lost)  # describing the exit waits for the process

    def _read(self) -> None:
        connection = self.connection
        while True:
            try:
                message = recv_pickled(connection)
            except (EOFError, OSError):
                self._process_lost()
                return
            kind = message[0]
            try:
                self._route(kind, message)
            except (EOFError, OSError):
                self._process_lost()
                return

    def _process_lost(self) -> None:
        """The connection ended: the process is gone (describing how waits for it: never on the loop)."""
        self._lost(f"worker process {self.exit_description()}")

    def _route(self, kind: str, message: tuple) -> None:
        if kind == "segment":
            self.memory.receive_segment(self.connection, message[1], message[2])
        elif kind in ("results", "executed"):
            with self._lock:
                settled = self._batches.pop(message[1], None)
            if settled is not None:
                settled(message[2] if kind == "results" else None, None)
        elif kind == "response":
            self.events.on_response(self, message[1], message[2], message[3])
        elif kind == "release":
            self.arena.free(message[1])
        elif kind == "log":
            self.events.on_log(message[1], message[2])
        elif kind == "reschedule":
            self.events.on_reschedule(message[1])
        elif kind in ("bls", "metric", "control"):
            self.events.on_call(self, kind, message[1], message)
        elif kind == "bls_cancel" and len(message) == 2:  # a decoupled BLS call's cancel(): message[1] its call
            self.events.on_call(self, kind, None, message)
        elif kind == "ready":
            if message[1]:  # the model has is_ready
                with self._send_lock, contextlib.suppress(OSError):  # gone: its loss is being noticed
                    self.readiness = open_readiness(self.connection, self.process.pid)
            self._ready.set_result(None)
        elif kind == "error":
            self._ready.set_result(message[1])
        elif kind == "finalized":
            self._finalized.set_result(None)

    def _lost(self, why: str) -> None:
        self.close_direct()
        with self._lock:
            self.gone = why
            pending, self._batches = self._batches, {}
        for settled in pending.values():
            settled(None, why)
        for waiter in (self._ready, self._finalized):
            if not waiter.done():
                waiter.set_exception(WorkerGone(why))
