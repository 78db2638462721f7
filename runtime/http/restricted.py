"""Triton's ``--http-restricted-api``: which API group a REST path belongs to, and the middleware refusing a
restricted group's calls that lack its header (``runtime.restricted_api``)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.http.status import error_body
from runtime.restricted_api import RestrictedApis

_GROUP_BY_FIRST_SEGMENT = {"health": "health", "repository": "model-repository", "systemsharedmemory": "shared-memory",
                           "cudasharedmemory": "shared-memory", "logging": "logging", "trace": "trace"}
# /v2/models/{model}[/versions/{version}]/<segment>
_GROUP_BY_MODEL_SEGMENT = {"ready": "health", "infer": "inference", "generate": "inference",
                           "generate_stream": "inference", "config": "model-config", "stats": "statistics",
                           "trace": "trace"}


def http_api_group(path: str) -> str | None:
    """The API group of a REST path, as Triton 2.51 groups them (None: no group's path)."""
    segments = path.split("/")[1:]
    if not segments or segments[0] != "v2":
        return None
    rest = segments[1:]
    if not rest:
        return "metadata"  # /v2
    if rest[0] != "models":
        return _GROUP_BY_FIRST_SEGMENT.get(rest[0])
    if rest[1:] == ["stats"]:
        return "statistics"
    tail = rest[2:]  # past the model's name
    if len(tail) >= 2 and tail[0] == "versions":
        tail = tail[2:]
    if len(rest) < 2:
        return None
    return "metadata" if not tail else _GROUP_BY_MODEL_SEGMENT.get(tail[0])


class RestrictedApiMiddleware:
    """Answers 403 to a call of a restricted group without its header, before anything else reads it."""

    def __init__(self, app: ASGIApp, restrictions: RestrictedApis) -> None:
        self.app = app
        self.restrictions = restrictions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        restriction = self.restrictions.restriction(http_api_group(scope["path"])) if scope["type"] == "http" \
            else None
        if restriction is not None:
            wanted = restriction.key.lower().encode("latin-1")
            values = [v for k, v in scope["headers"] if k == wanted]
            if values != [restriction.value.encode("latin-1")]:
                body = error_body(f"This API is restricted, expecting header '{restriction.key}'")
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
