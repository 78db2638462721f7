"""The lanes (``lane.h``, in the ``_native_lanes`` module built from this folder): a plain infer request to a model
the core offers a direct path for (``runtime/direct_path.py``) is served in the adapter's own thread, straight to
the model's worker and back, without the event loop. Both adapters hand them requests: the native gRPC edge a plain
ModelInfer call (it takes the lane table as :meth:`NativeLanes.table_capsule`, and gives back to
:meth:`NativeLanes.settle` what a lane gives back), the HTTP route a lone request with binary tensors
(``runtime/http/lane_route.py``, ``http_lane.h``: :meth:`NativeLanes.take_http`), its outcome coming back as the
table's event. Where the module is not built (:func:`open_lanes` is None), every request goes through the core.

On the loop, every ``RECONCILE_SECONDS`` (up to ``IDLE_RECONCILE_SECONDS`` while nothing changes, and at once when
the core says its offer changed), the open lanes follow what the core offers: a lane opens on each offered model's
side door, and is retired where the model's version or worker changed or the model left the offer (unloaded,
tracing turned on, the server shutting down); the handler also stops a lane itself before its worker stops (the
door's closing hook). A lane takes a request only while it is the only infer request at its adapter and the
model's own queue is idle; while its call executes, the model's scheduler waits for it before running a batch (the table
tells when it ends: :meth:`NativeLanes.freed`). What the lanes serve is counted in the models' statistics whenever those
are read, and keeps the server from idling out. A request a lane gives back is finished here in the core's words
(:meth:`NativeLanes.settle`, for either protocol): an answer the lane does not write itself (response parameters, a
missing output, an error too long, a model asking to see the request again, which is then served afresh), or a
worker that went away or did not answer in time.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from runtime.api import InferenceApi
from runtime.config.spec import ModelSpec
from runtime.datatypes import wire_dtype
from runtime.direct_path import SERVE_AGAIN, DirectModel, LaneAnswer, LaneRequest
from runtime.errors import InternalError, ServingError, Status, Unavailable
from runtime.idle_timers import aligned_delay
from runtime.types import InferRequest, RequestedOutput

logger = logging.getLogger(__name__)

RECONCILE_SECONDS = 0.25
IDLE_RECONCILE_SECONDS = 2.0  # the longest between looks while nothing changes
STOP_WAIT_SECONDS = 30.0  # a lane stopped before its worker stops: how long its call under way may take


# Not built where the package was installed without a C++ compiler.
NATIVE_LANES_BUILT = importlib.util.find_spec("runtime.native._native_lanes") is not None


def native_lanes_module() -> ModuleType | None:
    """The lanes' extension module; None where it is not built (no compiler at install)."""
    try:
        return importlib.import_module("runtime.native._native_lanes")
    except ImportError:
        return None


def open_lanes(service: InferenceApi, max_error_bytes: int) -> NativeLanes | None:
    """Lanes over ``service`` on the running loop (not yet started), or None where the module is not built;
    ``max_error_bytes``: a model's error message longer than this goes back to Python, which cuts it as the
    adapters do."""
    native = native_lanes_module()
    if native is None:
        logger.warning("the native lanes are not built (no C++ compiler at install): every request goes through "
                       "the core")
        return None
    return NativeLanes(native, service, asyncio.get_running_loop(), max_error_bytes)


def lane_inputs(spec: ModelSpec) -> list[tuple[str, str, list[int], int]]:
    """A model's inputs as its lane takes them: name, datatype, dims (-1: any size), bytes an element (the core
    offers no model with BYTES inputs)."""
    return [(t.name, t.datatype, list(t.dims), wire_dtype(t.datatype).itemsize) for t in spec.inputs]


@dataclass
class _OpenLane:
    lane: Any  # _native_lanes.Lane
    model: DirectModel
    stop_watching: Callable[[], None]
    stop_counting: Callable[[], None]
    stop_closing: Callable[[], None]
    taken: int = 0
    retired_at: float = 0.0  # monotonic; 0 while open


