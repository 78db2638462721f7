"""gRPC's status codes as grpcio names them: ``grpc.StatusCode``'s members, with the same (code, text) values,
without importing grpcio. Its import is 13 ms of a start, and the native edge, which serves gRPC by default (the
ASGI adapter of the one port too), needs only the numbers. grpc.aio takes these as its own (it reads
``value[0]``); grpcio's synchronous server wants its own members (:func:`grpcio_code`)."""

from __future__ import annotations

import enum
from typing import Any


class StatusCode(enum.Enum):
    """``grpc.StatusCode``, member for member (``tests/test_grpc_status_codes.py`` holds them equal)."""

    OK = (0, "ok")
    CANCELLED = (1, "cancelled")
    UNKNOWN = (2, "unknown")
    INVALID_ARGUMENT = (3, "invalid argument")
    DEADLINE_EXCEEDED = (4, "deadline exceeded")
    NOT_FOUND = (5, "not found")
    ALREADY_EXISTS = (6, "already exists")
    PERMISSION_DENIED = (7, "permission denied")
    RESOURCE_EXHAUSTED = (8, "resource exhausted")
    FAILED_PRECONDITION = (9, "failed precondition")
    ABORTED = (10, "aborted")
    OUT_OF_RANGE = (11, "out of range")
    UNIMPLEMENTED = (12, "unimplemented")
    INTERNAL = (13, "internal")
    UNAVAILABLE = (14, "unavailable")
    DATA_LOSS = (15, "data loss")
    UNAUTHENTICATED = (16, "unauthenticated")


def grpcio_code(code: StatusCode | Any) -> Any:
    """grpcio's own member for ``code`` (one of ours, or grpcio's already), for its synchronous server's abort."""
    import grpc

    return grpc.StatusCode[code.name]
