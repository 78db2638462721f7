"""The request parameters a model's queue reads, as Triton reads them: ``priority`` (its priority level) and
``timeout`` (how long it may wait in the queue, as the queue policy allows)."""

from __future__ import annotations

from runtime.config.spec import QueuePolicy
from runtime.errors import InvalidArgument
from runtime.types import InferRequest


def queue_timeout(request: InferRequest, policy: QueuePolicy) -> float:
    """Seconds a request may wait in the queue (0: no limit), as Triton's queue policy decides: the policy's
    default, or the request's own ``timeout`` (µs) where the policy allows overriding with a shorter one."""
    requested = requested_timeout(request)
    if policy.timeout_action == "DELAY":
        return 0.0
    default = policy.default_timeout_microseconds / 1e6
    if requested and policy.allow_timeout_override and (not default or requested < default):
        return requested
    return default


def requested_priority(request: InferRequest) -> int:
    """The request's ``priority`` parameter (0, the default level, when absent)."""
    value = request.parameters.get("priority", 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument("Unable to parse 'priority': attempt to access JSON non-unsigned-integer as "
                              "unsigned-integer")
    return value


def requested_timeout(request: InferRequest) -> float:
    """The request's ``timeout`` parameter, in seconds (0 when absent)."""
    value = request.parameters.get("timeout")
    if value is None:
        return 0.0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument("Unable to parse 'timeout': attempt to access JSON non-unsigned-integer as "
                              "unsigned-integer")
    return value / 1e6
