"""The OpenAI-compatible routes, mounted at ``/v1`` on the HTTP port behind the same token as the V2 routes.

Errors are OpenAI's error object (``{"error": {"message", "type", "param", "code"}}``) with the status the core's
error carries: an unknown model 404, a bad field 400 naming it, a model that is not a text model 400. Streams are
Server-Sent Events in OpenAI's chunk format ending with ``data: [DONE]``; a client that leaves mid-stream closes
the core's stream, which cancels the request in the model.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from runtime.api import InferenceApi
from runtime.errors import NotFound, ServingError, Status
from runtime.http.body import read_body
from runtime.http.codec import parse_json
from runtime.http.status import error_status
from runtime.openai.chat import parse_tool_calls, render_chat
from runtime.openai.completion_call import Generation
from runtime.openai.generation import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    EMBEDDING_FIELDS,
    FieldError,
    check_fields,
    inference_request,
    read_sampling,
)
from runtime.openai.llm_model import LlmModel, read_llm_model
from runtime.openai.model_management import ModelManagementRoutes
from runtime.openai.options import OpenAiOptions

logger = logging.getLogger(__name__)
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's own bound on one request's inputs
EMBEDDING_WINDOW_MIN = 4
_ERROR_TYPES = {Status.NOT_FOUND: "invalid_request_error", Status.INVALID_ARG: "invalid_request_error",
                Status.UNAUTHENTICATED: "authentication_error", Status.RESOURCE_EXHAUSTED: "invalid_request_error"}


class UnknownModel(NotFound):
    """OpenAI's 404 for a model that is not served."""

    def __init__(self, name: str) -> None:
        super().__init__(f"The model `{name}` does not exist.")


def openai_error(error: ServingError) -> JSONResponse:
    """OpenAI's error object, with the status the error carries."""
    body = {"message": error.message, "type": _ERROR_TYPES.get(error.status, "server_error"),
            "param": error.param if isinstance(error, FieldError) else None,
            "code": "model_not_found" if isinstance(error, UnknownModel) else None}
    return JSONResponse({"error": body}, status_code=error_status(error))


async def _serving_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServingError)
    return openai_error(exc)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    logger.exception("unexpected error serving %s %s", request.method, request.url.path)
    return JSONResponse({"error": {"message": "internal server error", "type": "server_error", "param": None,
                                   "code": None}}, status_code=500)


