"""The HTTP answer to a serving error: its status and its ``{"error": ...}`` body, on every route."""

from __future__ import annotations

import json

from runtime.errors import ServingError, Status
from runtime.http.body import BodyTimeout

HTTP_STATUS = {
    Status.INVALID_ARG: 400,
    Status.NOT_FOUND: 404,
    Status.UNAVAILABLE: 503,
    Status.UNSUPPORTED: 501,
    Status.INTERNAL: 500,
    Status.UNAUTHENTICATED: 401,
    Status.RESOURCE_EXHAUSTED: 413,
    Status.MEMORY_BUDGET_EXHAUSTED: 503,
    Status.ALREADY_EXISTS: 400,  # as Triton 2.51's HTTP endpoint answers it
    Status.DEADLINE_EXCEEDED: 504,
    Status.CANCELLED: 499,
}


def error_status(error: ServingError) -> int:
    """The HTTP status of a serving error (408 for a body that did not arrive in time)."""
    return 408 if isinstance(error, BodyTimeout) else HTTP_STATUS.get(error.status, 500)


def error_body(message: str) -> bytes:
    """``{"error": message}`` as Starlette's JSONResponse writes it, so every route's errors read alike."""
    return json.dumps({"error": message}, ensure_ascii=False, separators=(",", ":")).encode()
