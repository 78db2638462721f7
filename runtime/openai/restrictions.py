"""Triton's OpenAI frontend's ``--openai-restricted-api <API>[,<API>...] <key> <value>``: its API groups answered
only to requests carrying a header (401 in OpenAI's error object otherwise), as
``openai_frontend/frontend/fastapi/middleware/api_restriction.py`` has them: ``inference`` (completions, chat,
embeddings), ``model-repository`` (``/v1/models``, loading and unloading), ``metrics`` (``GET /metrics``, on the
metrics port here) and ``health`` (``GET /health/ready``).  Beside Triton's own ``--http-restricted-api``, which
groups the V2 paths."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.restricted_api import Restriction

# Triton's ENDPOINT_MAPPING: (method, path prefix) per API
OPENAI_API_ENDPOINTS: dict[str, tuple[tuple[str, str], ...]] = {
    "inference": (("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/embeddings")),
    "model-repository": (("GET", "/v1/models"), ("POST", "/v1/models/")),
    "metrics": (("GET", "/metrics"),),
    "health": (("GET", "/health/ready"),),
}


@dataclass(frozen=True)
class OpenAiRestrictions:
    """Each restricted API's header (APIs not named are open)."""

    by_api: dict[str, Restriction] = field(default_factory=dict)

    @classmethod
    def parse(cls, specs: Iterable[str]) -> OpenAiRestrictions:
        """``specs`` as ``<API>[,<API>...] <key> <value>``; ValueError in Triton's words for an unknown or
        repeated API."""
        by_api: dict[str, Restriction] = {}
        for spec in specs:
            words = spec.split()
            if len(words) != 3:
                raise ValueError(f"--openai-restricted-api '{spec}': expected '<API>[,<API>...] <restricted-key> "
                                 "<restricted-value>'")
            apis, key, value = words
            for api in apis.split(","):
                if api not in OPENAI_API_ENDPOINTS:
                    raise ValueError(f"Unknown API '{api}'. Available APIs: {list(OPENAI_API_ENDPOINTS)}")
                if api in by_api:
                    raise ValueError(f"restricted api '{api}' can not be specified in multiple config groups")
                by_api[api] = Restriction(key, value)
        return cls(by_api)

    def __bool__(self) -> bool:
        return bool(self.by_api)

    def summary(self) -> dict[str, str]:
        """API -> header name, for the log: never the values."""
        return {api: restriction.key for api, restriction in self.by_api.items()}

    def restriction(self, method: str, path: str) -> Restriction | None:
        for api, restriction in self.by_api.items():
            for restricted_method, prefix in OPENAI_API_ENDPOINTS[api]:
                if method == restricted_method and path.startswith(prefix):
                    return restriction
        return None


class OpenAiRestrictionMiddleware:
    """Answers 401 to a restricted API's request without its header and value, before anything reads it."""

    def __init__(self, app: ASGIApp, restrictions: OpenAiRestrictions) -> None:
        self.app = app
        self.restrictions = restrictions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        restriction = (self.restrictions.restriction(scope["method"], scope["path"]) if scope["type"] == "http"
                       else None)
        if restriction is not None:
            wanted = restriction.key.lower().encode("latin-1")
            given = next((value for key, value in scope["headers"] if key == wanted), None)
            if given != restriction.value.encode("latin-1"):
                import msgspec  # here: the settings import this module before the cold start's early fork

                body = msgspec.json.encode({"error": {
                    "message": f"This API is restricted, expecting header '{restriction.key}' with valid value",
                    "type": "authentication_error", "code": "invalid_auth"}})
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def restriction_guard(restrictions: OpenAiRestrictions) -> Callable[[ASGIApp], ASGIApp] | None:
    """The middleware an app wraps its routes in where ``restrictions`` names any API (None: none to wrap)."""
    if not restrictions:
        return None
    return lambda app: OpenAiRestrictionMiddleware(app, restrictions)
