"""What the settings mean in the server's terms, and the checks no single setting's own check can make: the
endpoint restrictions, tracing, the rate limiter's resources, metrics histograms, whether one port serves both
protocols, and settings that must agree."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from bootstrap.settings_schema import SettingsError
from runtime.extensions.tracing import TraceSettings, parse_trace_config
from runtime.extras import missing_extra
from runtime.openai.options import OpenAiOptions
from runtime.openai.restrictions import OpenAiRestrictions
from runtime.restricted_api import RestrictedApis

if TYPE_CHECKING:
    from bootstrap.settings import FunctionSettings

# The port a serverless platform (Knative, Cloud Run, Function Compute) tells its container to listen on.
PLATFORM_PORT_ENV = "PORT"


def check_settings(settings: FunctionSettings) -> None:
    """What no single setting's check can see: settings that must agree, and values with a syntax of their own."""
    check_load_models(settings)
    check_restrictions(settings)
    trace_settings(settings)
    rate_limit_resources(settings)
    histogram_latencies(settings)


def check_restrictions(settings: FunctionSettings) -> None:
    """The endpoint restrictions parse (SettingsError naming the setting otherwise)."""
    restrictions(settings)
    openai_options(settings)


def restrictions(settings: FunctionSettings) -> tuple[RestrictedApis, RestrictedApis]:
    """The HTTP and gRPC endpoint restrictions the settings name."""
    try:
        return (RestrictedApis.parse(settings.http_restricted_api, "server.http_restricted_api"),
                RestrictedApis.parse(settings.grpc_restricted_protocol, "server.grpc_restricted_protocol"))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def restriction_secrets(settings: FunctionSettings) -> list[str]:
    """The header values every restriction expects: redacted from the log as the token is."""
    http, grpc = restrictions(settings)
    found = [r.value for r in (*http.by_group.values(), *grpc.by_group.values())]
    return found + [r.value for r in openai_options(settings).restrictions.by_api.values()]


def openai_options(settings: FunctionSettings) -> OpenAiOptions:
    """The OpenAI-compatible endpoints' options (SettingsError naming a restriction that does not parse)."""
    try:
        parsed = OpenAiRestrictions.parse(settings.openai_restricted_api)
    except ValueError as exc:
        raise SettingsError(f"openai.restricted_api: {exc}") from None
    return OpenAiOptions(settings.openai_default_max_tokens, settings.openai_max_tool_call_parse_bytes, parsed)


def trace_settings(settings: FunctionSettings) -> TraceSettings:
    """The trace settings at start (SettingsError naming what is wrong)."""
    try:
        parsed = parse_trace_config(settings.trace_config)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    missing = missing_extra("otel", "tracing mode 'opentelemetry'") if parsed.mode == "opentelemetry" else None
    if missing is not None:
        raise SettingsError(missing)
    return parsed


def rate_limit_resources(settings: FunctionSettings) -> dict[str, int] | None:
    """The rate limiter's resource counts (None: rate limiting off); SettingsError for a malformed one."""
    counts: dict[str, int] = {}
    for spec in settings.rate_limit_resources:
        name, _, rest = spec.partition(":")
        count, _, device = rest.partition(":")
        if not name or not count.isdigit() or (device and not device.isdigit()):
            raise SettingsError(f"rate limit resource '{spec}': expected <name>:<count>[:<device>]")
        counts[name] = int(count)  # one device here: a device-specific count is the resource's count
    return counts if settings.rate_limit == "execution_count" else None


def serves_single_port(settings: FunctionSettings) -> bool:
    """Whether REST and gRPC share the HTTP port: as set, else when the platform's ``$PORT`` is the HTTP port."""
    if settings.single_port is not None:
        return settings.single_port
    platform = os.environ.get(PLATFORM_PORT_ENV, "").strip()
    return platform.isdigit() and settings.http_port == int(platform)


def histogram_latencies(settings: FunctionSettings) -> bool:
    """``--metrics-config histogram_latencies=<bool>`` (the last one given wins, as in Triton)."""
    enabled = False
    for spec in settings.metrics_config:
        key, _, value = spec.partition("=")
        if key != "histogram_latencies" or value not in ("true", "false"):
            raise SettingsError(f"metrics config '{spec}': only histogram_latencies=true|false is supported")
        enabled = value == "true"
    return enabled


def check_load_models(settings: FunctionSettings) -> None:
    """Models to load at start are for explicit model control only (as Triton's --load-model)."""
    if settings.load_models and settings.model_control != "explicit":
        raise SettingsError("model_control.load_models (--load-model) needs model control mode 'explicit'")