class OpenAiRoutes:
    """``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/embeddings`` over the core."""

    def __init__(self, service: InferenceApi, max_body_bytes: int, body_timeout: float,
                 options: OpenAiOptions | None = None) -> None:
        self.service = service
        self.options = options or OpenAiOptions()
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self._models: dict[str, tuple[Any, LlmModel]] = {}  # name -> (the config it was read from, the model)

    # -- models ----------------------------------------------------------------------------------------------
    async def _llm(self, name: str) -> LlmModel:
        try:
            await self.service.ensure_model(name)  # model control on_demand loads it here
        except NotFound:
            raise UnknownModel(name) from None
        spec = self.service.model_config(name)
        cached = self._models.get(name)
        if cached is not None and (cached[0] is spec or cached[0] == spec):  # a reload gives another spec
            return cached[1]
        model = read_llm_model(name, spec, self.service.model_directory(name), self.service.is_decoupled(name),
                               self.options.default_max_tokens)
        self._models[name] = (spec, model)
        return model

    def _model_object(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "triton"}

    async def list_models(self, request: Request) -> Response:
        names = sorted({row["name"] for row in self.service.repository_index()})  # as Triton's frontend: all
        return JSONResponse({"object": "list", "data": [self._model_object(name) for name in names]})

    async def get_model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if not self.service.model_ready(name):
            await self._llm(name)  # raises the 404
        return JSONResponse(self._model_object(name))

    def forget_model(self, name: str) -> None:
        """Drop what was read of ``name``'s config (it was unloaded)."""
        self._models.pop(name, None)

    async def _body(self, request: Request, known: set[str]) -> dict[str, Any]:
        return check_fields(parse_json(await read_body(request, self.max_body_bytes, self.body_timeout)), known)

    # -- completions -----------------------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        body = await self._body(request, COMPLETION_FIELDS)
        model = await self._llm(body["model"])
        model.require_text()
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise FieldError("prompt", "'prompt' must be a string (token arrays and several prompts are not served)")
        echo = body.get("echo", False)
        if not isinstance(echo, bool):
            raise FieldError("echo", "'echo' must be true or false")
        sampling = read_sampling(body, model, ("max_tokens",))
        call = Generation(self.service, model, prompt, sampling, "cmpl", self.options.max_tool_call_parse_bytes)
        if sampling.stream:
            return await call.stream_response(lambda text: {"text": text, "index": 0, "logprobs": None},
                                              "text_completion", prefix=prompt if echo else "")
        text, reason, usage = await call.run()
        choice = {"text": (prompt if echo else "") + text, "index": 0, "logprobs": None, "finish_reason": reason}
        return JSONResponse(call.envelope("text_completion", [choice], usage))

    # -- chat ------------------------------------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        body = await self._body(request, CHAT_FIELDS)
        model = await self._llm(body["model"])
        model.require_text()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(_is_message(m) for m in messages):
            raise FieldError("messages", "'messages' must be a non-empty list of {\"role\": ..., \"content\": ...}")
        tools = body.get("tools")
        if tools is not None and (not isinstance(tools, list) or not all(_is_tool(t) for t in tools)):
            raise FieldError("tools", "'tools' must be a list of {\"type\": \"function\", \"function\": {...}}")
        choice = body.get("tool_choice")
        if choice not in (None, "none", "auto", "required") and not _is_named_choice(choice):
            raise FieldError("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or a named function")
        offered = tools if tools and choice != "none" else None
        if _is_named_choice(choice):
            assert choice is not None
            offered = [t for t in tools or [] if t["function"]["name"] == choice["function"]["name"]]
            if not offered:
                raise FieldError("tool_choice", f"tool_choice names '{choice['function']['name']}', not in 'tools'")
        prompt = await asyncio.to_thread(render_chat, model.chat_template, model.name,  # as long as the body: off
                                         [_plain(m) for m in messages], offered, model.bos_token, model.eos_token)
        sampling = read_sampling(body, model, ("max_completion_tokens", "max_tokens"))
        call = Generation(self.service, model, prompt, sampling, "chatcmpl", self.options.max_tool_call_parse_bytes)
        if sampling.stream:
            return await call.stream_response(lambda text: {"index": 0, "delta": {"content": text},
                                                            "logprobs": None},
                                              "chat.completion.chunk", role=True, tools=offered is not None)
        text, reason, usage = await call.run()
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if offered:
            content, calls = parse_tool_calls(text)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                reason = "tool_calls"
        return JSONResponse(call.envelope("chat.completion", [{"index": 0, "message": message, "logprobs": None,
                                                                "finish_reason": reason}], usage))

    # -- embeddings ------------------------------------------------------------------------------------------
    async def embeddings(self, request: Request) -> Response:
        body = await self._body(request, EMBEDDING_FIELDS)
        model = await self._llm(body["model"])
        model.require_embeddings()
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
            raise FieldError("input", "'input' must be a non-empty string or list of non-empty strings "
                                      "(token arrays are not served)")
        if len(texts) > MAX_EMBEDDING_INPUTS:
            raise FieldError("input", f"'input' may hold at most {MAX_EMBEDDING_INPUTS} strings, got {len(texts)}")
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise FieldError("encoding_format", "'encoding_format' must be 'float' or 'base64'")
        dimensions = body.get("dimensions")
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                       or dimensions < 1):
            raise FieldError("dimensions", "'dimensions' must be a positive whole number")
        vectors = await self._embed_all(model, texts)
        data = []
        for index, vector in enumerate(vectors):
            if dimensions is not None:
                if dimensions > vector.size:
                    raise FieldError("dimensions", f"'dimensions' is larger than the model's {vector.size}")
                vector = vector[:dimensions]
            value: Any = (base64.b64encode(vector.astype("<f4").tobytes()).decode() if encoding == "base64"
                          else vector.astype(float).tolist())
            data.append({"object": "embedding", "index": index, "embedding": value})
        counts = await asyncio.to_thread(lambda: [model.count_tokens(text) for text in texts])  # off the loop
        tokens = sum(c for c in counts if c is not None)
        return JSONResponse({"object": "list", "data": data, "model": model.name,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def _embed_all(self, model: LlmModel, texts: list[str]) -> list[np.ndarray]:
        """Each text's vector, a window of requests in flight at a time (two of the model's batches, at least
        four): a long list never becomes as many requests at once; the first failure ends the rest."""
        window = min(len(texts), max(EMBEDDING_WINDOW_MIN, 2 * model.max_batch_size))
        vectors: list[np.ndarray] = [np.empty(0, np.float32)] * len(texts)
        pending = iter(range(len(texts)))

        async def embed_next() -> None:
            for index in pending:
                vectors[index] = await self._embed(model, texts[index])

        tasks = [asyncio.ensure_future(embed_next()) for _ in range(window)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return vectors

    async def _embed(self, model: LlmModel, text: str) -> np.ndarray:
        response = await self.service.infer(inference_request(model, text, None))
        outputs = {tensor.name: tensor.values() for tensor in response.outputs}
        assert model.embedding_output is not None  # require_embeddings() passed
        return np.asarray(outputs[model.embedding_output], dtype=np.float32).reshape(-1)


def _is_message(message: Any) -> bool:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        return False
    content = message.get("content")
    return content is None or isinstance(content, str) or (
        isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content))


def _plain(message: dict) -> dict:
    """A message as templates expect it: text parts joined into one string."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": "".join(str(part.get("text", "")) for part in content)}
    return message


def _is_tool(tool: Any) -> bool:
    return (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("function"), dict)
            and isinstance(tool["function"].get("name"), str))


def _is_named_choice(choice: Any) -> bool:
    return (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
            and isinstance(choice["function"].get("name"), str))


def openai_health_route(service: InferenceApi) -> Route:
    """Triton's OpenAI frontend's ``GET /health/ready``, served at the HTTP port's root beside ``/v1``."""

    async def ready(request: Request) -> Response:
        if await service.ready_checked():
            return Response(status_code=200)
        return JSONResponse({"detail": "Attached inference engine is not ready for inference requests."},
                            status_code=400)

    return Route("/health/ready", ready, methods=["GET"])


def create_openai_app(service: InferenceApi, max_body_bytes: int, body_timeout: float,
                      options: OpenAiOptions | None = None) -> Starlette:
    routes = OpenAiRoutes(service, max_body_bytes, body_timeout, options)
    management = ModelManagementRoutes(service, routes.forget_model)
    return Starlette(routes=[
        Route("/models", routes.list_models, methods=["GET"]),
        Route("/models/{model}/load", management.load_model, methods=["POST"]),
        Route("/models/{model}/unload", management.unload_model, methods=["POST"]),
        Route("/models/{model:path}", routes.get_model, methods=["GET"]),
        Route("/completions", routes.completions, methods=["POST"]),
        Route("/chat/completions", routes.chat, methods=["POST"]),
        Route("/embeddings", routes.embeddings, methods=["POST"]),
    ], exception_handlers={ServingError: _serving_error, Exception: _unexpected_error})


def openai_mounts(service: InferenceApi, max_body_bytes: int, body_timeout: float,
                  options: OpenAiOptions | None = None) -> list[BaseRoute]:
    """The OpenAI-compatible API at ``/v1`` and Triton's frontend's ``GET /health/ready``, for the HTTP port's app
    (``runtime.http.app.create_http_app``'s ``more_routes``)."""
    return [openai_health_route(service), Mount("/v1", app=create_openai_app(service, max_body_bytes, body_timeout,
                                                                             options))]
