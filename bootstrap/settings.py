"""``function.yaml``: the function's settings, validated at start with clear errors."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bootstrap.cache import default_cache_dir
from bootstrap.errors import BootstrapError
from bootstrap.storage import StorageError, StorageSettings, is_remote, parse_location
from runtime.extensions.tracing import TraceSettings, parse_trace_config
from runtime.restricted_api import RestrictedApis

AUTH_TOKEN_ENV = "FUNCTION_AUTH_TOKEN"
# The port a serverless platform (Knative, Cloud Run, Function Compute) tells its container to listen on.
PLATFORM_PORT_ENV = "PORT"


class SettingsError(BootstrapError, ValueError):
    """function.yaml is missing, malformed or holds an invalid value."""


@dataclass
class FunctionSettings:
    name: str = "triton-function"
    model_repository: str = "examples/model_repository"
    host: str = "0.0.0.0"
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    metrics_port: int | None = 8002
    default_max_queue_size: int = 1024
    sequence_slot_timeout_seconds: float = 30.0
    execute_timeout_seconds: float = 60.0
    send_timeout_seconds: float = 30.0
    max_unsent_response_bytes: int = 1 << 30
    stream_max_bytes: int = 16 << 20
    streams_max_bytes: int = 1 << 30
    device: str = "auto"  # auto | gpu | cpu
    max_request_bytes: int = 64 * 1024 * 1024
    grpc_max_message_bytes: int = 128 * 1024 * 1024
    header_timeout_seconds: float = 30.0
    body_timeout_seconds: float = 120.0
    max_connections: int = 4096
    max_streams_per_connection: int = 256  # HTTP/2
    stream_max_in_flight: int = 64
    frontend_processes: int = 0  # processes serving HTTP and gRPC besides the one owning the models (0: it serves)
    trace_config: tuple[str, ...] = ()  # Triton's --trace-config values
    rate_limit: str = "off"  # off | execution_count (Triton's --rate-limit)
    rate_limit_resources: tuple[str, ...] = ()  # Triton's --rate-limit-resource '<name>:<count>[:<device>]' values
    model_load_thread_count: int = 4  # models loading at once (Triton's --model-load-thread-count)
    http_restricted_api: tuple[str, ...] = ()  # Triton's '<API>[,<API>...]:<key>=<value>', each
    grpc_restricted_protocol: tuple[str, ...] = ()
    json_decode_budget_bytes: int = 256 * 1024 * 1024
    server_name: str = "triton"
    strict_readiness: bool = True
    auto_complete_config: bool = True  # Triton's default; --disable-auto-complete-config turns it off
    auth_token: str | None = field(default=None, repr=False)
    auth_exempt_health: bool = True
    storage: StorageSettings = field(default_factory=StorageSettings)
    cold_start_deadline_seconds: float = 600.0
    cache_dir: str = field(default_factory=default_cache_dir)
    response_cache_bytes: int = 0  # the response cache's budget (cache.size_bytes; 0: off)
    model_control: str = "none"  # none | poll | explicit
    poll_interval_seconds: float = 5.0
    load_models: tuple[str, ...] = ()
    idle_timeout_seconds: float = 0.0
    shutdown_timeout_seconds: float = 30.0
    base_dir: Path = Path(".")

    @property
    def use_gpu(self) -> bool:
        return self.device != "cpu"

    @property
    def remote(self) -> bool:
        return is_remote(self.model_repository)

    def repository_path(self) -> Path:
        """The local repository folder (for object storage: where the sync writes)."""
        if self.remote:
            return self.cache_path() / "repository"
        path = Path(self.model_repository).expanduser()
        return path if path.is_absolute() else (self.base_dir / path)

    def cache_path(self) -> Path:
        path = Path(self.cache_dir).expanduser()
        return path if path.is_absolute() else (self.base_dir / path)


_TOP_LEVEL = {
    "name", "model_repository", "server", "instance", "auth", "storage", "cache_dir", "cache", "model_control",
    "idle_timeout_seconds", "shutdown_timeout_seconds",
}


def _section(data: dict, key: str, known: set[str]) -> dict:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise SettingsError(f"'{key}' must be a mapping")
    unknown = sorted(set(value) - known)
    if unknown:
        raise SettingsError(f"unknown keys in '{key}': {unknown}")
    return value


def _port(value: Any, key: str) -> int | None:
    if value is None or value is False:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
        raise SettingsError(f"{key} must be a port number (0-65535) or null to disable, got {value!r}")
    return value


def _environment_region() -> str | None:
    """The region the AWS tools read from the environment (how containers are told; oss:// needs one)."""
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def _platform_port(default: int | None) -> int | None:
    """``$PORT`` when the platform sets it (the HTTP port unless function.yaml or a flag says otherwise)."""
    text = os.environ.get(PLATFORM_PORT_ENV, "").strip()
    if not text:
        return default
    if not text.isdigit() or not 0 < int(text) <= 65535:
        raise SettingsError(f"${PLATFORM_PORT_ENV} must be a port number (1-65535), got {text!r}")
    return int(text)


def _positive_int(section: dict, key: str, default: int, where: str) -> int:
    value = section.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SettingsError(f"{where}.{key} must be a positive integer")
    return value


def _seconds(section: dict, key: str, default: float, where: str = "", positive: bool = False) -> float:
    value = section.get(key, default)
    name = f"{where}.{key}" if where else key
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or (positive and value == 0):
        raise SettingsError(f"{name} must be a {'positive' if positive else 'non-negative'} number of seconds")
    return float(value)


def _choice(section: dict, key: str, default: str, choices: tuple[str, ...], where: str) -> str:
    value = section.get(key, default)
    if value not in choices:
        raise SettingsError(f"{where}.{key} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _optional_str(section: dict, key: str, where: str) -> str | None:
    value = section.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise SettingsError(f"{where}.{key} must be a non-empty string")
    return value


def check_restrictions(settings: FunctionSettings) -> None:
    """The endpoint restrictions parse (SettingsError naming the setting otherwise)."""
    restrictions(settings)


def restrictions(settings: FunctionSettings) -> tuple[RestrictedApis, RestrictedApis]:
    """The HTTP and gRPC endpoint restrictions the settings name."""
    try:
        return (RestrictedApis.parse(settings.http_restricted_api, "server.http_restricted_api"),
                RestrictedApis.parse(settings.grpc_restricted_protocol, "server.grpc_restricted_protocol"))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def trace_settings(settings: FunctionSettings) -> TraceSettings:
    """The trace settings at start (SettingsError naming what is wrong)."""
    try:
        return parse_trace_config(settings.trace_config)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


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


def check_load_models(settings: FunctionSettings) -> None:
    """Models to load at start are for explicit model control only (as Triton's --load-model)."""
    if settings.load_models and settings.model_control != "explicit":
        raise SettingsError("model_control.load_models (--load-model) needs model control mode 'explicit'")


def parse_settings(data: Any, base_dir: Path) -> FunctionSettings:
    """Validate the parsed YAML; SettingsError names the offending key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SettingsError("function.yaml must be a mapping at the top level")
    unknown = sorted(set(data) - _TOP_LEVEL)
    if unknown:
        raise SettingsError(f"unknown function.yaml keys: {unknown}")
    server = _section(data, "server", {"host", "http_port", "grpc_port", "metrics_port", "max_request_bytes",
                                       "grpc_max_message_bytes", "default_max_queue_size", "header_timeout_seconds",
                                       "body_timeout_seconds", "max_connections", "max_streams_per_connection",
                                       "stream_max_in_flight", "json_decode_budget_bytes", "name",
                                       "strict_readiness", "auto_complete_config", "frontend_processes",
                                       "sequence_slot_timeout_seconds", "execute_timeout_seconds",
                                       "send_timeout_seconds", "max_unsent_response_bytes", "stream_max_bytes",
                                       "streams_max_bytes", "http_restricted_api", "grpc_restricted_protocol",
                                       "model_load_thread_count", "trace_config", "rate_limit",
                                       "rate_limit_resources"})
    instance = _section(data, "instance", {"device"})
    auth = _section(data, "auth", {"token", "token_env", "exempt_health"})
    storage = _section(data, "storage", {"endpoint_url", "region", "addressing_style", "max_attempts",
                                         "max_concurrency", "connect_timeout_seconds", "read_timeout_seconds",
                                         "cold_start_deadline_seconds", "ranged_threshold_bytes",
                                         "ranged_part_bytes"})
    control = _section(data, "model_control", {"mode", "poll_interval_seconds", "load_models"})
    response_cache = _section(data, "cache", {"size_bytes"})

    settings = FunctionSettings(base_dir=base_dir)
    settings.name = str(data.get("name", settings.name))
    repository = data.get("model_repository", settings.model_repository)
    if not isinstance(repository, str) or not repository:
        raise SettingsError("model_repository must be a path or an s3:// / oss:// URL")
    settings.model_repository = repository
    if settings.remote:
        try:
            parse_location(repository)
        except StorageError as exc:
            raise SettingsError(f"model_repository: {exc}") from None

    settings.host = str(server.get("host", settings.host))
    settings.http_port = _port(server.get("http_port", _platform_port(settings.http_port)), "server.http_port")
    settings.grpc_port = _port(server.get("grpc_port", settings.grpc_port), "server.grpc_port")
    settings.metrics_port = _port(server.get("metrics_port", settings.metrics_port), "server.metrics_port")
    settings.default_max_queue_size = _positive_int(server, "default_max_queue_size",
                                                    settings.default_max_queue_size, "server")
    settings.max_request_bytes = _positive_int(server, "max_request_bytes", settings.max_request_bytes, "server")
    settings.grpc_max_message_bytes = _positive_int(
        server, "grpc_max_message_bytes", settings.grpc_max_message_bytes, "server"
    )
    settings.header_timeout_seconds = _seconds(server, "header_timeout_seconds", settings.header_timeout_seconds,
                                               "server", positive=True)
    for key in ("sequence_slot_timeout_seconds", "execute_timeout_seconds", "send_timeout_seconds"):
        setattr(settings, key, _seconds(server, key, getattr(settings, key), "server", positive=True))
    settings.body_timeout_seconds = _seconds(server, "body_timeout_seconds", settings.body_timeout_seconds,
                                             "server", positive=True)
    for key in ("max_connections", "max_streams_per_connection", "stream_max_in_flight", "json_decode_budget_bytes",
                "max_unsent_response_bytes", "stream_max_bytes", "streams_max_bytes", "model_load_thread_count"):
        setattr(settings, key, _positive_int(server, key, getattr(settings, key), "server"))
    settings.server_name = _optional_str(server, "name", "server") or settings.server_name
    settings.frontend_processes = frontend_process_count(server.get("frontend_processes", 0))
    for key in ("http_restricted_api", "grpc_restricted_protocol"):
        specs = server.get(key, [])
        if not isinstance(specs, list) or not all(isinstance(spec, str) for spec in specs):
            raise SettingsError(f"server.{key} must be a list of '<API>[,<API>...]:<key>=<value>'")
        setattr(settings, key, tuple(specs))
    check_restrictions(settings)
    specs = server.get("trace_config", [])
    if not isinstance(specs, list) or not all(isinstance(spec, str) for spec in specs):
        raise SettingsError("server.trace_config must be a list of Triton's --trace-config values")
    settings.trace_config = tuple(specs)
    trace_settings(settings)
    settings.rate_limit = _choice(server, "rate_limit", "off", ("off", "execution_count"), "server")
    specs = server.get("rate_limit_resources", [])
    if not isinstance(specs, list) or not all(isinstance(spec, str) for spec in specs):
        raise SettingsError("server.rate_limit_resources must be a list of '<name>:<count>[:<device>]'")
    settings.rate_limit_resources = tuple(specs)
    rate_limit_resources(settings)
    strict = server.get("strict_readiness", True)
    if not isinstance(strict, bool):
        raise SettingsError("server.strict_readiness must be true or false")
    settings.strict_readiness = strict
    auto_complete = server.get("auto_complete_config", True)
    if not isinstance(auto_complete, bool):
        raise SettingsError("server.auto_complete_config must be true or false")
    settings.auto_complete_config = auto_complete
    settings.device = _choice(instance, "device", settings.device, ("auto", "gpu", "cpu"), "instance")

    token = _optional_str(auth, "token", "auth")
    token_env = auth.get("token_env", AUTH_TOKEN_ENV)
    if not isinstance(token_env, str) or not token_env:
        raise SettingsError("auth.token_env must be the name of an environment variable")
    settings.auth_token = os.environ.get(token_env) or token
    exempt = auth.get("exempt_health", True)
    if not isinstance(exempt, bool):
        raise SettingsError("auth.exempt_health must be true or false")
    settings.auth_exempt_health = exempt

    settings.storage = StorageSettings(
        endpoint_url=_optional_str(storage, "endpoint_url", "storage"),
        region=_optional_str(storage, "region", "storage") or _environment_region(),
        addressing_style=_choice(storage, "addressing_style", "auto", ("auto", "path", "virtual"), "storage"),
        max_attempts=_positive_int(storage, "max_attempts", 5, "storage"),
        max_concurrency=_positive_int(storage, "max_concurrency", 8, "storage"),
        connect_timeout=_seconds(storage, "connect_timeout_seconds", 10.0, "storage", positive=True),
        read_timeout=_seconds(storage, "read_timeout_seconds", 60.0, "storage", positive=True),
        ranged_threshold_bytes=_positive_int(storage, "ranged_threshold_bytes", 64 << 20, "storage"),
        ranged_part_bytes=_positive_int(storage, "ranged_part_bytes", 16 << 20, "storage"),
    )
    settings.cold_start_deadline_seconds = _seconds(storage, "cold_start_deadline_seconds", 600.0, "storage",
                                                    positive=True)
    cache_dir = data.get("cache_dir", settings.cache_dir)
    if not isinstance(cache_dir, str) or not cache_dir:
        raise SettingsError("cache_dir must be a path")
    settings.cache_dir = cache_dir
    size = response_cache.get("size_bytes", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise SettingsError("cache.size_bytes must be a whole number of bytes (0: no response cache)")
    settings.response_cache_bytes = size

    settings.model_control = _choice(control, "mode", "none", ("none", "poll", "explicit"), "model_control")
    settings.poll_interval_seconds = _seconds(control, "poll_interval_seconds", 5.0, "model_control", positive=True)
    load_models = control.get("load_models", [])
    if not isinstance(load_models, list) or not all(isinstance(n, str) and n for n in load_models):
        raise SettingsError("model_control.load_models must be a list of model names ('*' for all)")
    settings.load_models = tuple(load_models)
    settings.idle_timeout_seconds = _seconds(data, "idle_timeout_seconds", 0.0)
    settings.shutdown_timeout_seconds = _seconds(data, "shutdown_timeout_seconds", 30.0)
    return settings


def load_settings(path: Path | None) -> FunctionSettings:
    """Read ``path`` (or return defaults when it is None)."""
    if path is None:
        return parse_settings({}, Path.cwd())
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"cannot read {path}: {exc.strerror}") from None
    import yaml  # only when there is a file to read: it is a good part of a cold start's imports otherwise

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path} is not valid YAML: {exc}") from None
    return parse_settings(data, path.resolve().parent)


MAX_FRONTEND_PROCESSES = 64


def frontend_process_count(value: Any) -> int:
    """``server.frontend_processes``: a count from 0 to 64, or ``auto``: one fewer than the cores this process may
    use (the process owning the models and their workers take about one), none on a single core."""
    if value == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return min(MAX_FRONTEND_PROCESSES, cores - 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_FRONTEND_PROCESSES:
        raise SettingsError(f"server.frontend_processes must be 'auto' or a whole number from 0 to "
                            f"{MAX_FRONTEND_PROCESSES}, not {value!r}")
    return value
