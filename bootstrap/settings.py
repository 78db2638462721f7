"""``function.yaml`` and the flags of ``bootstrap run``: every setting declared once below (its key, check, flags,
README text and default: ``settings_schema.py`` reads the parser, the flags and the README table off them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bootstrap.cache import default_cache_dir
from bootstrap.settings_meaning import PLATFORM_PORT_ENV, check_settings
from bootstrap.settings_schema import (
    Flag,
    SettingsError,
    apply_flags,
    boolean,
    byte_count,
    check_keys,
    count_or_zero,
    one_of,
    optional_boolean,
    optional_text,
    port,
    positive_int,
    read_file_values,
    seconds,
    seconds_or_zero,
    sections,
    setting,
    settings_table,
    text,
    text_list,
    true_or_false,
)
from bootstrap.storage import StorageError, StorageSettings, is_remote, parse_location
from runtime.header_forward import check_forward_pattern

AUTH_TOKEN_ENV = "FUNCTION_AUTH_TOKEN"
MAX_FRONTEND_PROCESSES = 64
ALL_COMMANDS = ("run", "check", "sync")


def _platform_port() -> int | None:
    """``$PORT`` when the platform sets it (the HTTP port unless function.yaml or a flag says otherwise)."""
    text_value = os.environ.get(PLATFORM_PORT_ENV, "").strip()
    if not text_value:
        return 8000
    if not text_value.isdigit() or not 0 < int(text_value) <= 65535:
        raise SettingsError(f"${PLATFORM_PORT_ENV} must be a port number (1-65535), got {text_value!r}")
    return int(text_value)


def _repository(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise SettingsError(f"{name} must be a path or an s3:// / oss:// URL")
    if is_remote(value):
        try:
            parse_location(value)
        except StorageError as exc:
            raise SettingsError(f"{name}: {exc}") from None
    return value


def _local_path_resolved(value: str) -> str:
    """A flag's local path is relative to the working directory (function.yaml's, to its folder)."""
    return value if is_remote(value) else str(Path(value).resolve())


def frontend_process_count(value: Any, name: str = "server.frontend_processes") -> int:
    """A count from 0 to 64, or ``auto``: one fewer than the cores this process may use (the process owning the
    models and their workers take about one), none on a single core."""
    if value == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return min(MAX_FRONTEND_PROCESSES, cores - 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_FRONTEND_PROCESSES:
        raise SettingsError(f"{name} must be 'auto' or a whole number from 0 to {MAX_FRONTEND_PROCESSES}, "
                            f"not {value!r}")
    return value


def _count_or_auto(text_value: str) -> int | str:
    return int(text_value) if text_value.isdigit() else text_value


def _cache_config(text_value: str) -> int:
    """Triton's ``--cache-config local,size=N`` (the only cache implementation here is the local one)."""
    kind, _, assignment = text_value.partition(",")
    key, _, value = assignment.partition("=")
    if kind != "local" or key != "size" or not value.isdigit():
        raise SettingsError(f"--cache-config must be 'local,size=<bytes>', not '{text_value}'")
    return int(value)


def _at_least_zero(text_value: str) -> int:
    return max(0, int(text_value))


def _port_flags(flag: str, protocol: str, default: str) -> tuple[Flag, Flag]:
    return (Flag(f"--{flag}-port", f"{protocol} port (default {default})", int),
            Flag(f"--no-{flag}", f"do not serve {protocol}", None, const=None))


def _true_or_false_flag(flag: str, help_text: str) -> list[Flag]:
    return [Flag(flag, help_text, true_or_false, choices=("true", "false"), bare="true")]


_RESTRICTION = "<API>[,<API>...]:<key>=<value>"


def _optional_positive_int(value: Any, name: str) -> int | None:
    return None if value is None else positive_int(value, name)


