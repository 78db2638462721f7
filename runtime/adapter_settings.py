"""What the protocol adapters serve and under which limits, apart from the adapters themselves: the composition
root builds it from the settings without importing the HTTP and gRPC stacks, which then load while the first
models load (``server.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.auth import TokenAuth
from runtime.grpc.limits import DEFAULT_MAX_MESSAGE_BYTES, GrpcLimits
from runtime.http.limits import DEFAULT_JSON_BUDGET_BYTES, DEFAULT_MAX_BODY_BYTES, HttpLimits
from runtime.openai.options import OpenAiOptions
from runtime.restricted_api import RestrictedApis


@dataclass
class AdapterSettings:
    """What the HTTP and gRPC adapters serve, and under which limits (picklable: front ends receive it)."""

    host: str = "0.0.0.0"
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    max_request_bytes: int = DEFAULT_MAX_BODY_BYTES
    grpc_max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    json_decode_budget: int = DEFAULT_JSON_BUDGET_BYTES
    http_limits: HttpLimits = field(default_factory=HttpLimits)
    grpc_limits: GrpcLimits = field(default_factory=GrpcLimits)
    auth_token: str | None = None
    auth_exempt_health: bool = True
    http_restrictions: RestrictedApis = field(default_factory=RestrictedApis)  # --http-restricted-api
    grpc_restrictions: RestrictedApis = field(default_factory=RestrictedApis)  # --grpc-restricted-protocol
    single_port: bool = False  # REST and gRPC both on http_port (runtime/listen/single_port.py)
    openai: OpenAiOptions = field(default_factory=OpenAiOptions)  # the OpenAI-compatible endpoints' options
    http_header_forward: str = ""  # headers infer requests carry as parameters (--http-header-forward-pattern)
    grpc_header_forward: str = ""  # call metadata the same (--grpc-header-forward-pattern)

    def auth(self) -> TokenAuth | None:
        return TokenAuth(self.auth_token) if self.auth_token else None
