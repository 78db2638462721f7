"""One completion or chat request's run over the core: answered whole, or as Server-Sent Events in OpenAI's chunk
format ending with ``data: [DONE]``.  With tools offered a stream's text is held until it ends (it may be a tool
call, parsed then), at most ``max_tool_call_parse_bytes`` of it, as Triton's ``--max-tool-call-parse-bytes``: past
that the model is cancelled and the stream ends with what was held and ``finish_reason: "length"``."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import Response, StreamingResponse

from runtime.api import InferenceApi
from runtime.errors import ServingError
from runtime.http.generate import EVENT_STREAM
from runtime.openai.chat import parse_tool_calls
from runtime.openai.generation import Piece, Sampling, StopScan, Usage, finish_reason, inference_request, pieces
from runtime.openai.llm_model import LlmModel
from runtime.openai.options import DEFAULT_MAX_TOOL_CALL_PARSE_BYTES

logger = logging.getLogger(__name__)


def _sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class Generation:
    """One completion or chat request's run over the core, answered whole or as a stream of chunks."""

    def __init__(self, service: InferenceApi, model: LlmModel, prompt: str, sampling: Sampling, kind: str,
                 max_tool_call_parse_bytes: int = DEFAULT_MAX_TOOL_CALL_PARSE_BYTES) -> None:
        self.service = service
        self.max_tool_call_parse_bytes = max_tool_call_parse_bytes
        self.model = model
        self.prompt = prompt
        self.sampling = sampling
        self.id = f"{kind}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def envelope(self, obj: str, choices: list[dict], usage: dict | None) -> dict[str, Any]:
        """A response, or a stream's chunk (usage only in the last, and only when asked for)."""
        answer: dict[str, Any] = {"id": self.id, "object": obj, "created": self.created, "model": self.model.name,
                                  "choices": choices}
        if usage is not None or not self.sampling.stream:
            answer["usage"] = usage
        return answer

    async def run(self) -> tuple[str, str, dict | None]:
        """The whole text, the finish reason and the usage."""
        scan, usage, given, parts = StopScan(self.sampling.stops), Usage(), None, []
        stream = self.service.infer_stream(inference_request(self.model, self.prompt, self.sampling))
        try:
            async for piece in pieces(self.model, stream):
                usage.add(piece)
                given = piece.finish_reason or given
                parts.append(scan.feed(piece.text))
                if scan.stopped:
                    break
        finally:
            await stream.aclose()  # a stop sequence seen: the rest is not wanted (the model is cancelled)
        text = "".join(parts) + scan.flush()
        counted = await asyncio.to_thread(usage.finish, self.model, self.prompt, text)  # a tokenizer: off the loop
        return text, finish_reason(given, usage, self.sampling, scan.stopped), counted

    async def stream_response(self, chunk: Callable[[str], dict], obj: str, role: bool = False, tools: bool = False,
                              prefix: str = "") -> Response:
        """Server-sent events; an error before the first piece answers with its status instead."""
        stream = self.service.infer_stream(inference_request(self.model, self.prompt, self.sampling))
        generated = pieces(self.model, stream)
        try:
            first = await anext(generated, None)
        except BaseException:
            await stream.aclose()
            raise
        return StreamingResponse(self._events(first, generated, stream, chunk, obj, role, tools, prefix),
                                 media_type=EVENT_STREAM)

    async def _events(self, first: Piece | None, generated: AsyncIterator[Piece], stream: Any,
                      chunk: Callable[[str], dict], obj: str, role: bool, tools: bool,
                      prefix: str) -> AsyncIterator[bytes]:
        scan, usage, given, sent = StopScan(self.sampling.stops), Usage(), None, []
        held, truncated = 0, False  # with tools offered: the text's bytes held so far; past the bound: cut
        try:
            if role:
                opening = chunk("")
                opening["delta"] = {"role": "assistant", "content": ""}
                yield _sse(self.envelope(obj, [opening | {"finish_reason": None}], None))
            if prefix:
                yield _sse(self.envelope(obj, [chunk(prefix) | {"finish_reason": None}], None))
            piece = first
            while piece is not None:
                usage.add(piece)
                given = piece.finish_reason or given
                text = scan.feed(piece.text)
                if tools:  # the text is held: it may be a call, parsed at the end
                    held += len(text.encode())
                    if held > self.max_tool_call_parse_bytes:
                        logger.warning("a streamed chat's tool-call text passed %d bytes: truncated, the model "
                                       "cancelled", self.max_tool_call_parse_bytes)
                        truncated = True
                        break
                sent.append(text)
                if text and not tools:
                    yield _sse(self.envelope(obj, [chunk(text) | {"finish_reason": None}], None))
                if scan.stopped:
                    break
                piece = await anext(generated, None)
            tail = "" if truncated else scan.flush()
            sent.append(tail)
            text = "".join(sent)
            reason = finish_reason(given, Usage(usage.prompt_tokens, usage.completion_tokens, usage.counted),
                                   self.sampling, scan.stopped)
            last = chunk("")
            if truncated:  # as Triton's frontend: what there is, then finish_reason "length"
                await stream.aclose()  # the model is cancelled now, not when the stream is closed below
                if text:
                    yield _sse(self.envelope(obj, [chunk(text) | {"finish_reason": None}], None))
                last["delta"] = {"content": ""}
                reason = "length"
            elif tools:
                content, calls = parse_tool_calls(text)
                delta: dict[str, Any] = {"content": content}
                if calls:
                    delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
                    reason = "tool_calls"
                last["delta"] = delta
            elif tail:
                yield _sse(self.envelope(obj, [chunk(tail) | {"finish_reason": None}], None))
            if "delta" in last and not tools:
                last["delta"] = {}
            elif "text" in last:
                last["text"] = ""
            yield _sse(self.envelope(obj, [last | {"finish_reason": reason}], None))
            if self.sampling.include_usage:
                counted = await asyncio.to_thread(usage.finish, self.model, self.prompt, text)
                yield _sse(self.envelope(obj, [], counted or {"prompt_tokens": 0, "completion_tokens": 0,
                                                              "total_tokens": 0}))
            yield b"data: [DONE]\n\n"
        except ServingError as exc:  # after the first event the status is sent: the error goes in the stream
            yield _sse({"error": {"message": exc.message, "type": "server_error", "param": None, "code": None}})
        finally:
            await stream.aclose()
