"""One error hierarchy for the whole runtime.

Every error carries a protocol-neutral :class:`Status`; each protocol adapter
maps it to its own code (HTTP status, gRPC status code).  Messages are meant
for clients: they never contain tracebacks or internal paths.
"""

from __future__ import annotations

import enum


class Status(enum.Enum):
    """Protocol-neutral status, named after Triton's TRITONSERVER_Error codes."""

    INVALID_ARG = "INVALID_ARG"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    INTERNAL = "INTERNAL"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    MEMORY_BUDGET_EXHAUSTED = "MEMORY_BUDGET_EXHAUSTED"  # ours: no room to load a model (gRPC: RESOURCE_EXHAUSTED)
    ALREADY_EXISTS = "ALREADY_EXISTS"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CANCELLED = "CANCELLED"


class ServingError(Exception):
    """Base class of every error a client may see."""

    status: Status = Status.INTERNAL
    executed: bool = False  # raised by a model's execution (not by validation or lookup)

    def __init__(self, message: str, status: Status | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple:
        """Pickled with its status and whether a model raised it (front-end processes receive the core's errors
        this way)."""
        return _rebuild, (self.__class__, self.message, self.status, self.executed)


class InvalidArgument(ServingError):
    status = Status.INVALID_ARG


class NotFound(ServingError):
    status = Status.NOT_FOUND


class Unavailable(ServingError):
    status = Status.UNAVAILABLE


class Unsupported(ServingError):
    status = Status.UNSUPPORTED


class InternalError(ServingError):
    status = Status.INTERNAL


class Unauthenticated(ServingError):
    status = Status.UNAUTHENTICATED


class ResourceExhausted(ServingError):
    status = Status.RESOURCE_EXHAUSTED


class MemoryBudgetExhausted(ServingError):
    """A model cannot be loaded within a memory budget: the server is full for now (not a request too large)."""

    status = Status.MEMORY_BUDGET_EXHAUSTED


class AlreadyExists(ServingError):
    status = Status.ALREADY_EXISTS


class DeadlineExceeded(ServingError):
    status = Status.DEADLINE_EXCEEDED


class Cancelled(ServingError):
    status = Status.CANCELLED


class ModelLoadError(Exception):
    """A model could not be loaded; the message becomes its UNAVAILABLE reason."""


def _rebuild(cls: type[ServingError], message: str, status: Status, executed: bool) -> ServingError:
    error = cls(message, status)
    if executed:
        error.executed = True
    return error