class NativeLanes:
    """The lanes of one process's adapters (see the module)."""

    def __init__(self, native: Any, service: InferenceApi, loop: asyncio.AbstractEventLoop,
                 max_error_bytes: int) -> None:
        self.native, self.service, self.loop = native, service, loop
        self.max_error_bytes = max_error_bytes
        self.table = native.LaneTable()
        self.open: dict[str, _OpenLane] = {}  # model name -> its lane
        self.retired: dict[int, _OpenLane] = {}  # lane id -> a lane no longer taking calls, until it is quiet
        self._waiting: dict[int, list[asyncio.Future]] = {}  # lane id -> schedulers waiting for its instance
        self._timer: asyncio.Handle | None = None
        self._interval = RECONCILE_SECONDS
        self._stop_watching_offer: Callable[[], None] = lambda: None
        self._http: dict[int, LaneRequest] = {}  # token -> an HTTP request a lane serves
        self._tokens = itertools.count(1)

    def table_capsule(self) -> Any:
        """The lane table for the native gRPC edge (its ``lanes``)."""
        return self.table.capsule()

    def start(self) -> None:
        self.loop.add_reader(self.table.fileno(), self.take_events)
        self._timer = self.loop.call_soon(self._tick)
        self._stop_watching_offer = self.service.watch_direct_offer(self._offer_changed)

    def take_events(self) -> None:
        """What the lanes told since the last take (on the loop): a lane free again, an HTTP request's outcome."""
        for kind, payload in self.table.take():
            if kind == self.native.HTTP:
                self.http_outcome(payload)
            else:
                self.freed(payload)

    def stop(self) -> None:
        """Take no more requests (those under way are answered: the adapters' drains wait for them)."""
        self._stop_watching_offer()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for name in list(self.open):
            self._retire(name)

    async def drain(self, stops: list[Awaitable[object]], grace: float) -> bool:
        """The adapters' drain with the lanes in it: no request taken from now on, the adapters' ``stops`` (each
        drains its own requests within ``grace`` seconds; the gRPC edge's waits for the calls lanes serve), then the
        HTTP requests lanes took (:meth:`quiet`), then every lane closed. False where something was cut off: a stop
        said so, or a lane was still serving at the deadline (the core's drain sees neither)."""
        busy_at_deadline = False

        def check_deadline() -> None:
            nonlocal busy_at_deadline
            busy_at_deadline = self.busy()

        self.stop()
        deadline_check = self.loop.call_later(grace, check_deadline)
        started = time.monotonic()
        results = await asyncio.gather(*stops, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                logger.error("an adapter failed to stop: %r", result)
        await self.quiet(max(0.0, grace - (time.monotonic() - started)))
        self.take_events()  # an outcome the table holds but the loop's reader has not taken yet
        deadline_check.cancel()
        cut_off = busy_at_deadline or self.busy()  # busy now: the deadline had not come, or it ran past
        self.close()
        return not cut_off and not any(result is False for result in results)

    async def quiet(self, timeout: float) -> None:
        """Once every HTTP request a lane took has its outcome, or ``timeout`` seconds on. Its outcome, not the
        lane's busy flag, is waited for: a lane is free again just before it hands the outcome over, which the loop
        still has to take."""
        deadline = time.monotonic() + timeout
        while self._http and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def busy(self) -> bool:
        """Whether a lane is serving a request now, or an HTTP request it took awaits its outcome (the core's drain
        sees neither)."""
        return bool(self._http) or any(entry.lane.busy for entry in (*self.open.values(), *self.retired.values()))

    def close(self) -> None:
        """After the adapters have shut down: every lane's socket closed, its thread ended, and an HTTP request still
        without its outcome (cut off at the deadline) ended as the core's cut off requests are."""
        self.stop()
        self.take_events()  # an outcome the table holds but the loop's reader has not taken yet
        self.loop.remove_reader(self.table.fileno())
        for entry in self.retired.values():
            self._end(entry)
        self.retired.clear()
        for request in self._http.values():
            if not request.future.done():
                request.future.set_result(Unavailable("the server is shutting down"))
        self._http.clear()

    def _offer_changed(self) -> None:
        """The core says its offer may have changed (in any thread): the lanes follow at once (on the loop, before
        the call that changed it returns)."""
        try:
            here = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            here = False
        if here:
            self._tick_now()
        else:
            self.loop.call_soon_threadsafe(self._tick_now)

    def _tick_now(self) -> None:
        if self._timer is None:  # stopped
            return
        self._timer.cancel()
        self._interval = RECONCILE_SECONDS
        self._tick()

    def _tick(self) -> None:
        changed = True
        try:
            changed = self.reconcile()
        except Exception:  # noqa: BLE001 - the lanes stay as they were until the next tick
            logger.exception("unexpected error following the direct paths the core offers")
        # while nothing changes, the core's offer is looked at less and less often (up to IDLE_RECONCILE_SECONDS):
        # what changes it (tracing's settings, a model loaded or unloaded, the drain) is told at once
        # (watch_direct_offer), and a worker going away stops its lane itself
        self._interval = RECONCILE_SECONDS if changed else min(self._interval * 2, IDLE_RECONCILE_SECONDS)
        self._timer = self.loop.call_later(aligned_delay(self._interval), self._tick)  # with the other looks

    def reconcile(self) -> bool:
        """Open and retire lanes to follow the core's offer; note the server active while lanes serve. Whether
        anything changed or served since the last look (or a request waits on a lane)."""
        offered = {model.spec.name: model for model in self.service.direct_models()}
        before = (set(self.open), set(self.retired))
        active = bool(self._http)
        for name, entry in list(self.open.items()):
            model = offered.get(name)
            if (model is None or model.channel is not entry.model.channel or model.version != entry.model.version
                    or not entry.lane.open):
                self._retire(name)
                continue
            taken = entry.lane.taken
            active = active or taken != entry.taken or entry.lane.busy
            entry.taken = taken
        for name, model in offered.items():
            # one reader on a worker's socket at a time: a retired lane's, still reading until it ends, would take
            # (and split) the answers of a new lane on the same side door
            if name not in self.open and not any(entry.model.channel is model.channel
                                                 for entry in self.retired.values()):
                self._open(model)
        now = time.monotonic()
        for lane_id, entry in list(self.retired.items()):
            active = active or entry.lane.busy
            if not entry.lane.busy and now - entry.retired_at > 2 * RECONCILE_SECONDS:
                self._end(entry)  # its hand-backs, pushed before it went quiet, have been taken by now
                del self.retired[lane_id]
        if active:
            self.service.note_activity()
        return active or before != (set(self.open), set(self.retired))

    def _open(self, model: DirectModel) -> None:
        spec, channel = model.spec, model.channel
        lane = self.native.Lane(
            model=spec.name, version=str(model.version), inputs=lane_inputs(spec),
            outputs=[t.name for t in spec.outputs], max_batch_size=spec.max_batch_size,
            timeout_s=channel.execute_timeout, max_details=self.max_error_bytes,
            socket_fd=channel.socket_fd, buffer_fd=channel.buffer_fd, buffer_size=channel.buffer_size,
            buffer_segment=channel.buffer_segment)
        stop_closing = channel.on_close(lambda wait: self._closing(lane, wait))
        if stop_closing is None:
            lane.shutdown()
            return
        entry = _OpenLane(lane, model, model.watch_idle(lane.set_idle, lambda: self._held(lane)),
                          model.add_served(lane.take_served, lambda: (bool(lane.open), bool(lane.busy))),
                          stop_closing)
        self.open[spec.name] = entry
        self.table.add(lane)

    def _closing(self, lane: Any, wait: bool) -> None:
        """The handler's hook, in its thread, before the worker stops (``wait``: for the call under way) or after
        it went away; the loop retires the lane at its next tick."""
        self.table.remove(lane)
        lane.stop()
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        while wait and lane.busy and time.monotonic() < deadline:
            time.sleep(0.001)
        lane.shutdown()

    def _retire(self, name: str) -> None:
        entry = self.open.pop(name)
        self.table.remove(entry.lane)
        entry.lane.stop()
        entry.stop_watching()
        entry.retired_at = time.monotonic()
        self.retired[entry.lane.id] = entry

    def _end(self, entry: _OpenLane) -> None:
        entry.lane.shutdown()
        entry.stop_closing()  # the door may take another lane: nothing of this one kept
        entry.stop_counting()  # its last counts
        self.freed(entry.lane.id)

    def _held(self, lane: Any) -> asyncio.Future | None:
        """The model's scheduler is about to run a batch: what to await first, where this lane's call holds the
        instance (the table tells when it ends: :meth:`freed`)."""
        if not lane.tell_when_free():
            return None
        waiting = self.loop.create_future()
        self._waiting.setdefault(lane.id, []).append(waiting)
        return waiting

    def freed(self, lane_id: int) -> None:
        """The lane's call has ended (on the loop)."""
        for waiting in self._waiting.pop(lane_id, ()):
            if not waiting.done():
                waiting.set_result(None)

    def _entry(self, lane_id: int) -> _OpenLane | None:
        for entry in self.open.values():
            if entry.lane.id == lane_id:
                return entry
        return self.retired.get(lane_id)

    # -- HTTP requests (runtime/http/lane_route.py) --------------------------------------------------------------
    def take_http(self, model: str, version: str, request_id: str, inputs: list[tuple[str, str, list[int], int]],
                  outputs: list[str], chunks: list[bytes], header_length: int) -> LaneRequest | None:
        """A lone HTTP request with binary tensors served by its model's lane (http_lane.h), or None where
        none takes it (nothing touched)."""
        token = next(self._tokens)
        try:
            taken = self.table.take_http(token, model, version, request_id, inputs, outputs, chunks, header_length)
        except (TypeError, ValueError, OverflowError):  # what C++ cannot hold (a dim past int64, a lone surrogate)
            return None  # is the core's to refuse
        if not taken:
            return None
        request = LaneRequest(token, model, self.loop.create_future(), [RequestedOutput(name, {"binary_data": True})
                                                                        for name in outputs])
        self._http[token] = request
        return request

    def withdraw(self, request: LaneRequest) -> None:
        """The request's client went away: the worker is told (the model may notice), its outcome dropped."""
        if self._http.pop(request.token, None) is not None:
            self.table.cancel_http(request.model, request.token)

    def http_outcome(self, payload: tuple) -> None:
        """An HTTP request's outcome from its lane (on the loop)."""
        token, (kind, *fields) = payload
        request = self._http.pop(token, None)

        def settled(outcome: object) -> None:
            if request is not None and not request.future.done():
                request.future.set_result(outcome)

        try:
            if kind == "answer":
                settled(LaneAnswer(fields[0], fields[1]))
            elif kind == "error":
                settled(ServingError(fields[1], Status(fields[0])))
            else:  # given back: settled even where no one waits (a lost worker is restarted)
                self.settle(fields[0], request.requested if request is not None else None, settled)
        except Exception:  # noqa: BLE001 - the request still ends
            logger.exception("unexpected error settling an HTTP request a lane served")
            settled(InternalError("internal server error"))

    # -- requests given back ---------------------------------------------------------------------------------------
    def settle(self, fields: tuple, requested: list[RequestedOutput] | None,
               settled: Callable[[object], None]) -> None:
        """A request a lane gave back, in the core's words: ``settled`` gets the core's InferResponse, its
        ServingError, or SERVE_AGAIN (the model asked to see the request again: serve it afresh), on the loop."""
        lane_id, why, frame, request_id, inputs, requested_names, batch_size, elapsed_ns = fields
        entry = self._entry(lane_id)
        if entry is None:  # cannot happen while lanes are kept until quiet; the request still ends
            settled(InternalError("internal server error"))
            return
        model = entry.model
        if why != "answer":
            threading.Thread(target=self._fail_with_worker, args=(settled, model, why == "timeout", elapsed_ns),
                             daemon=True, name="direct-failure").start()
            return
        outcome = model.channel.read_answer(frame, inputs)
        if outcome is None:
            settled(SERVE_AGAIN)
            return
        request = InferRequest(model.spec.name, str(model.version), id=request_id,
                               outputs=requested or [RequestedOutput(name) for name in requested_names])
        try:
            if isinstance(outcome, ServingError):
                raise outcome
            response = self.service.direct_response(request, outcome)
        except ServingError as error:
            model.record_served([], 1, elapsed_ns, time.time_ns())
            settled(error)
            return
        model.record_served([(batch_size, 1, elapsed_ns, 0, elapsed_ns, 0)], 0, 0, time.time_ns())
        settled(response)

    def _fail_with_worker(self, settled: Callable[[object], None], model: DirectModel, timed_out: bool,
                          elapsed_ns: int) -> None:
        """In a thread (describing a lost worker waits for it; a late one is dropped)."""
        try:
            message = model.channel.failure(timed_out)
        except Exception:  # noqa: BLE001 - the request still ends
            logger.exception("unexpected error describing a direct path's worker")
            message = "the model's worker went away"
        model.record_served([], 1, elapsed_ns, time.time_ns())
        self.loop.call_soon_threadsafe(settled, InternalError(message))
