"""An HTTP listener's limits and the HTTP adapter's defaults, apart from the modules that enforce them: settings
import this without the HTTP stack (starlette, granian), so that a start reads its settings and begins loading
models before that stack has loaded."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_JSON_BUDGET_BYTES = 256 * 1024 * 1024  # decoded JSON tensors held at once, across requests
DEFAULT_SEND_TIMEOUT = 30.0
DEFAULT_MAX_UNSENT_BYTES = 1 << 30


@dataclass(frozen=True)
class HttpLimits:
    """Connection limits of an HTTP listener (function.yaml ``server.http``)."""

    header_timeout: float = 30.0  # seconds to receive a request's headers; idle keep-alive timeout too
    body_timeout: float = 120.0  # seconds to receive a whole request body
    max_connections: int = 4096  # connections served at once
    max_concurrent_streams: int = 256  # per HTTP/2 connection
    ping_interval: float = 30.0  # HTTP/2: seconds between keep-alive pings; a peer that does not answer is dropped
    backlog: int = 1024
    send_timeout: float = DEFAULT_SEND_TIMEOUT  # seconds a client may take to accept each chunk of a large answer
    max_unsent_bytes: int = DEFAULT_MAX_UNSENT_BYTES  # answers being sent to clients, per serving process
