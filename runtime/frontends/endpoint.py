"""The owner's side of a front-end link: calls on the inference core, made for a front-end process.

Requests are ``(kind, call id, method, args)``: ``infer`` runs one inference and ``stream`` iterates
:meth:`InferenceService.infer_stream` (requests and responses packed as plain tuples,
:mod:`runtime.frontends.messages`), ``call`` runs another core method (awaited when it is a coroutine),
``cancel`` cancels a running call (its client went away). Answers are ``(call id, outcome, payload)`` with
outcome ``ok``, ``error`` (a :class:`ServingError`), ``item`` (one streamed response) or ``end``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from runtime.api import REMOTE_CALLS
from runtime.errors import InternalError, ServingError
from runtime.frontends.messages import pack_response, pack_stream_response, unpack_request
from runtime.frontends.wire import FrontEndLink, open_link

logger = logging.getLogger(__name__)

# What a front end may call: the core's interface (runtime/api.py), nothing else.
CALLABLE = REMOTE_CALLS


def as_serving_error(exc: BaseException) -> ServingError:
    """A serving error as it is; anything else becomes an internal error (logged here, not sent)."""
    if isinstance(exc, ServingError):
        return exc
    logger.error("unexpected error answering a front end", exc_info=exc)
    return InternalError("internal server error")


class OwnerEndpoint:
    """Answers one front-end process's calls on the core (``service``), as its link delivers them."""

    def __init__(self, service: Any, on_started: Callable[[str | None], None] | None = None,
                 on_heartbeat: Callable[[], None] | None = None) -> None:
        self.service = service
        self.on_started = on_started
        self.on_heartbeat = on_heartbeat
        self.link: FrontEndLink | None = None
        self.running: dict[int, asyncio.Task] = {}

    def on_message(self, message: tuple) -> None:
        kind, call_id, method, args = message
        if kind == "infer":
            self._start(call_id, self._await(call_id, self._infer(args), plain=True))
        elif kind == "call" and method in CALLABLE:
            self._call(call_id, method, args)
        elif kind == "cancel":
            task = self.running.get(call_id)
            if task is not None:
                task.cancel()
        elif kind == "stream":
            self._start(call_id, self._stream(call_id, args))
        elif kind == "heartbeat":  # the front end's loop runs (a frozen one falls silent and is replaced)
            if self.on_heartbeat is not None:
                self.on_heartbeat()
        elif kind == "started":  # the front end listens now, or says why it cannot
            if self.on_started is not None:
                self.on_started(args[0])
        else:
            self._send((call_id, "error", InternalError(f"no such call: {method}")))

    def stop(self) -> None:
        """The link is gone: the front end's calls still running are cancelled."""
        for task in list(self.running.values()):
            task.cancel()
        if self.link is not None:
            self.link.close()

    def _call(self, call_id: int, method: str, args: tuple) -> None:
        try:
            result = getattr(self.service, method)(*args)
        except Exception as exc:  # noqa: BLE001 - every failure goes back as an answer
            self._send((call_id, "error", as_serving_error(exc)))
            return
        if asyncio.iscoroutine(result):
            self._start(call_id, self._await(call_id, result))
        else:
            self._send((call_id, "ok", result))

    def _start(self, call_id: int, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self.running[call_id] = task
        task.add_done_callback(lambda _: self.running.pop(call_id, None))

    async def _infer(self, packed: tuple) -> tuple:
        return pack_response(await self.service.infer(unpack_request(packed)))

    async def _await(self, call_id: int, pending: Any, plain: bool = False) -> None:
        try:
            result = await pending
        except asyncio.CancelledError:
            return  # the front end stopped waiting: nothing to answer
        except Exception as exc:  # noqa: BLE001
            self._send((call_id, "error", as_serving_error(exc)))
            return
        self._send((call_id, "ok", result), plain)

    async def _stream(self, call_id: int, packed: tuple) -> None:
        try:
            async for item in self.service.infer_stream(unpack_request(packed)):
                self._send((call_id, "item", pack_stream_response(item, as_serving_error)), plain=True)
        except asyncio.CancelledError:
            return
        except Exception as exc:  # noqa: BLE001
            self._send((call_id, "error", as_serving_error(exc)))
            return
        self._send((call_id, "end", None))

    def _send(self, answer: tuple, plain: bool = False) -> None:
        if self.link is None or self.link.is_closing():
            return
        try:
            self.link.send(answer, plain)
        except Exception as exc:  # noqa: BLE001 - an answer that cannot be pickled still answers the call
            self.link.send((answer[0], "error", as_serving_error(exc)))


async def serve_link(service: Any, sock: Any, on_started: Callable[[str | None], None] | None = None,
                     on_heartbeat: Callable[[], None] | None = None) -> None:
    """Serve one front end's link (a connected Unix socket) until it closes (or this is cancelled)."""
    endpoint = OwnerEndpoint(service, on_started, on_heartbeat)
    try:
        endpoint.link = await open_link(sock, endpoint.on_message)
        await asyncio.shield(endpoint.link.closed)
    finally:
        endpoint.stop()