def _forward_pattern(value: Any, name: str) -> str:
    """A header-forward pattern RE2 compiles ("" or null: off)."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise SettingsError(f"{name} must be a regular expression (RE2), got {value!r}")
    try:
        return check_forward_pattern(value)
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None


@dataclass
class FunctionSettings:
    """What the function serves and how; ``base_dir`` (function.yaml's folder) anchors its relative paths."""

    name: str = setting("triton-function", key="name", check=text, meaning="the function's name (logged)")
    model_repository: str = setting(
        "examples/model_repository", key="model_repository", check=_repository,
        meaning="local path (relative to function.yaml), or `s3://bucket/prefix` / `oss://bucket/prefix`",
        flags=[Flag("--model-repository", "local path, or s3:// / oss:// URL, of the model repository",
                    _local_path_resolved, commands=ALL_COMMANDS)])
    storage: StorageSettings = field(default_factory=StorageSettings)
    cold_start_deadline_seconds: float = setting(
        600.0, key="storage.cold_start_deadline_seconds", check=seconds,
        meaning="total time a sync may take, listing included (no request outlasts it)")
    cache_dir: str = setting(
        key="cache_dir", check=text, factory=default_cache_dir,
        shown="`$XDG_CACHE_HOME/serverless-triton`, else `~/.cache/serverless-triton`, else "
              "`<tmp>/serverless-triton-<uid>`",
        meaning="where synced models are kept (with their manifest); created private (0700), refused if another "
                "user owns it or can write it; only what a sync published from storage is served (anything else "
                "found there is removed with a warning)",
        flags=[Flag("--cache-dir", "local cache for a repository synced from object storage",
                    lambda value: str(Path(value).resolve()), commands=ALL_COMMANDS)])
    response_cache_bytes: int = setting(
        0, key="cache.size_bytes", into="server.cache_size_bytes", check=byte_count,
        meaning="the response cache's budget, for models whose config has `response_cache { enable: true }`; "
                "`0`: no cache",
        flags=[Flag("--cache-config", "the response cache, as Triton's flag: 'local,size=BYTES'", _cache_config,
                    metavar="local,size=BYTES"),
               Flag("--response-cache-byte-size", "the response cache's size", _at_least_zero, metavar="BYTES")])
    host: str = setting("0.0.0.0", key="server.host", into="adapters.host", check=text, meaning="address to listen on",
                        flags=[Flag("--host", "address to listen on")])
    http_port: int | None = setting(
        key="server.http_port", check=port, factory=_platform_port, shown="`$PORT` when set, else `8000`",
        into="adapters.http_port",
        meaning="HTTP port; `null` disables HTTP", flags=_port_flags("http", "HTTP", "$PORT if set, else 8000"))
    single_port: bool | None = setting(
        None, key="server.single_port", check=optional_boolean, shown="on when `$PORT` sets the HTTP port",
        meaning="serve gRPC on the HTTP port too (HTTP/1.1, h2c REST and gRPC on one listener, routed per request "
                "by content type), as a platform that gives a function one port needs; the gRPC port is then not "
                "served",
        flags=_true_or_false_flag(
            "--single-port", "gRPC on the HTTP port too (default: when $PORT sets the HTTP port)"))
    batch_scheduled_threads: bool = setting(
        True, key="server.batch_scheduled_threads", into="server.batch_scheduled_threads", check=boolean,
        meaning="run every thread of the server, the event loop's included, and the Python models' workers under "
                "Linux's SCHED_BATCH: a woken thread then waits for the running one to pause instead of preempting "
                "it while it holds the GIL (measured in docs/benchmarks.md; no effect where the system refuses it)",
        flags=_true_or_false_flag(
            "--batch-scheduled-threads", "the server's threads and workers under SCHED_BATCH (default true)"))
    grpc_port: int | None = setting(8001, key="server.grpc_port", check=port, meaning="gRPC port; `null` disables gRPC",
                                    flags=_port_flags("grpc", "gRPC", "8001"))
    metrics_port: int | None = setting(
        8002, key="server.metrics_port", check=port, meaning="Prometheus `/metrics` port; `null` disables it",
        into="server.metrics_port",
        flags=_port_flags("metrics", "Prometheus metrics", "8002"))
    metrics_config: tuple[str, ...] = setting(
        (), key="server.metrics_config", check=text_list("Triton's --metrics-config values"),
        meaning="as Triton's `--metrics-config` values: `histogram_latencies=true` adds "
                "`nv_inference_first_response_histogram_ms` for every model (as Triton 2.65; off by default, as in "
                "Triton; while on, every request goes through the core, the native lanes standing aside)",
        flags=[Flag("--metrics-config", "metrics, as Triton's flag: histogram_latencies=true|false (repeatable)",
                    metavar="<setting>=<value>", repeatable=True)])
    max_request_bytes: int = setting(
        64 << 20, key="server.max_request_bytes", into="adapters.max_request_bytes", check=positive_int,
        meaning="largest HTTP request body accepted (after decompression; Triton 2.59's `--http-max-input-size`, "
                "whose default is the same 64 MiB)",
        flags=[Flag("--http-max-input-size", "largest HTTP request body, decompressed (default 64 MiB, as Triton)",
                    int, metavar="BYTES")])
    grpc_max_message_bytes: int = setting(
        128 << 20, key="server.grpc_max_message_bytes", into="adapters.grpc_max_message_bytes", check=positive_int,
        meaning="largest gRPC message, each way (larger: RESOURCE_EXHAUSTED)")
    default_max_queue_size: int = setting(1024, key="server.default_max_queue_size", check=positive_int,
                                          into="server.default_max_queue_size",
                                          meaning="queue bound of a model version whose config sets none")
    sequence_slot_timeout_seconds: float = setting(
        30.0, key="server.sequence_slot_timeout_seconds", into="server.sequence_slot_timeout", check=seconds,
        meaning="how long a new sequence waits for a slot when every one is held (a request's shorter `timeout` "
                "wins); then 503")
    execute_timeout_seconds: float = setting(
        60.0, key="server.execute_timeout_seconds", into="server.execute_timeout", check=seconds,
        meaning="how long one execution may run: past it its requests fail, a Python worker is replaced, a stuck "
                "thread keeps the model unready until it returns (a Python model's `execute_timeout_seconds` "
                "parameter overrides it)")
    server_name: str = setting("triton", key="server.name", into="server.server_name", check=text,
                               meaning="the name server metadata answers (tools check for Triton's)")
    auto_complete_config: bool = setting(
        True, key="server.auto_complete_config", into="server.auto_complete_config", check=boolean,
        meaning="run Python models' `auto_complete_config` and serve config-less Python models, as Triton; "
                "`false`: configs as written",
        flags=[Flag("--disable-auto-complete-config", "use config.pbtxt as written: no config-less Python models, "
                    "no auto_complete_config", None, const=False, commands=("run", "check"))])
    strict_readiness: bool = setting(
        True, key="server.strict_readiness", into="server.strict_readiness", check=boolean,
        meaning="ready only while every model the server tried to load is ready (Triton's default); `false`: "
                "ready once the initial load finished",
        flags=_true_or_false_flag(
            "--strict-readiness", "ready only while every model is ready (default true, as Triton)"))
    openai_default_max_tokens: int = setting(
        16, key="openai.default_max_tokens", check=positive_int,
        meaning="the OpenAI-compatible endpoints' `max_tokens` where a request gives none and the model's config "
                "(`openai.default_max_tokens` parameter) sets none, as Triton's OpenAI frontend",
        flags=[Flag("--default-max-tokens", "max_tokens where a request gives none (default 16, as Triton)", int,
                    metavar="N")])
    openai_max_tool_call_parse_bytes: int = setting(
        128 << 10, key="openai.max_tool_call_parse_bytes", check=positive_int,
        meaning="a streamed chat completion offering tools holds its text to parse the tool calls at the end; past "
                "this many bytes the model is cancelled and the stream ends with `finish_reason: \"length\"`, as "
                "Triton's OpenAI frontend's `--max-tool-call-parse-bytes`",
        flags=[Flag("--max-tool-call-parse-bytes", "bytes of a tool-offering stream's text held (default 131072, as "
                    "Triton)", int, metavar="BYTES")])
    openai_restricted_api: tuple[str, ...] = setting(
        (), key="openai.restricted_api", check=text_list("'<API>[,<API>...] <key> <value>'"),
        meaning="OpenAI-compatible API groups answered only to requests with a header, as Triton's OpenAI "
                "frontend's `--openai-restricted-api <API>[,<API>...] <key> <value>` (repeatable): `inference` "
                "(completions, chat, embeddings), `model-repository` (`/v1/models`, load, unload), `metrics` "
                "(`/metrics` on the metrics port), `health` (`GET /health/ready`); refused: 401 with OpenAI's error "
                "object; the values never reach the log",
        flags=[Flag("--openai-restricted-api", "answer these OpenAI API groups only to requests with this header "
                    "(repeatable, as Triton's frontend)", metavar="'<API>[,<API>...] <key> <value>'",
                    repeatable=True, adds=False, words=True)])
    allow_client_shm: bool = setting(
        False, key="server.allow_client_shm", into="server.allow_client_shm", check=boolean,
        meaning="let clients register and unregister shared-memory regions (system and CUDA) for their inputs and "
                "outputs, as Triton's `--allow-client-shm` (off by default since Triton 2.69: a client then gets "
                "Triton's UNSUPPORTED error; the regions' status stays answerable); the server's own shared memory "
                "(its workers' tensors) is not affected",
        flags=_true_or_false_flag(
            "--allow-client-shm", "clients may register shared-memory regions (default false, as Triton 2.69)"))
    header_timeout_seconds: float = setting(
        30.0, key="server.header_timeout_seconds", check=seconds,
        into=("http.header_timeout", "grpc.handshake_timeout"),
        meaning="time to send a request's headers; also the idle keep-alive timeout and gRPC's connection "
                "handshake timeout")
    body_timeout_seconds: float = setting(120.0, key="server.body_timeout_seconds", check=seconds,
                                          into="http.body_timeout",
                                          meaning="time to send a whole HTTP request body (else 408)")
    max_connections: int = setting(
        4096, key="server.max_connections", into="http.max_connections", check=positive_int,
        meaning="HTTP requests served at once, and the connections kept before the oldest ones still sending "
                "headers are closed (also kept under the open-file limit less 64); the open-file limit is raised "
                "to fit")
    send_timeout_seconds: float = setting(
        30.0, key="server.send_timeout_seconds", into="http.send_timeout", check=seconds,
        meaning="time a client may take to accept each 256 KiB chunk of a large HTTP answer before it is cut off")
    max_unsent_response_bytes: int = setting(
        1 << 30, key="server.max_unsent_response_bytes", into="http.max_unsent_bytes", check=positive_int,
        meaning="bytes of HTTP answers being sent, per serving process; past it the clients stalled longest are "
                "cut off, else 503")
    max_streams_per_connection: int = setting(256, key="server.max_streams_per_connection", check=positive_int,
                                              into="http.max_concurrent_streams",
                                              meaning="concurrent HTTP/2 streams per connection")
    frontend_processes: int = setting(
        0, key="server.frontend_processes", into="server.frontend_processes", check=frontend_process_count,
        meaning="processes that serve HTTP and gRPC over the one process owning the models (0: that process "
                "serves them itself; `auto`: cores - 1)",
        flags=[Flag("--frontend-processes", "processes serving HTTP and gRPC beside the one owning the models "
                    "(0: that one serves)", _count_or_auto, metavar="N|auto")])
    stream_max_in_flight: int = setting(
        64, key="server.stream_max_in_flight", into="grpc.stream_max_in_flight", check=positive_int,
        meaning="gRPC ModelStreamInfer: requests of one stream running or answered but unsent before the stream "
                "stops being read")
    stream_max_bytes: int = setting(
        16 << 20, key="server.stream_max_bytes", into="grpc.stream_max_bytes", check=positive_int,
        meaning="gRPC ModelStreamInfer: bytes of one stream's requests not yet answered and answers not yet sent "
                "before it stops being read")
    streams_max_bytes: int = setting(1 << 30, key="server.streams_max_bytes", check=positive_int,
                                     into="grpc.streams_max_bytes",
                                     meaning="the same, for every stream of a serving process together; also the "
                                             "bytes all gRPC calls of a process may be decompressing at once")
    grpc_native_edge: bool = setting(
        True, key="server.grpc_native_edge", into="grpc.native_edge", check=boolean,
        meaning="serve gRPC on the native edge (grpc++'s callback server, its calls handed to the event loop in "
                "batches; built at install where libgrpc++ is found); `false`, or where it is not built: grpcio's "
                "thread-pool server (`server.grpc_infer_threads`)",
        flags=_true_or_false_flag(
            "--grpc-native-edge", "serve gRPC on grpc++'s callback server (default true; false: grpcio)"))
    grpc_native_lanes: bool = setting(
        True, key="server.grpc_native_lanes", into="grpc.native_lanes", check=boolean,
        meaning="serve a plain infer request (no parameters, every input of the model's datatype and shape) to a "
                "Python-backend model straight to the model's worker and back, past the event loop, while the model "
                "has nothing queued: a lone HTTP request with binary tensors from the HTTP route, and a ModelInfer "
                "call in grpc++'s own threads on the native edge; the core still decides which models qualify and "
                "counts their statistics (docs/features.md, \"Direct path\"); with `auth.token` set, or `false`: "
                "every request through the core",
        flags=_true_or_false_flag(
            "--grpc-native-lanes",
            "plain ModelInfer calls and lone binary HTTP infer requests to Python models past the core (default "
            "true)"))
    grpc_infer_threads: int = setting(
        256, key="server.grpc_infer_threads", into="grpc.infer_threads", check=count_or_zero,
        meaning="where gRPC is served by grpcio (`server.grpc_native_edge` false or not built): ModelInfer calls "
                "answered at once, each in a thread of grpcio's thread-pool server (threads start as calls need "
                "them; more calls wait their turn in grpcio, before the model's queue and its queue policy see "
                "them); `0`: serve gRPC with grpc.aio instead (no thread per call)",
        flags=[Flag("--grpc-infer-threads", "gRPC ModelInfer calls answered at once (0: grpc.aio server)", int,
                    metavar="N")])
    grpc_max_response_pool_size: int | None = setting(
        None, key="server.grpc_max_response_pool_size", into="grpc.max_response_pool", check=_optional_positive_int,
        meaning="gRPC ModelStreamInfer: responses of one request queued and not yet written; past it the request's "
                "further responses wait until the client takes them (Triton 2.57's `--grpc-max-response-pool-size`, "
                "unbounded by default as there; `server.stream_max_bytes` bounds their bytes whatever it is)",
        shown="none", flags=[Flag("--grpc-max-response-pool-size", "responses of one gRPC stream request queued "
                                  "unsent (default unbounded, as Triton)", int, metavar="N")])
    grpc_infer_thread_count: int | None = setting(
        None, key="server.grpc_infer_thread_count", check=_optional_positive_int,
        meaning="accepted so that Triton's command lines run unchanged, and without effect: Triton's "
                "`--grpc-infer-thread-count` (2.56) sizes grpc++'s completion-queue handler threads, which the native "
                "edge does not have (it serves calls on grpc++'s callback threads and the event loop); "
                "`server.grpc_infer_threads` bounds the grpcio fallback",
        shown="none", flags=[Flag("--grpc-infer-thread-count", "accepted as Triton's flag; no effect here", int,
                                  metavar="N")])
    grpc_max_streams: int = setting(
        1024, key="server.grpc_max_streams", into="grpc.max_streams", check=positive_int,
        meaning="gRPC ModelStreamInfer streams open at once (on grpcio's thread-pool server each holds two "
                "threads); more are refused with RESOURCE_EXHAUSTED (grpc.aio: unbounded)",
        flags=[Flag("--grpc-max-streams", "gRPC streams open at once (not on grpc.aio)", int, metavar="N")])
    trace_config: tuple[str, ...] = setting(
        (), key="server.trace_config", check=text_list("Triton's --trace-config values"), shown="tracing off",
        meaning="tracing, as Triton's `--trace-config` values (a list; the flag adds to it): `rate=N`, "
                "`level=TIMESTAMPS`, `count=N`, `mode=triton` or `opentelemetry`, `triton,file=PATH`, "
                "`triton,log-frequency=N`, `opentelemetry,url=URL`, `opentelemetry,resource=K=V`",
        flags=[Flag("--trace-config", "tracing, as Triton's flag: rate=N, level=TIMESTAMPS, count=N, "
                    "mode=triton|opentelemetry, triton,file=PATH, triton,log-frequency=N, opentelemetry,url=URL "
                    "(repeatable)", metavar="[<mode>,]<setting>=<value>", repeatable=True)])
    rate_limit: str = setting(
        "off", key="server.rate_limit", check=one_of("off", "execution_count"),
        meaning="`off` or `execution_count`: instances execute only while holding their `rate_limiter` resources "
                "(as Triton's `--rate-limit`)",
        flags=[Flag("--rate-limit", "execution_count: instances execute only while holding their rate_limiter "
                    "resources (default off, as Triton)", choices=("off", "execution_count"))])
    rate_limit_resources: tuple[str, ...] = setting(
        (), key="server.rate_limit_resources", check=text_list("'<name>:<count>[:<device>]'"),
        meaning="resource counts, `<name>:<count>[:<device>]` (a repeatable flag, adding to the list); a resource "
                "not listed counts the largest any instance asks for",
        flags=[Flag("--rate-limit-resource", "a rate limiter resource's count (repeatable; default: the largest "
                    "any instance asks for)", metavar="<name>:<count>[:<device>]", repeatable=True)])
    model_load_thread_count: int = setting(
        4, key="server.model_load_thread_count", into="server.model_load_concurrency", check=positive_int,
        meaning="models loading at once, at start and on reloads (as Triton's flag)",
        flags=[Flag("--model-load-thread-count", "models loading at once (default 4, as Triton)", int,
                    metavar="N")])
    http_restricted_api: tuple[str, ...] = setting(
        (), key="server.http_restricted_api", check=text_list(f"'{_RESTRICTION}'"),
        meaning=f"REST API groups answered only to requests with a header: entries `{_RESTRICTION}` as Triton's "
                "`--http-restricted-api` (repeatable flag, replacing the list); groups `health`, `metadata`, "
                "`inference`, `shared-memory`, `model-config`, `model-repository`, `statistics`, `trace`, "
                "`logging`; refused: 403 `This API is restricted, expecting header '<key>'`",
        flags=[Flag("--http-restricted-api", "answer these REST API groups only to requests with this header "
                    "(repeatable, as Triton)", metavar=_RESTRICTION, repeatable=True, adds=False)])
    grpc_restricted_protocol: tuple[str, ...] = setting(
        (), key="server.grpc_restricted_protocol", check=text_list(f"'{_RESTRICTION}'"),
        meaning="the same for gRPC methods: the call's metadata must carry `triton-grpc-protocol-<key>: "
                "<value>`, else UNAVAILABLE",
        flags=[Flag("--grpc-restricted-protocol", "answer these gRPC API groups only to calls with metadata "
                    "triton-grpc-protocol-<key> (repeatable, as Triton)", metavar=_RESTRICTION, repeatable=True,
                    adds=False)])
    http_header_forward_pattern: str = setting(
        "", key="server.http_header_forward_pattern", into="adapters.http_header_forward", check=_forward_pattern,
        meaning="HTTP request headers whose names match this RE2 pattern (anywhere in the name, in any case unless "
                "it starts `(?-i)`) reach infer requests as string parameters, as Triton's "
                "`--http-header-forward-pattern`; a matching header that is a reserved parameter key "
                "(`sequence_id`, `priority`, `timeout`, ...) or starts `triton_` is refused, 400, as Triton 2.69; "
                "while set, every infer request goes through the core (the native lanes stand aside)",
        shown="off",
        flags=[Flag("--http-header-forward-pattern", "forward matching HTTP headers as request parameters "
                    "(an RE2 pattern, as Triton)", metavar="REGEX")])
    grpc_header_forward_pattern: str = setting(
        "", key="server.grpc_header_forward_pattern", into="adapters.grpc_header_forward", check=_forward_pattern,
        meaning="the same for gRPC call metadata (ModelInfer and each request of a ModelStreamInfer stream), as "
                "Triton's `--grpc-header-forward-pattern`; refused: INVALID_ARGUMENT",
        shown="off",
        flags=[Flag("--grpc-header-forward-pattern", "forward matching gRPC metadata as request parameters "
                    "(an RE2 pattern, as Triton)", metavar="REGEX")])
    json_decode_budget_bytes: int = setting(
        256 << 20, key="server.json_decode_budget_bytes", into="adapters.json_decode_budget", check=positive_int,
        meaning="bytes of large (> 1 MiB) JSON bodies read and decoded at once; past it 503, a single larger one "
                "413")
    tensor_pool_bytes: int = setting(
        64 << 20, key="server.tensor_pool_bytes", into="server.tensor_pool_bytes", check=byte_count,
        meaning="shared memory large request tensors (64 KiB and more) are received into, for Python models to read "
                "without a copy; held once grown, never past this (`0`: off; a request that finds it full is "
                "received into private memory)")
    device: str = setting(
        "auto", key="instance.device", check=one_of("auto", "gpu", "cpu"),
        meaning="`auto` (GPU when present), `gpu`, or `cpu`",
        flags=[Flag("--device", "where models run", choices=("auto", "gpu", "cpu"), commands=("run", "check"))])
    auth_token: str | None = setting(
        None, key="auth.token", into="adapters.auth_token", check=optional_text, shown="none: open, with a warning",
        meaning=f"require this token on every call; `${AUTH_TOKEN_ENV}` (or the variable `auth.token_env` names) "
                "overrides it, and the flag both",
        flags=[Flag("--auth-token", f"require this token (also ${AUTH_TOKEN_ENV} or function.yaml auth.token)")])
    auth_token_env: str = setting(AUTH_TOKEN_ENV, key="auth.token_env", check=text,
                                  meaning="the environment variable read for the token")
    auth_exempt_health: bool = setting(True, key="auth.exempt_health", check=boolean,
                                       into="adapters.auth_exempt_health",
                                       meaning="leave `/v2/health/live` and `/v2/health/ready` open")
    model_control: str = setting(
        "none", key="model_control.mode", check=one_of("none", "poll", "explicit", "on_demand"),
        into="server.model_control",
        meaning="`none`, `poll`, `explicit` (as Triton's), or `on_demand`: each model loads at its first call, "
                "stays while used, and is unloaded when idle or to make room in the memory budget",
        flags=[Flag("--model-control-mode", "model control mode",
                    choices=("none", "poll", "explicit", "on_demand"))])
    poll_interval_seconds: float = setting(
        5.0, key="model_control.poll_interval_seconds", into="server.poll_interval", check=seconds,
        meaning="how often poll mode re-lists storage / rescans",
        flags=[Flag("--poll-interval", "seconds between repository polls (poll mode)", float)])
    load_models: tuple[str, ...] = setting(
        (), key="model_control.load_models", into="server.startup_models", check=text_list("model names ('*' for all)"),
        meaning="explicit mode: models to load at start, `*` for all (a repeatable flag, replacing the list)",
        flags=[Flag("--load-model", "explicit mode: load this model at start (repeatable; '*' loads every model)",
                    metavar="NAME", repeatable=True, adds=False)])
    keep_warm_seconds: float = setting(
        300.0, key="model_control.keep_warm_seconds", into="on_demand.keep_warm", check=seconds_or_zero,
        meaning="on_demand: a model unused this long is unloaded (`0`: never for idleness)",
        flags=[Flag("--keep-warm-seconds", "on_demand: seconds a model stays loaded unused", float)])
    memory_budget_bytes: int = setting(
        0, key="model_control.memory_budget_bytes", into="on_demand.memory_budget", check=byte_count,
        meaning="on_demand: host memory models may hold; before a load, the least recently used idle models are "
                "unloaded until the new one fits (`0`: no budget)",
        flags=[Flag("--memory-budget-bytes", "on_demand: host memory models may hold", int, metavar="BYTES")])
    gpu_memory_budget_bytes: int = setting(
        0, key="model_control.gpu_memory_budget_bytes", into="on_demand.gpu_memory_budget", check=byte_count,
        meaning="on_demand: memory models may hold on each GPU, measured on the whole device (what unloads leave "
                "behind, such as CUDA contexts, counts too); least recently used idle models on that GPU are "
                "unloaded to fit (`0`: no budget)",
        flags=[Flag("--gpu-memory-budget-bytes", "on_demand: memory models may hold on each GPU", int,
                    metavar="BYTES")])
    always_loaded: tuple[str, ...] = setting(
        (), key="model_control.always_loaded", into="on_demand.always_loaded", check=text_list("model names"),
        meaning="on_demand: models loaded at start and never unloaded for idleness or room",
        flags=[Flag("--always-load", "on_demand: keep this model loaded (repeatable)", metavar="NAME",
                    repeatable=True)])
    load_deadline_seconds: float = setting(
        120.0, key="model_control.load_deadline_seconds", into="on_demand.load_deadline", check=seconds,
        meaning="on_demand: how long a first call waits for its model's download and load (then 503)")
    retry_after_seconds: float = setting(
        30.0, key="model_control.retry_after_seconds", into="on_demand.retry_after", check=seconds_or_zero,
        meaning="on_demand: a model that failed to load answers with its reason this long before it is tried again")
    idle_timeout_seconds: float = setting(0.0, key="idle_timeout_seconds", check=seconds_or_zero,
                                          into="server.idle_timeout",
                                          meaning="exit (code 0) after this long without requests; `0` stays warm")
    shutdown_timeout_seconds: float = setting(
        30.0, key="shutdown_timeout_seconds", into="server.shutdown_timeout", check=seconds,
        meaning="SIGTERM's bound on draining in-flight requests and finalizing models",
        flags=[Flag("--shutdown-timeout", "seconds SIGTERM waits for in-flight requests and finalize (default 30)",
                    float)])
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


SETTINGS_CLASSES = (FunctionSettings, StorageSettings)


def settings_readme_table() -> str:
    """The README's function.yaml table, generated from the declarations above."""
    return settings_table(FunctionSettings)


def parse_settings(data: Any, base_dir: Path) -> FunctionSettings:
    """Validate the parsed YAML; SettingsError names the offending key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SettingsError("function.yaml must be a mapping at the top level")
    check_keys(data, sections(SETTINGS_CLASSES))
    storage = StorageSettings(**read_file_values(StorageSettings, data))
    settings = FunctionSettings(base_dir=base_dir, storage=storage, **read_file_values(FunctionSettings, data))
    settings.auth_token = os.environ.get(settings.auth_token_env) or settings.auth_token
    check_settings(settings)
    return settings


def apply_settings_flags(settings: FunctionSettings, args: Any) -> None:
    """The flags given on the command line over function.yaml's values, then the checks across settings."""
    apply_flags(settings, args)
    check_settings(settings)


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



if __name__ == "__main__":  # the README's table: python -m bootstrap.settings
    print(settings_readme_table(), end="")
