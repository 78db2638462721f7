"""A Python-backend worker process: hosts one model instance, talks to the server over one connection.

The worker runs in a session of its own, so signals meant for the server's process group (Ctrl-C in a
terminal, ``timeout``) reach only the server, which drains and then asks each worker to finalize.  A
worker whose server is gone exits on its own, even while user code is busy: it never outlives the server.

Threads: the main thread runs ``execute`` and, while idle, reads what the server sends itself (one wake-up per
batch, as Triton's stub has); while a model executes, whichever thread waits for a reply (a BLS call, a metric)
reads instead, and a send or ``is_cancelled`` takes whatever has arrived when nobody is reading (``inbox.py``).
Models may add threads of their own (decoupled senders).  Tensors travel through shared memory (see
``transport.py``).
"""

from __future__ import annotations

import itertools
import os
import queue
import select
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from typing import Any

import numpy as np

import triton_python_backend_utils as pb_utils
from handlers.python.inbox import Inbox
from handlers.python.readiness import serve_readiness
from handlers.python.runner import (
    BLS_ORIGIN,
    BlsOrigin,
    ModelRunner,
    RequestData,
    Result,
    RunnerSpec,
    error_result,
    response_result,
)
from handlers.python.transport import (
    POOL_SEGMENTS,
    Arena,
    PeerMemory,
    TensorRef,
    inline_ref,
    input_ref,
    send_direct,
    send_pickled,
)
from runtime.allocator import tune_allocator
from runtime.datatypes import datatype_of
from runtime.errors import ModelLoadError, Status
from runtime.thread_policy import run_as_batch

_PARENT_CHECK_SECONDS = 0.5


def encode_result(result: Result | None, arena: Arena | None,
                  in_pool: list[tuple[int, np.ndarray]] | None = None) -> Any:
    """A result with its arrays written into ``arena`` (arrays become TensorRefs; None: carried in the message),
    but an output that is one of ``in_pool`` (its request's inputs lying in the server's tensor pool), which is
    named by that input."""
    if result is None or result[0] != "ok":
        return result
    _, outputs, parameters = result
    if arena is None:  # a direct path's: every output in the message
        return ("ok", [(in_pool and input_ref(name, array, in_pool)) or inline_ref(name, array)
                       for name, array in outputs], parameters)
    return ("ok", [(in_pool and input_ref(name, array, in_pool)) or arena.write(name, array, datatype_of(array))
                   for name, array in outputs], parameters)


def _in_pool(refs: list[TensorRef], inputs: list[tuple[str, np.ndarray]]) -> list[tuple[int, np.ndarray]]:
    """(index, array) of the inputs that lie in the server's tensor pool (shared, read in place)."""
    return [(index, array) for index, (ref, (_, array)) in enumerate(zip(refs, inputs, strict=True))
            if ref[3] >= POOL_SEGMENTS]


def decode_result(result: Any, memory: PeerMemory, copy: bool) -> tuple[Any, list[TensorRef]]:
    """A result whose TensorRefs are read back into arrays; also the refs (to release)."""
    if result is None or result[0] != "ok":
        return result, []
    _, refs, parameters = result
    return ("ok", [(ref[0], memory.array(ref, copy=copy)) for ref in refs], parameters), list(refs)


