"""How a gRPC call ends before it runs: no token, or a restricted API group (``--grpc-restricted-protocol``) without
its metadata. Asked by every gRPC front end (the native edge, the ASGI adapter of the one port, grpcio's servers)."""

from __future__ import annotations

from typing import Any

from runtime.auth import TokenAuth
from runtime.errors import Unauthenticated
from runtime.grpc.call_context import CallEnded
from runtime.grpc.status_codes import StatusCode
from runtime.restricted_api import RestrictedApis


def auth_failure(auth: TokenAuth, metadata: Any) -> str | None:
    """Why a call with this metadata is refused by the token (None: it is not)."""
    values = [v for k, v in (metadata or ()) if k == "authorization"]
    try:
        auth.check(values[0] if len(values) == 1 and isinstance(values[0], str) else None)
    except Unauthenticated as exc:
        return exc.message
    return None


def restriction_failure(restrictions: RestrictedApis, method: str, metadata: Any) -> str | None:
    """Why a call of ``method`` with this metadata is refused by ``--grpc-restricted-protocol`` (None: it is not),
    in Triton's words."""
    restriction = restrictions.restriction(GROUP_BY_METHOD.get(method))
    if restriction is None:
        return None
    key = RESTRICTED_METADATA_PREFIX + restriction.key.lower()
    values = [v for k, v in (metadata or ()) if k == key]
    return None if values == [restriction.value] else f"This protocol is restricted, expecting header '{key}'"


def call_refusal(auth: TokenAuth | None, restrictions: RestrictedApis | None, method: str,
                 metadata: Any) -> CallEnded | None:
    """How a call of ``method`` with this metadata ends before it runs (None: it runs): no token, or a restricted
    API group without its metadata."""
    if auth is not None:
        failure = auth_failure(auth, metadata)
        if failure is not None:
            return CallEnded(StatusCode.UNAUTHENTICATED, failure)
    if restrictions:
        failure = restriction_failure(restrictions, method, metadata)
        if failure is not None:
            return CallEnded(StatusCode.UNAVAILABLE, failure)
    return None


# Each method's API group for --grpc-restricted-protocol, as Triton 2.51 groups them.
GROUP_BY_METHOD = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging",
}
RESTRICTED_METADATA_PREFIX = "triton-grpc-protocol-"
