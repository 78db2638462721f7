"""The core as a front-end process sees it: every call goes to the model-owning process over its link.

Inference (and model load/unload) travels on an asyncio link, many calls at once; the cheap synchronous calls
the adapters make (health, metadata, statistics, shared-memory registration) take a blocking round trip on a
second socket, so the adapters stay unchanged. ``is_decoupled``, asked before every inference, is remembered
for a second.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from runtime.direct_path import DirectModel
from runtime.errors import InternalError, Unavailable
from runtime.frontends.messages import pack_request, unpack_response, unpack_stream_response
from runtime.frontends.wire import FrontEndLink, LinkClosed, open_link, receive_blocking, send_blocking
from runtime.types import InferRequest, InferResponse, ModelOutputs, StreamResponse

DECOUPLED_MEMORY_SECONDS = 1.0
DECOUPLED_MEMORY_ENTRIES = 1024
BLOCKING_CALL_TIMEOUT = 30.0
_GONE = "the server's model process is not answering"


class RemoteService:
    """Stands in for :class:`runtime.core.InferenceService` in a front-end process."""

    def __init__(self, link: socket.socket, control: socket.socket, on_lost: Callable[[], None]) -> None:
        self._link = link
        self._control = control
        self._control.settimeout(BLOCKING_CALL_TIMEOUT)
        self._control_lock = threading.Lock()
        self._on_lost = on_lost
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future | asyncio.Queue] = {}
        self._channel: FrontEndLink | None = None
        self._decoupled: dict[tuple[str, str], tuple[bool, float]] = {}
        self.lost = False
        self.shutting_down = False

    def begin_shutdown(self) -> None:
        """SIGTERM's drain began in this front end: readiness answers no from here on."""
        self.shutting_down = True

    async def connect(self) -> None:
        self._channel = await open_link(self._link, self._on_answer)
        self._channel.closed.add_done_callback(lambda _: self._lose())

    async def close(self) -> None:
        """Close the link once what is queued on it has been written."""
        if self._channel is not None:
            await self._channel.aclose()
        self._control.close()

    def started(self, failure: str | None) -> None:
        """Tell the owner this front end listens (or why it could not)."""
        self._send(("started", 0, "", (failure,)))

    async def beat(self, interval: float) -> None:
        """Tell the owner, every ``interval`` seconds, that this process's loop runs (until the link is lost)."""
        while not self.lost:
            self._send(("heartbeat", 0, "", ()))
            await asyncio.sleep(interval)

    # -- the asyncio link ---------------------------------------------------------------
    def _on_answer(self, answer: tuple) -> None:
        call_id, outcome, payload = answer
        waiting = self._waiting.get(call_id)
        if isinstance(waiting, asyncio.Queue):
            waiting.put_nowait((outcome, payload))
        elif waiting is not None and not waiting.done():
            if outcome == "ok":
                waiting.set_result(payload)
            else:
                waiting.set_exception(payload)

    def _lose(self) -> None:
        if self.lost:
            return
        self.lost = True
        for waiting in self._waiting.values():
            if isinstance(waiting, asyncio.Queue):
                waiting.put_nowait(("error", Unavailable(_GONE)))
            elif not waiting.done():
                waiting.set_exception(Unavailable(_GONE))
        self._on_lost()

    def _send(self, message: tuple, plain: bool = False) -> None:
        if self.lost or self._channel is None:
            raise Unavailable(_GONE)
        self._channel.send(message, plain)

    async def _call(self, method: str, *args: Any, kind: str = "call") -> Any:
        call_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        try:
            if kind == "infer":
                self._send(("infer", call_id, "", args[0]), plain=True)
            else:
                self._send((kind, call_id, method, args))
            return await future
        except asyncio.CancelledError:
            if not future.done() and not self.lost:
                self._send(("cancel", call_id, "", ()))
            raise
        finally:
            del self._waiting[call_id]

    # -- the blocking socket ------------------------------------------------------------
    def _blocking(self, method: str, *args: Any) -> Any:
        if self.lost:
            raise Unavailable(_GONE)
        with self._control_lock:
            try:
                send_blocking(self._control, ("call", 0, method, args))
                _, outcome, payload = receive_blocking(self._control)
            except (OSError, LinkClosed):  # a timeout leaves the socket out of step: the link is done
                self._lose()
                raise Unavailable(_GONE) from None
        if outcome != "ok":
            raise payload
        return payload

    # -- the core's interface -----------------------------------------------------------
    def live(self) -> bool:
        return not self.lost and self._blocking("live")

    def ready(self) -> bool:
        return not self.shutting_down and not self.lost and self._blocking("ready")

    def server_metadata(self) -> dict:
        return self._blocking("server_metadata")

    def model_ready(self, name: str, version: str = "") -> bool:
        return not self.shutting_down and self._blocking("model_ready", name, version)

    async def ready_checked(self) -> bool:
        return not self.shutting_down and not self.lost and await self._call("ready_checked")

    async def model_ready_checked(self, name: str, version: str = "") -> bool:
        return not self.shutting_down and not self.lost and await self._call("model_ready_checked", name, version)

    def require_model(self, name: str, version: str = "") -> None:
        self._blocking("require_model", name, version)

    def model_metadata(self, name: str, version: str = "") -> dict:
        return self._blocking("model_metadata", name, version)

    def model_config(self, name: str, version: str = "") -> Any:
        return self._blocking("model_config", name, version)

    def model_directory(self, name: str, version: str = "") -> str:
        return self._blocking("model_directory", name, version)

    def model_statistics(self, name: str = "", version: str = "") -> dict:
        return self._blocking("model_statistics", name, version)

    def repository_index(self, ready_only: bool = False) -> list[dict]:
        return self._blocking("repository_index", ready_only)

    def check_client_shared_memory(self) -> None:
        self._blocking("check_client_shared_memory")

    def register_system_shared_memory(self, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        self._blocking("register_system_shared_memory", name, key, offset, byte_size)

    def unregister_system_shared_memory(self, name: str = "") -> None:
        self._blocking("unregister_system_shared_memory", name)

    def system_shared_memory_status(self, name: str = "") -> list[dict]:
        return self._blocking("system_shared_memory_status", name)

    def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._blocking("register_cuda_shared_memory", name, raw_handle, device_id, byte_size)

    def unregister_cuda_shared_memory(self, name: str = "") -> None:
        self._blocking("unregister_cuda_shared_memory", name)

    def cuda_shared_memory_status(self, name: str = "") -> list[dict]:
        return self._blocking("cuda_shared_memory_status", name)

    def log_settings(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._blocking("log_settings", changes)

    def trace_settings(self, model: str = "", changes: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._blocking("trace_settings", model, changes)

    def is_decoupled(self, name: str, version: str = "") -> bool:
        key = (name, version)
        known = self._decoupled.get(key)
        now = time.monotonic()
        if known is not None and now - known[1] < DECOUPLED_MEMORY_SECONDS:
            return known[0]
        decoupled = self._blocking("is_decoupled", name, version)
        if len(self._decoupled) >= DECOUPLED_MEMORY_ENTRIES:  # version spellings are the client's: keep it bounded
            self._decoupled.clear()
        self._decoupled[key] = (decoupled, now)
        return decoupled

    def model_control_mode(self) -> str:
        return self._blocking("model_control_mode")

    async def load_model(self, name: str, parameters: dict | None = None) -> None:
        await self._call("load_model", name, parameters)

    async def unload_model(self, name: str, parameters: dict | None = None) -> None:
        await self._call("unload_model", name, parameters)

    async def ensure_model(self, name: str, version: str = "") -> None:
        await self._call("ensure_model", name, version)

    async def infer(self, request: InferRequest) -> InferResponse:
        return unpack_response(await self._call("infer", pack_request(request), kind="infer"))

    def tensor_buffer(self, nbytes: int, aligned_at: int = 0) -> Any:
        """None: a front end receives requests into its own memory (they travel on to the owner anyway)."""
        return None

    def direct_models(self) -> list[DirectModel]:
        """None: a front end's requests travel to the owner's core (its workers are the owner's children)."""
        return []

    def watch_direct_offer(self, changed: Callable[[], None]) -> Callable[[], None]:
        """Nothing to watch: a front end is offered no direct path."""
        return lambda: None

    def note_activity(self) -> None:
        """Nothing to note: a front end serves nothing past the owner."""

    def direct_response(self, request: InferRequest, outputs: ModelOutputs) -> InferResponse:
        raise InternalError("a front end serves no request past the owner's core")

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[StreamResponse, None]:
        call_id = next(self._ids)
        answers: asyncio.Queue = asyncio.Queue()
        self._waiting[call_id] = answers
        ended = False
        try:
            self._send(("stream", call_id, "", pack_request(request)), plain=True)
            while True:
                outcome, payload = await answers.get()
                if outcome == "item":
                    yield unpack_stream_response(payload)
                    continue
                ended = True
                if outcome == "error":
                    raise payload
                return
        finally:
            del self._waiting[call_id]
            if not ended and not self.lost:
                self._send(("cancel", call_id, "", ()))
