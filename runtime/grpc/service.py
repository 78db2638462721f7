"""The GRPCInferenceService servicer: a thin adapter over :class:`InferenceApi`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from runtime.api import InferenceApi
from runtime.errors import InvalidArgument, ServingError, Status, Unavailable, Unsupported
from runtime.grpc.byte_gate import DEFAULT_STREAM_MAX_BYTES, DEFAULT_STREAMS_MAX_BYTES, ByteGate, StreamBytes
from runtime.grpc.codec import decode_infer_request, encode_infer_response, from_dict, parameters_to_dict
from runtime.grpc.limits import MAX_DETAILS_BYTES
from runtime.grpc.status_codes import StatusCode
from runtime.grpc.stream_order import ResponseOrder
from runtime.header_forward import HeaderForward
from runtime.protocol import service_pb2
from runtime.types import InferRequest, StreamResponse

if TYPE_CHECKING:
    import grpc

logger = logging.getLogger(__name__)

GRPC_STATUS = {
    Status.INVALID_ARG: StatusCode.INVALID_ARGUMENT,
    Status.NOT_FOUND: StatusCode.NOT_FOUND,
    Status.UNAVAILABLE: StatusCode.UNAVAILABLE,
    Status.UNSUPPORTED: StatusCode.UNIMPLEMENTED,
    Status.INTERNAL: StatusCode.INTERNAL,
    Status.UNAUTHENTICATED: StatusCode.UNAUTHENTICATED,
    Status.RESOURCE_EXHAUSTED: StatusCode.RESOURCE_EXHAUSTED,
    Status.MEMORY_BUDGET_EXHAUSTED: StatusCode.RESOURCE_EXHAUSTED,
    Status.ALREADY_EXISTS: StatusCode.ALREADY_EXISTS,
    Status.DEADLINE_EXCEEDED: StatusCode.DEADLINE_EXCEEDED,
    Status.CANCELLED: StatusCode.CANCELLED,
}


def status_code(status: Status) -> StatusCode:
    """The gRPC code the adapter answers the core's ``status`` with (INTERNAL for one it does not map)."""
    return GRPC_STATUS.get(status, StatusCode.INTERNAL)


FINAL_RESPONSE = "triton_final_response"  # marks each stream response that ends its request
# A request parameter: send the bare final flag of a decoupled model as an empty response of its own.
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
# Triton 2.58's words (server #7969) for a request that reaches the gRPC endpoint once its drain began
SHUTTING_DOWN = "GRPC server is shutting down and has stopped accepting new requests."


class Undecodable:
    """What the deserializer hands over for bytes that are not a valid message of the method's type."""

    def __init__(self, type_name: str, size: int) -> None:
        self.error = InvalidArgument(f"the request ({size} bytes) is not a valid {type_name} message")


def tolerant_deserializer(message_type):
    """``message_type.FromString`` that returns :class:`Undecodable` instead of raising (grpc would answer
    UNKNOWN and log a traceback per message)."""

    def deserialize(raw: bytes):
        try:
            return message_type.FromString(raw)
        except Exception:  # noqa: BLE001 - DecodeError and its kin: any undecodable input
            return Undecodable(message_type.DESCRIPTOR.full_name, len(raw))

    return deserialize


def details(message: str) -> str:
    """A status message cut to MAX_DETAILS_BYTES of UTF-8 (an echoed name may be of any length)."""
    encoded = message.encode("utf-8")
    if len(encoded) <= MAX_DETAILS_BYTES:
        return message
    return encoded[: MAX_DETAILS_BYTES - 16].decode("utf-8", errors="ignore") + "... (truncated)"


def _unary(method):
    """Turn ServingError (and unexpected errors) into gRPC status codes."""

    async def wrapper(self, request, context: grpc.aio.ServicerContext):
        try:
            if isinstance(request, Undecodable):
                raise request.error
            return await method(self, request, context)
        except ServingError as exc:
            await context.abort(status_code(exc.status), details(exc.message))
        except Exception:  # noqa: BLE001 - never leak a traceback to the client
            logger.exception("unexpected error in %s", method.__name__)
            await context.abort(StatusCode.INTERNAL, "internal server error")

    wrapper.__name__ = method.__name__
    return wrapper


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"parameter '{EMPTY_FINAL_RESPONSE}' must be a bool")
    return value


