"""The gRPC server (the native edge, grpcio's thread-pool server over the loop, or grpc.aio): message-size limits,
token auth and restricted API groups. grpcio is imported only where one of its servers serves."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from runtime.api import InferenceApi
from runtime.auth import TokenAuth
from runtime.grpc.call_refusal import GROUP_BY_METHOD, call_refusal
from runtime.grpc.limits import DEFAULT_MAX_MESSAGE_BYTES, GrpcLimits
from runtime.grpc.native import INFLATING_MAX_BYTES, NATIVE_EDGE_BUILT, NativeGrpcServer
from runtime.grpc.service import InferenceServicer
from runtime.header_forward import HeaderForward
from runtime.native.lanes import NativeLanes
from runtime.restricted_api import RestrictedApis

if TYPE_CHECKING:
    import grpc

    from runtime.grpc.threaded import ThreadedGrpcServer

logger = logging.getLogger(__name__)


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
        from runtime.grpc.threaded import ThreadedGrpcServer

        server = ThreadedGrpcServer(servicer, options, limits.infer_threads, limits.max_streams, check_call)
    else:
        from runtime.grpc.aio_server import create_aio_server

        server = create_aio_server(servicer, options, auth, restrictions)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot bind the gRPC server to {address}")
    return server


def create_servicer(service: InferenceApi, limits: GrpcLimits,
                    header_forward: HeaderForward | None = None) -> InferenceServicer:
    """The servicer over ``service``, its streams bounded as ``limits`` say (grpcio's server and the ASGI one)."""
    return InferenceServicer(service, limits.stream_max_in_flight, limits.stream_max_bytes, limits.streams_max_bytes,
                             header_forward, limits.max_response_pool)