class _Calls:
    """Replies the worker waits for, by call id."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._pending: dict[int, Any] = {}
        self._lock = threading.Lock()

    def open(self, streaming: bool = False) -> tuple[int, Any]:
        waiter: Any = queue.SimpleQueue() if streaming else Future()
        call_id = next(self._ids)
        with self._lock:
            self._pending[call_id] = waiter
        return call_id, waiter

    def deliver(self, call_id: int, payload: Any, final: bool = True) -> None:
        with self._lock:
            waiter = self._pending.pop(call_id, None) if final else self._pending.get(call_id)
        if isinstance(waiter, Future):
            waiter.set_result(payload)
        elif waiter is not None:
            waiter.put((payload, final))

    def fail_all(self, reason: str) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for waiter in pending.values():
            payload = ("error", reason, Status.UNAVAILABLE.value)
            waiter.set_result(payload) if isinstance(waiter, Future) else waiter.put((payload, True))


class WorkerHost:
    """What a model in a worker process calls out to: the server, over the connection."""

    def __init__(self, connection: Connection, spec: RunnerSpec, parent_pid: int) -> None:
        self.connection = connection
        self.spec = spec
        self.parent_pid = parent_pid
        self.arena = Arena()  # tensors this worker sends: outputs, BLS inputs
        self.server_memory = PeerMemory()  # tensors the server sends: inputs, BLS outputs
        self.calls = _Calls()
        self.cancelled: set[Any] = set()
        self.inbox = Inbox(connection, self._route)
        self._send_lock = threading.Lock()
        self.readiness_check: Any = None  # the model's is_ready, once it has loaded (readiness.py)

    def send_message(self, message: tuple, then_take_arrived: bool = True) -> None:
        """Send; then route what has arrived meanwhile (while a model executes nobody reads: released memory,
        cancellations), unless the caller goes on to read anyway (a batch's answer: the wait for the next)."""
        with self._send_lock:
            self.arena.announce(self.connection, self.parent_pid)
            send_pickled(self.connection, message)
        if then_take_arrived:
            self.inbox.take_arrived()

    def _route(self, message: tuple | None) -> None:
        """One message from the server (None: the connection closed), routed by the thread reading."""
        if message is None:
            self.calls.fail_all("the server went away")
            self.inbox.work.append(("finalize",))
            return
        kind = message[0]
        if kind == "segment":
            self.server_memory.receive_segment(self.connection, message[1], message[2])
        elif kind == "release":
            self.arena.free(message[1])
        elif kind == "reply":
            self.calls.deliver(message[1], message[2], message[3])
        elif kind == "cancel":
            self.cancelled.add(message[1])
        elif kind == "direct":
            self.inbox.add_direct(recv_handle(self.connection))
        elif kind == "readiness":  # the socket readiness probes come on (sent only where is_ready exists)
            fd = recv_handle(self.connection)
            if self.readiness_check is not None:
                serve_readiness(fd, self.readiness_check)
            else:
                os.close(fd)
        else:
            self.inbox.work.append(message)

    def next_work(self) -> tuple:
        """The next batch or finalize for the main thread, reading the connection until one comes."""
        work = self.inbox.work
        self.inbox.wait(lambda: bool(work))
        return work.popleft()

    # -- pb_utils.Host ---------------------------------------------------------------------------------------
    def infer(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        refs = [self.arena.write(t.name(), t.as_numpy(), datatype_of(t.as_numpy())) for t in request.inputs()]
        message = {
            "model_name": request.model_name(), "model_version": request.model_version(),
            "inputs": refs, "outputs": request.requested_output_names(), "request_id": request.request_id(),
            "parameters": request.parameters(), "correlation_id": request.correlation_id(),
            "flags": request.flags(), "timeout": request.timeout(), **BLS_ORIGIN.get().call(self.spec.model_name),
        }
        call_id, waiter = self.calls.open(streaming=decoupled)
        self.send_message(("bls", call_id, message, decoupled))
        if not decoupled:
            return self._bls_response(self._answer(waiter))
        return pb_utils.ResponseIterator(self._bls_stream(waiter),
                                         lambda: self.send_message(("bls_cancel", call_id)))

    def _answer(self, waiter: Future) -> Any:
        """A call's reply, reading the connection while it has not come."""
        self.inbox.wait(waiter.done)
        return waiter.result()

    def _bls_response(self, payload: Any) -> pb_utils.InferenceResponse:
        result, refs = decode_result(payload, self.server_memory, copy=True)
        if refs:
            self.send_message(("release", refs))
        if result[0] == "ok":
            return pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in result[1]], parameters=result[2])
        from handlers.python.runner import TRITON_CODE_BY_STATUS

        code = TRITON_CODE_BY_STATUS.get(Status(result[2]), pb_utils.TritonError.INTERNAL)
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(result[1], code))

    def _bls_stream(self, waiter: queue.SimpleQueue) -> Iterator[pb_utils.InferenceResponse]:
        while True:
            self.inbox.wait(lambda: not waiter.empty())
            payload, final = waiter.get()
            if payload is not None:
                yield self._bls_response(payload)
            if final:
                return

    def send(self, key: Any, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        result = None if response is None else response_result(response, self.spec.model_name)
        if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.cancelled.discard(key)
        try:
            encoded = encode_result(result, self.arena)
        except (MemoryError, ValueError, TypeError) as exc:
            encoded = error_result(f"cannot send the response: {type(exc).__name__}: {exc}")
        self.send_message(("response", key, encoded, flags))

    def is_cancelled(self, key: Any) -> bool:
        self.inbox.take_arrived()
        return key in self.cancelled

    def reschedule(self, key: Any) -> None:
        self.send_message(("reschedule", key))

    def log(self, level: str, message: str) -> None:
        self.send_message(("log", level, message))

    def metric(self, operation: str, *arguments: Any) -> Any:
        if operation != "value":
            self.send_message(("metric", None, operation, arguments))
            return None
        call_id, waiter = self.calls.open()
        self.send_message(("metric", call_id, operation, arguments))
        return self._reply(self._answer(waiter))

    def control(self, operation: str, *arguments: Any) -> Any:
        call_id, waiter = self.calls.open()
        self.send_message(("control", call_id, operation, arguments))
        return self._reply(self._answer(waiter))

    @staticmethod
    def _reply(payload: Any) -> Any:
        if isinstance(payload, tuple) and payload and payload[0] == "error":
            raise pb_utils.TritonModelException(payload[1])
        return payload[1] if isinstance(payload, tuple) else payload


def _exit_when_orphaned(server_pid: int) -> None:
    """Exit once the server is gone: this process was re-parented (its parent, the server or the template
    process forked for it, ended), or the server's pid is gone. Where the kernel gives process handles (pidfd,
    Linux 5.3) the thread sleeps until one of them ends; elsewhere it looks every _PARENT_CHECK_SECONDS."""
    parent = os.getppid()
    handles = _process_handles((parent, server_pid))
    if handles is not None:
        if os.getppid() != parent:  # the parent ended before its handle was taken
            os._exit(0)
        ended = select.poll()
        for handle in handles:
            ended.register(handle, select.POLLIN)
        while not ended.poll():
            pass
        os._exit(0)
    while True:
        time.sleep(_PARENT_CHECK_SECONDS)
        if os.getppid() != parent:
            os._exit(0)
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:
            pass  # a pid reused by another user's process: the re-parenting check still holds


def _process_handles(pids: tuple[int, ...]) -> list[int] | None:
    """A pidfd for each process, readable once it ends (None: the kernel or a sandbox gives none); a process
    already gone ends this one."""
    open_handle = getattr(os, "pidfd_open", None)
    if open_handle is None:
        return None
    handles = []
    for pid in dict.fromkeys(pids):
        try:
            handles.append(open_handle(pid))
        except ProcessLookupError:
            os._exit(0)
        except OSError:
            for handle in handles:
                os.close(handle)
            return None
    return handles


def _execute(runner: ModelRunner, host: WorkerHost, batch_id: int, requests: list, separately: bool,
             progress: Any = None, direct: int | None = None) -> None:
    """Execute a batch (``separately``: each request alone, one after another, a model without dynamic batching
    as Triton runs it, ``progress`` told which it begins) and send its results, together (on ``direct``, a direct
    path's socket, for a batch that came that way: its outputs inside the message)."""
    try:
        batch = [RequestData(key=key, inputs=[(ref[0], host.server_memory.array(ref)) for ref in refs],
                             request_id=request_id, outputs=outputs, parameters=parameters,
                             correlation_id=correlation, flags=flags, timeout=timeout)
                 for key, refs, request_id, outputs, parameters, correlation, flags, timeout, *_ in requests]
        origin = BlsOrigin(max((tuple(request[8]) for request in requests), key=len, default=()),
                           requests[0][9] if requests else 0)
    except Exception as exc:  # noqa: BLE001 - a batch that cannot be read fails itself, never the worker
        _send_results(host, batch_id, [error_result(f"the batch could not be read: {type(exc).__name__}: {exc}")]
                      * len(requests), direct)
        return
    results: list | None
    if separately:  # never decoupled (the server sends such a model's requests one by one)
        results = []
        for index, data in enumerate(batch):
            if progress is not None:  # should this one take the process down, the server re-queues those after it
                progress[0], progress[1] = batch_id, index
            results.extend(_run(runner, [data], origin) or ())
    else:
        results = _run(runner, batch, origin)
    if results is None:
        host.send_message(("executed", batch_id), then_take_arrived=False)
        return
    for data in batch:
        host.cancelled.discard(data.key)
    try:
        arena = host.arena if direct is None else None
        encoded = [encode_result(result, arena, _in_pool(request[1], data.inputs))
                   for request, data, result in zip(requests, batch, results, strict=True)]
    except (MemoryError, ValueError, TypeError) as exc:
        encoded = [error_result(f"cannot return the outputs: {type(exc).__name__}: {exc}")] * len(batch)
    _send_results(host, batch_id, encoded, direct)


def _send_results(host: WorkerHost, batch_id: int, encoded: list, direct: int | None) -> None:
    """A batch's results, on ``direct`` (a direct path's socket) for a batch that came that way."""
    if direct is not None:
        try:
            try:
                send_direct(direct, ("results", batch_id, encoded))
            except ValueError as exc:
                send_direct(direct, ("results", batch_id, [error_result(f"cannot return the outputs: {exc}")]))
        except OSError:
            pass  # the server closed the door meanwhile: nobody waits for the answer
        return
    host.send_message(("results", batch_id, encoded), then_take_arrived=False)  # next_work reads next


def _run(runner: ModelRunner, batch: list[RequestData], origin: BlsOrigin) -> list | None:
    try:
        results = runner.execute(batch, origin)
        return None if results is None else list(results)
    except BaseException as exc:  # noqa: BLE001 - never lose the batch, whatever happened
        return [error_result(f"execute failed: {type(exc).__name__}: {exc}")] * len(batch)


def worker_main(connection: Connection, spec: RunnerSpec, parent_pid: int, progress: Any = None) -> None:
    """The worker process: load the model, then execute what the server sends until told to finalize
    (``progress``: shared memory where it writes which request of a separate hand-off it begins)."""
    os.setsid()
    if spec.batch_scheduled:
        run_as_batch()  # waking it to execute never preempts the server's event loop
    tune_allocator()  # outputs are built in fresh buffers too
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True, name="parent-watch").start()
    host = WorkerHost(connection, spec, parent_pid)
    runner = ModelRunner(spec, host)
    try:
        runner.load()
    except ModelLoadError as exc:
        host.send_message(("error", str(exc)))
        return
    host.readiness_check = runner.readiness_check()
    host.send_message(("ready", host.readiness_check is not None))  # True: the server opens a readiness socket
    while True:
        message = host.next_work()
        if message[0] == "execute":
            _execute(runner, host, message[1], message[2], message[3], progress)
        elif message[0] == "direct":
            _execute(runner, host, message[1], message[2], message[3], progress, direct=host.inbox.direct)
        elif message[0] == "unreadable":  # a direct batch whose message could not be read: its one request fails
            _send_results(host, 0, [error_result(f"the request could not be read: {message[1]}")],
                          host.inbox.direct)
        elif message[0] == "finalize":
            runner.finalize()
            try:
                host.send_message(("finalized", None))
            except OSError:
                pass
            return


def auto_complete_main(connection: Connection, spec: RunnerSpec, config: dict) -> None:
    """A short-lived process that runs ``auto_complete_config`` (user code never runs in the server)."""
    os.setsid()
    from handlers.python.runner import auto_complete

    try:
        connection.send(("ok", auto_complete(spec, config)))
    except ModelLoadError as exc:
        connection.send(("error", str(exc)))

