"""The gRPC listener's limits, importable without grpc itself (a server run without gRPC never loads it)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_MESSAGE_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class GrpcLimits:
    """Connection and stream limits of the gRPC listener (function.yaml ``server.grpc``)."""

    handshake_timeout: float = 30.0  # seconds for a new connection to complete its HTTP/2 preface
    ping_interval: float = 30.0  # seconds between keep-alive pings; a peer that does not answer is dropped
    stream_max_in_flight: int = 64  # ModelStreamInfer: requests running or answered-but-unsent per stream
