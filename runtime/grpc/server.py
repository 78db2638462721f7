"""The gRPC server (the native edge, grpcio's thread-pool server over the loop, or grpc.aio): message-size limits,
token auth and restricted API groups."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from runtime.api import InferenceApi
from runtime.auth import TokenAuth
from runtime.errors import Unauthenticated
from runtime.grpc.call_context import CallEnded
from runtime.grpc.limits import DEFAULT_MAX_MESSAGE_BYTES, GrpcLimits
from runtime.grpc.native import INFLATING_MAX_BYTES, NATIVE_EDGE_BUILT, NativeGrpcServer
from runtime.grpc.service import InferenceServicer, tolerant_deserializer
from runtime.grpc.threaded import ThreadedGrpcServer, serialize_response
from runtime.header_forward import HeaderForward
from runtime.native.lanes import NativeLanes
from runtime.protocol import service_pb2
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
            return CallEnded(grpc.StatusCode.UNAUTHENTICATED, failure)
    if restrictions:
        failure = restriction_failure(restrictions, method, metadata)
        if failure is not None:
            return CallEnded(grpc.StatusCode.UNAVAILABLE, failure)
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
logger = logging.getLogger(__name__)


class CallRefusalInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a call before it runs as :func:`call_refusal` says (grpc.aio; the thread-pool server and the ASGI
    adapter ask it themselves)."""

    def __init__(self, auth: TokenAuth | None, restrictions: RestrictedApis | None) -> None:
        self.auth = auth
        self.restrictions = restrictions

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method.rpartition("/")[2]
        refusal = call_refusal(self.auth, self.restrictions, method, handler_call_details.invocation_metadata)
        if refusal is not None:
            return _deny(refusal.message, streaming=method == "ModelStreamInfer", code=refusal.code)
        return await continuation(handler_call_details)


def _deny(message: str, streaming: bool, code: grpc.StatusCode) -> grpc.RpcMethodHandler:
    async def unary(request, context: grpc.aio.ServicerContext):
        await context.abort(code, message)

    async def stream(request_iterator, context: grpc.aio.ServicerContext):
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    if streaming:
        return grpc.stream_stream_rpc_method_handler(stream)
    return grpc.unary_unary_rpc_method_handler(unary)


def create_grpc_server(
    service: InferenceApi,
    address: str,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    auth: TokenAuth | None = None,
    limits: GrpcLimits | None = None,
    reuse_port: bool = False,
    restrictions: RestrictedApis | None = None,
    header_forward: HeaderForward | None = None,
    lanes: NativeLanes | None = None,
) -> grpc.aio.Server | ThreadedGrpcServer | NativeGrpcServer:
    """A bound (not yet started) server serving GRPCInferenceService on ``address``: the native edge
    (``runtime/grpc/native.py``) when ``limits.native_edge`` and it is built, else grpcio's thread-pool server over
    the running loop (``runtime/grpc/threaded.py``), or grpc.aio when ``limits.infer_threads`` is 0;
    ``reuse_port``: one of several processes serving the port (SO_REUSEPORT), as front-end processes do;
    ``restrictions``: API groups refused without their metadata (``--grpc-restricted-protocol``);
    ``header_forward``: the metadata infer requests carry as parameters (no lanes then: they would not see it);
    ``lanes``: where the native edge hands plain ModelInfer calls past the loop, where every such call would run (no
    token, no restriction, no forwarded metadata: the edge's lanes check none)."""
    limits = limits or GrpcLimits()
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", int(reuse_port)),
        ("grpc.server_handshake_timeout_ms", int(limits.handshake_timeout * 1000)),
        ("grpc.keepalive_time_ms", int(limits.ping_interval * 1000)),
        ("grpc.keepalive_timeout_ms", int(limits.ping_interval * 1000)),
    ]
    servicer = create_servicer(service, limits, header_forward)
    server: grpc.aio.Server | ThreadedGrpcServer | NativeGrpcServer
    check_call = lambda method, metadata: call_refusal(auth, restrictions, method, metadata)  # noqa: E731
    if limits.native_edge and not NATIVE_EDGE_BUILT:
        logger.warning("the native gRPC edge is not built (libgrpc++ was not found when the package was installed):"
                       " gRPC is served by grpcio")
    if limits.native_edge and NATIVE_EDGE_BUILT:
        lanes_serve = auth is None and header_forward is None and (
            restrictions is None or restrictions.restriction(GROUP_BY_METHOD["ModelInfer"]) is None)
        server = NativeGrpcServer(servicer, [*options, (INFLATING_MAX_BYTES, limits.streams_max_bytes)],
                                  limits.max_streams, check_call, service.tensor_buffer, lanes if lanes_serve else None)
    elif limits.infer_threads:
        server = ThreadedGrpcServer(servicer, options, limits.infer_threads, limits.max_streams, check_call)
    else:
        interceptors = [CallRefusalInterceptor(auth, restrictions)] if auth or restrictions else []
        server = grpc.aio.server(interceptors=interceptors, options=options)
        server.add_generic_rpc_handlers((_method_handlers(servicer),))
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot bind the gRPC server to {address}")
    return server


def create_servicer(service: InferenceApi, limits: GrpcLimits,
                    header_forward: HeaderForward | None = None) -> InferenceServicer:
    """The servicer over ``service``, its streams bounded as ``limits`` say (grpcio's server and the ASGI one)."""
    return InferenceServicer(service, limits.stream_max_in_flight, limits.stream_max_bytes, limits.streams_max_bytes,
                             header_forward, limits.max_response_pool)


def _method_handlers(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """GRPCInferenceService's methods, as the generated registration builds them, except that undecodable
    requests reach the servicer (as INVALID_ARGUMENT) instead of failing inside grpc."""
    descriptor = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers = {}
    for method in descriptor.methods:
        request_type = getattr(service_pb2, method.input_type.name)
        make = grpc.stream_stream_rpc_method_handler if method.client_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(getattr(servicer, method.name), request_deserializer=tolerant_deserializer(
            request_type), response_serializer=serialize_response)
    return grpc.method_handlers_generic_handler(descriptor.full_name, handlers)
