"""The gRPC listener's limits, importable without grpc itself (a server run without gRPC never loads it)."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.grpc.byte_gate import DEFAULT_STREAM_MAX_BYTES, DEFAULT_STREAMS_MAX_BYTES

DEFAULT_MAX_MESSAGE_BYTES = 128 * 1024 * 1024
# Status details travel percent-encoded in a trailer; clients refuse trailers past 8 KiB in all.
MAX_DETAILS_BYTES = 1024


@dataclass(frozen=True)
class GrpcLimits:
    """Connection and stream limits of the gRPC listener (function.yaml ``server.grpc``)."""

    handshake_timeout: float = 30.0  # seconds for a new connection to complete its HTTP/2 preface
    ping_interval: float = 30.0  # seconds between keep-alive pings; a peer that does not answer is dropped
    stream_max_in_flight: int = 64  # ModelStreamInfer: requests running or answered-but-unsent per stream
    stream_max_bytes: int = DEFAULT_STREAM_MAX_BYTES  # ModelStreamInfer: bytes of requests and unsent answers held
    streams_max_bytes: int = DEFAULT_STREAMS_MAX_BYTES  # ... per stream, and by every stream of the process together
    native_edge: bool = True  # grpc++'s callback server (runtime/grpc/native.py) where it is built; else grpcio
    native_lanes: bool = True  # plain requests of both protocols past the loop (runtime/native/lanes.py)
    infer_threads: int = 256  # ModelInfer calls answered at once by the thread-pool server (0: grpc.aio instead)
    max_streams: int = 1024  # ModelStreamInfer streams open at once (not on grpc.aio); more: RESOURCE_EXHAUSTED
    max_response_pool: int | None = None  # a stream request's responses queued unsent (Triton's response pool)
