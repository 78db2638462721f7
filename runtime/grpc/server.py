"""The asyncio gRPC server: message-size limits and token auth."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from tritonclient.grpc import service_pb2_grpc

from runtime.auth import TokenAuth
from runtime.core import InferenceService
from runtime.errors import Unauthenticated
from runtime.grpc.service import InferenceServicer

DEFAULT_MAX_MESSAGE_BYTES = 128 * 1024 * 1024


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses any call without the token in its ``authorization`` metadata, before it runs."""

    def __init__(self, auth: TokenAuth) -> None:
        self.auth = auth

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        values = [v for k, v in (handler_call_details.invocation_metadata or ()) if k == "authorization"]
        try:
            self.auth.check(values[0] if len(values) == 1 and isinstance(values[0], str) else None)
        except Unauthenticated as exc:
            return _deny(exc.message, streaming=handler_call_details.method.endswith("/ModelStreamInfer"))
        return await continuation(handler_call_details)


def _deny(message: str, streaming: bool) -> grpc.RpcMethodHandler:
    async def unary(request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def stream(request_iterator, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator

    if streaming:
        return grpc.stream_stream_rpc_method_handler(stream)
    return grpc.unary_unary_rpc_method_handler(unary)


def create_grpc_server(
    service: InferenceService,
    address: str,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    auth: TokenAuth | None = None,
) -> grpc.aio.Server:
    """A bound (not yet started) grpc.aio server serving GRPCInferenceService on ``address``."""
    server = grpc.aio.server(
        interceptors=[TokenAuthInterceptor(auth)] if auth else [],
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
        ],
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(service), server)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot bind the gRPC server to {address}")
    return server
