"""``POST /v2/models/{name}[/versions/{n}]/infer``, dispatched in front of the Starlette application.

Inference is the one route every request takes. Starlette's router (a regular expression per route, tried in
order), its middleware layers and per-request wrappers cost about a fifth of a small request's CPU, so this
ASGI app matches the infer path with one expression and calls the endpoint itself, with the application's own
exception handlers. Everything else (other methods on that path included) goes to the application unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

# The same paths as the routes "/v2/models/{model_name}/infer" and ".../versions/{model_version:int}/infer".
INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")

Endpoint = Callable[[Request], Awaitable[Response]]
ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]


class InferRoute:
    """Serves infer requests with ``endpoint``; passes every other request to ``app``."""

    def __init__(self, app: ASGIApp, endpoint: Endpoint,
                 exception_handlers: Mapping[type[Exception], ExceptionHandler]) -> None:
        self.app = app
        self.endpoint = endpoint
        self.exception_handlers = exception_handlers  # tried in order: most specific first, Exception last

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = INFER_PATH.fullmatch(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        name, version = match.groups()
        scope["path_params"] = {"model_name": name} if version is None else {"model_name": name,
                                                                               "model_version": int(version)}
        request = Request(scope, receive, send)
        try:
            response = await self.endpoint(request)
        except Exception as exc:  # noqa: BLE001 - every failure becomes the application's error answer
            response = await self._handler(exc)(request, exc)
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> ExceptionHandler:
        for kind, handler in self.exception_handlers.items():
            if isinstance(exc, kind):
                return handler
        raise exc
