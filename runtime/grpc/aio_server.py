"""GRPCInferenceService on grpc.aio (``limits.infer_threads`` 0, where neither the native edge nor grpcio's
thread-pool server serves it): its method handlers and the interceptor that refuses calls before they run. Only this
path and the thread-pool server import grpcio (runtime/grpc/status_codes.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from runtime.auth import TokenAuth
from runtime.grpc.call_refusal import call_refusal
from runtime.grpc.service import InferenceServicer, tolerant_deserializer
from runtime.grpc.status_codes import StatusCode
from runtime.grpc.threaded import serialize_response
from runtime.protocol import service_pb2
from runtime.restricted_api import RestrictedApis


def create_aio_server(servicer: InferenceServicer, options: list[tuple[str, Any]], auth: TokenAuth | None,
                      restrictions: RestrictedApis | None) -> grpc.aio.Server:
    """A grpc.aio server of ``servicer``'s methods (no port yet), refusing calls as :func:`call_refusal` says."""
    interceptors = [CallRefusalInterceptor(auth, restrictions)] if auth or restrictions else []
    server = grpc.aio.server(interceptors=interceptors, options=options)
    server.add_generic_rpc_handlers((method_handlers(servicer),))
    return server


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


def _deny(message: str, streaming: bool, code: StatusCode) -> grpc.RpcMethodHandler:
    async def unary(request, context: grpc.aio.ServicerContext):
        await context.abort(code, message)

    async def stream(request_iterator, context: grpc.aio.ServicerContext):
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    if streaming:
        return grpc.stream_stream_rpc_method_handler(stream)
    return grpc.unary_unary_rpc_method_handler(unary)


def method_handlers(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
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