def _stream_message(item: StreamResponse, request: InferRequest,
                    empty_final: bool) -> service_pb2.ModelStreamInferResponse | None:
    """One response of a stream as its message (None: a bare final flag the client did not ask to see)."""
    if item.error is not None:
        error = item.error
        text = error.message if isinstance(error, ServingError) else "internal server error"
        failed = service_pb2.ModelInferResponse(id=request.id)  # as Triton: the client knows which request failed
        if getattr(error, "executed", False):  # as Triton: a response was being built when the model failed
            failed.model_name = request.model_name
            failed.parameters[FINAL_RESPONSE].bool_param = item.final
        return service_pb2.ModelStreamInferResponse(error_message=details(text), infer_response=failed)
    if item.response is None:
        if not empty_final:
            return None
        # as Triton: the id and model name, no version, no outputs
        response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
    else:
        response = encode_infer_response(item.response).to_message()
    response.parameters[FINAL_RESPONSE].bool_param = item.final
    return service_pb2.ModelStreamInferResponse(infer_response=response)


_LOG_VALUE_TYPES = {"log_info": ("bool_param", "boolean"), "log_warning": ("bool_param", "boolean"),
                    "log_error": ("bool_param", "boolean"), "log_verbose_level": ("uint32_param", "int32"),
                    "log_format": ("string_param", "string"), "log_file": ("string_param", "string")}


def _log_value(key: str, value) -> object:
    """One setting of a LogSettings request, of the type Triton expects for it (unknown keys pass: ignored)."""
    which = value.WhichOneof("parameter_choice")
    expected = _LOG_VALUE_TYPES.get(key)
    if expected is not None and which != expected[0]:
        raise InvalidArgument(f"expect {expected[1]} for '{key}'")
    return getattr(value, which) if which else None


def _traceparent(context: grpc.aio.ServicerContext) -> str | None:
    """The W3C trace context a call carries (continued by tracing in opentelemetry mode)."""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent" and isinstance(value, str):
            return value
    return None


def _require_default_repository(request) -> None:
    if request.repository_name:
        raise Unsupported("'repository_name' specification is not supported")


class InferenceServicer:
    """Implements each RPC by calling the core and converting the result."""

    def __init__(self, service: InferenceApi, stream_max_in_flight: int = 64,
                 stream_max_bytes: int = DEFAULT_STREAM_MAX_BYTES,
                 streams_max_bytes: int = DEFAULT_STREAMS_MAX_BYTES,
                 header_forward: HeaderForward | None = None, max_response_pool: int | None = None) -> None:
        self.service = service
        self.max_response_pool = max_response_pool  # a stream request's responses queued unsent (None: no bound)
        self.header_forward = header_forward  # call metadata infer requests carry as parameters
        self.stream_max_in_flight = stream_max_in_flight
        self.stream_max_bytes = stream_max_bytes
        self.streams_bytes = ByteGate(streams_max_bytes)  # every stream's, in this process

    @_unary
    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=self.service.live())

    @_unary
    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=await self.service.ready_checked())

    @_unary
    async def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(
            ready=await self.service.model_ready_checked(request.name, request.version))

    @_unary
    async def ServerMetadata(self, request, context):
        return from_dict(self.service.server_metadata(), service_pb2.ServerMetadataResponse)

    @_unary
    async def ModelMetadata(self, request, context):
        metadata = self.service.model_metadata(request.name, request.version)
        return from_dict(metadata, service_pb2.ModelMetadataResponse)

    @_unary
    async def ModelConfig(self, request, context):
        spec = self.service.model_config(request.name, request.version)
        return service_pb2.ModelConfigResponse(config=spec.proto)

    @_unary
    async def ModelStatistics(self, request, context):
        stats = self.service.model_statistics(request.name, request.version)
        return from_dict(stats, service_pb2.ModelStatisticsResponse)

    @_unary
    async def RepositoryIndex(self, request, context):
        _require_default_repository(request)
        rows = self.service.repository_index(ready_only=request.ready)
        return from_dict({"models": rows}, service_pb2.RepositoryIndexResponse)

    @_unary
    async def ModelInfer(self, request, context):
        if self.service.shutting_down:
            raise Unavailable(SHUTTING_DOWN)
        if self.service.is_decoupled(request.model_name, request.model_version):
            raise Unsupported("ModelInfer RPC doesn't support models with decoupled transaction policy")
        # the native edge hands over a plain request already decoded (runtime.grpc.codec.plain_infer_request)
        decoded = request if type(request) is InferRequest else decode_infer_request(request)
        decoded.trace_context = _traceparent(context)
        if self.header_forward is not None:
            decoded.parameters.update(self.header_forward.parameters(context.invocation_metadata() or ()))
        return encode_infer_response(await self.service.infer(decoded))

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[service_pb2.ModelInferRequest], context
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        """Each request runs as it arrives; its responses (one, or any number from a decoupled model, each
        marked ``triton_final_response``) or its error stream back: a decoupled model's as they come, the others in
        the order their requests came, as Triton sends them (``stream_order.py``).

        At most ``stream_max_in_flight`` requests of one stream are running or not yet fully sent, and at most
        ``stream_max_bytes`` of its requests and responses are held (``byte_gate.py``; all streams together:
        ``streams_max_bytes``): past either, the stream is not read until the client takes its responses (HTTP/2
        flow control then holds the client back), so a client that never reads cannot grow the server.  A response
        waiting for an earlier request's is counted once its turn comes (so it never holds bytes that earlier answer
        needs); until then it is one of the stream's ``stream_max_in_flight``.
        """
        # (message or None, whether it ends its request, bytes it holds); None: done
        results: asyncio.Queue = asyncio.Queue()
        slots = asyncio.Semaphore(self.stream_max_in_flight)
        held = StreamBytes(self.stream_max_bytes, self.streams_bytes)
        pending: set[asyncio.Task] = set()
        order = ResponseOrder()  # default-mode requests answer in arrival order, as in Triton
        forwarded: dict[str, str] | None = None
        refusal: str | None = None  # a reserved key in the stream's metadata: each request fails with it, as Triton
        if self.header_forward is not None:
            try:
                forwarded = self.header_forward.parameters(context.invocation_metadata() or ())
            except ServingError as exc:
                refusal = exc.message

        async def answer(message: service_pb2.ModelStreamInferResponse | None, final: bool,
                         sent: Callable[[], None] | None = None) -> None:
            """Queue a response (None: a bare final flag nobody asked to see) once its bytes fit; ``sent`` is
            called once it is written."""
            size = message.ByteSize() if message is not None else 0
            await held.acquire(size)
            results.put_nowait((message, final, size, sent))

        async def run(message: service_pb2.ModelInferRequest | Undecodable, size: int, turn: int | None) -> None:
            """Run one request of ``size`` bytes; its bytes are let go once it answers, or ends.  ``turn``: its place
            among the stream's default-mode requests (None: a decoupled model's, answered as responses come)."""
            ended = False
            # --grpc-max-response-pool-size: this request's responses queued and not yet written
            pool = asyncio.Semaphore(self.max_response_pool) if self.max_response_pool else None

            async def reply(response: service_pb2.ModelStreamInferResponse | None, final: bool) -> None:
                nonlocal size, ended
                held.release(size)  # before waiting for its turn: an earlier request's answer may need the bytes
                size = 0
                if turn is not None:
                    await order.wait(turn)
                if pool is not None and response is not None:
                    await pool.acquire()
                    await answer(response, final, pool.release)
                else:
                    await answer(response, final)
                ended = final

            try:
                if isinstance(message, Undecodable):
                    await reply(service_pb2.ModelStreamInferResponse(error_message=message.error.message), True)
                    return
                request = decode_infer_request(message)
                empty_final = _flag(request.parameters.pop(EMPTY_FINAL_RESPONSE, False))
                if self.service.shutting_down:  # the requests already running finish; a new one is refused
                    raise Unavailable(SHUTTING_DOWN)
                if refusal is not None:
                    raise InvalidArgument(refusal)
                if forwarded is not None:  # the stream's metadata, on each of its requests (as Triton)
                    request.parameters.update(forwarded)
                async for item in self.service.infer_stream(request):
                    await reply(_stream_message(item, request, empty_final), item.final)
            except ServingError as exc:  # as Triton: with a response beside the error that holds only its id
                failed_id = "" if isinstance(message, Undecodable) else message.id
                await reply(service_pb2.ModelStreamInferResponse(
                    error_message=details(exc.message), infer_response=service_pb2.ModelInferResponse(id=failed_id)),
                    True)
            except Exception:  # noqa: BLE001
                logger.exception("unexpected error in ModelStreamInfer")
                await reply(service_pb2.ModelStreamInferResponse(error_message="internal server error"), True)
            finally:
                held.release(size)
                if turn is not None:
                    order.end(turn)
                if not ended:  # cancelled: free the slot all the same
                    results.put_nowait((None, True, 0, None))

        async def read_all() -> None:
            iterator = request_iterator.__aiter__()
            while True:
                await slots.acquire()
                try:
                    message = await iterator.__anext__()
                except StopAsyncIteration:
                    break
                size = 0 if isinstance(message, Undecodable) else message.ByteSize()
                await held.acquire(size)
                task = asyncio.create_task(run(message, size, None if self._decoupled(message) else order.take()))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.gather(*list(pending))
            await results.put(None)

        reader = asyncio.create_task(read_all())
        try:
            while (entry := await results.get()) is not None:
                message, ends_request, size, sent = entry
                if message is not None:
                    yield message
                if sent is not None:
                    sent()
                held.release(size)
                if ends_request:
                    slots.release()
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()
            while not results.empty():  # answers never sent: their bytes go back to the process's bound
                entry = results.get_nowait()
                if entry is not None:
                    held.release(entry[2])

    def _decoupled(self, message: service_pb2.ModelInferRequest | Undecodable) -> bool:
        """Whether a stream request's model answers decoupled (unknown models: no, their error takes its turn)."""
        if isinstance(message, Undecodable):
            return False
        try:
            return self.service.is_decoupled(message.model_name, message.model_version)
        except ServingError:
            return False

    @_unary
    async def LogSettings(self, request, context):
        changes = {key: _log_value(key, value) for key, value in request.settings.items()}
        response = service_pb2.LogSettingsResponse()
        for key, value in self.service.log_settings(changes).items():
            setting = response.settings[key]
            if isinstance(value, bool):
                setting.bool_param = value
            elif isinstance(value, int):
                setting.uint32_param = value
            else:
                setting.string_param = value
        return response

    @_unary
    async def SystemSharedMemoryRegister(self, request, context):
        self.service.register_system_shared_memory(request.name, request.key, request.offset, request.byte_size)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    @_unary
    async def SystemSharedMemoryUnregister(self, request, context):
        self.service.unregister_system_shared_memory(request.name)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    @_unary
    async def SystemSharedMemoryStatus(self, request, context):
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for region in self.service.system_shared_memory_status(request.name):
            response.regions[region["name"]].CopyFrom(
                service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @_unary
    async def CudaSharedMemoryRegister(self, request, context):
        self.service.register_cuda_shared_memory(request.name, request.raw_handle, request.device_id,
                                                 request.byte_size)
        return service_pb2.CudaSharedMemoryRegisterResponse()

    @_unary
    async def CudaSharedMemoryUnregister(self, request, context):
        self.service.unregister_cuda_shared_memory(request.name)
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    @_unary
    async def CudaSharedMemoryStatus(self, request, context):
        response = service_pb2.CudaSharedMemoryStatusResponse()
        for region in self.service.cuda_shared_memory_status(request.name):
            response.regions[region["name"]].CopyFrom(
                service_pb2.CudaSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @_unary
    async def TraceSetting(self, request, context):
        changes = None
        if request.settings:  # a value list per key: trace_level's is the list, others' its one value; empty: clear
            changes = {key: (list(value.value) if key == "trace_level" else value.value[0]) if value.value else None
                       for key, value in request.settings.items()}
        response = service_pb2.TraceSettingResponse()
        for key, value in self.service.trace_settings(request.model_name, changes).items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    @_unary
    async def RepositoryModelLoad(self, request, context):
        _require_default_repository(request)
        await self.service.load_model(request.model_name, parameters_to_dict(request.parameters))
        return service_pb2.RepositoryModelLoadResponse()

    @_unary
    async def RepositoryModelUnload(self, request, context):
        _require_default_repository(request)
        await self.service.unload_model(request.model_name, parameters_to_dict(request.parameters))
        return service_pb2.RepositoryModelUnloadResponse()
