"""``bootstrap run | sync | check``: the function's entry point.

Only what parsing arguments and settings needs is imported at the top: each command imports its own stack when
it runs, and a Python-backend worker process (which imports this module as its parent's ``__main__``) pays for
none of it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bootstrap.errors import BootstrapError
from bootstrap.settings import (
    AUTH_TOKEN_ENV,
    FunctionSettings,
    SettingsError,
    check_load_models,
    check_restrictions,
    frontend_process_count,
    load_settings,
    rate_limit_resources,
    restrictions,
    trace_settings,
)
from bootstrap.storage import StorageError, is_remote, parse_location

if TYPE_CHECKING:
    from bootstrap.source import ObjectStoreSource
    from runtime.server import ServerOptions

logger = logging.getLogger("bootstrap")


def _add_common(parser: argparse.ArgumentParser) -> None:
    """Options every command reads: where settings and the repository are, and how much to log."""
    parser.add_argument("--config", type=Path, default=None, help="function.yaml (default: ./function.yaml)")
    parser.add_argument("--model-repository", help="local path, or s3:// / oss:// URL, of the model repository")
    parser.add_argument("--cache-dir", help="local cache for a repository synced from object storage")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bootstrap", description="Serverless Triton-compatible runtime")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="serve the model repository until SIGINT/SIGTERM")
    _add_common(run)
    run.add_argument("--host", help="address to listen on")
    run.add_argument("--http-port", type=int, help="HTTP port (default $PORT if set, else 8000)")
    run.add_argument("--grpc-port", type=int, help="gRPC port (default 8001)")
    run.add_argument("--metrics-port", type=int, help="Prometheus metrics port (default 8002)")
    run.add_argument("--no-http", action="store_true", help="do not serve HTTP")
    run.add_argument("--no-metrics", action="store_true", help="do not serve metrics")
    run.add_argument("--no-grpc", action="store_true", help="do not serve gRPC")
    run.add_argument("--auth-token", help=f"require this token (also ${AUTH_TOKEN_ENV} or function.yaml auth.token)")
    run.add_argument("--device", choices=["auto", "gpu", "cpu"], help="where models run")
    run.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], help="model control mode")
    run.add_argument("--load-model", action="append", metavar="NAME",
                     help="explicit mode: load this model at start (repeatable; '*' loads every model)")
    run.add_argument("--poll-interval", type=float, help="seconds between repository polls (poll mode)")
    run.add_argument("--strict-readiness", choices=["true", "false"],
                     help="ready only while every model is ready (default true, as Triton)")
    run.add_argument("--disable-auto-complete-config", action="store_true",
                     help="use config.pbtxt as written: no config-less Python models, no auto_complete_config")
    run.add_argument("--shutdown-timeout", type=float,
                     help="seconds SIGTERM waits for in-flight requests and finalize (default 30)")
    run.add_argument("--cache-config", metavar="local,size=BYTES",
                     help="the response cache, as Triton's flag: 'local,size=N' (also function.yaml cache.size_bytes)")
    run.add_argument("--frontend-processes", metavar="N|auto",
                     help="processes serving HTTP and gRPC beside the one owning the models (0: that one serves)")
    run.add_argument("--response-cache-byte-size", type=int, metavar="BYTES", help="the response cache's size")
    run.add_argument("--model-load-thread-count", type=int, metavar="N",
                     help="models loading at once (default 4, as Triton)")
    run.add_argument("--trace-config", action="append", metavar="[<mode>,]<setting>=<value>",
                     help="tracing, as Triton's flag: rate=N, level=TIMESTAMPS, count=N, mode=triton|opentelemetry, "
                          "triton,file=PATH, triton,log-frequency=N, opentelemetry,url=URL (repeatable)")
    run.add_argument("--model-namespacing", choices=["true", "false"],
                     help="Triton's flag, accepted: with one model repository, names cannot collide")
    run.add_argument("--rate-limit", choices=["off", "execution_count"],
                     help="execution_count: instances execute only while holding their rate_limiter resources "
                          "(default off, as Triton)")
    run.add_argument("--rate-limit-resource", action="append", metavar="<name>:<count>[:<device>]",
                     help="a rate limiter resource's count (repeatable; default: the largest any instance asks for)")
    run.add_argument("--http-restricted-api", action="append", metavar="<API>[,<API>...]:<key>=<value>",
                     help="answer these REST API groups only to requests with this header (repeatable, as Triton)")
    run.add_argument("--grpc-restricted-protocol", action="append", metavar="<API>[,<API>...]:<key>=<value>",
                     help="answer these gRPC API groups only to calls with metadata triton-grpc-protocol-<key> "
                          "(repeatable, as Triton)")
    sync = commands.add_parser("sync", help="download the repository from object storage into the cache, then exit "
                                            "(to bake the cache into an image, or as an init container)")
    _add_common(sync)
    sync.add_argument("--model", metavar="NAME", help="sync only this model")
    sync.add_argument("source", nargs="?", help="the repository's s3:// or oss:// URL (as --model-repository)")
    sync.add_argument("destination", nargs="?",
                      help="the cache folder (as --cache-dir); the repository lands in <destination>/repository. "
                           "`bootstrap sync SOURCE DESTINATION` is KServe's storage-initializer contract")
    check = commands.add_parser("check", help="load every model as `run` would, serve nothing, report and exit "
                                              "(0: every model version loads)")
    _add_common(check)
    check.add_argument("--device", choices=["auto", "gpu", "cpu"], help="where models load")
    check.add_argument("--disable-auto-complete-config", action="store_true",
                       help="use config.pbtxt as written, as `run --disable-auto-complete-config` does")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def _cache_size(text: str) -> int:
    """Triton's ``--cache-config local,size=N`` (the only cache implementation here is the local one)."""
    kind, _, setting = text.partition(",")
    key, _, value = setting.partition("=")
    if kind != "local" or key != "size" or not value.isdigit():
        raise SettingsError(f"--cache-config must be 'local,size=<bytes>', not '{text}'")
    return int(value)


def _settings(args: argparse.Namespace) -> FunctionSettings:
    config = args.config
    if config is None and Path("function.yaml").is_file():
        config = Path("function.yaml")
    settings = load_settings(config)
    if args.model_repository:
        repository = args.model_repository
        if is_remote(repository):
            try:
                parse_location(repository)
            except StorageError as exc:
                raise SettingsError(f"--model-repository: {exc}") from None
        settings.model_repository = repository if is_remote(repository) else str(Path(repository).resolve())
    if args.model_control_mode:
        settings.model_control = args.model_control_mode
    if args.poll_interval is not None:
        settings.poll_interval_seconds = args.poll_interval
    if args.load_model:
        settings.load_models = tuple(args.load_model)
    check_load_models(settings)
    if args.strict_readiness is not None:
        settings.strict_readiness = args.strict_readiness == "true"
    if args.disable_auto_complete_config:
        settings.auto_complete_config = False
    if args.shutdown_timeout is not None:
        if args.shutdown_timeout <= 0:
            raise SettingsError("--shutdown-timeout must be a positive number of seconds")
        settings.shutdown_timeout_seconds = args.shutdown_timeout
    if args.cache_dir:
        settings.cache_dir = str(Path(args.cache_dir).resolve())
    if args.cache_config is not None:
        settings.response_cache_bytes = _cache_size(args.cache_config)
    if args.frontend_processes is not None:
        value = args.frontend_processes
        settings.frontend_processes = frontend_process_count(int(value) if value.isdigit() else value)
    if args.response_cache_byte_size is not None:
        settings.response_cache_bytes = max(0, args.response_cache_byte_size)
    if args.model_load_thread_count is not None:
        if args.model_load_thread_count < 1:
            raise SettingsError("--model-load-thread-count must be at least 1")
        settings.model_load_thread_count = args.model_load_thread_count
    if args.http_restricted_api:
        settings.http_restricted_api = tuple(args.http_restricted_api)
    if args.grpc_restricted_protocol:
        settings.grpc_restricted_protocol = tuple(args.grpc_restricted_protocol)
    check_restrictions(settings)
    if args.rate_limit is not None:
        settings.rate_limit = args.rate_limit
    if args.rate_limit_resource:
        settings.rate_limit_resources = (*settings.rate_limit_resources, *args.rate_limit_resource)
    rate_limit_resources(settings)
    if args.trace_config:
        settings.trace_config = (*settings.trace_config, *args.trace_config)
    trace_settings(settings)
    if args.host:
        settings.host = args.host
    if args.http_port is not None:
        settings.http_port = args.http_port
    if args.grpc_port is not None:
        settings.grpc_port = args.grpc_port
    if args.metrics_port is not None:
        settings.metrics_port = args.metrics_port
    if args.no_metrics:
        settings.metrics_port = None
    if args.no_http:
        settings.http_port = None
    if args.no_grpc:
        settings.grpc_port = None
    if args.auth_token:
        settings.auth_token = args.auth_token
    if args.device:
        settings.device = args.device
    return settings


def _source(settings: FunctionSettings) -> ObjectStoreSource | None:
    if not settings.remote:
        return None
    from bootstrap.source import ObjectStoreSource

    return ObjectStoreSource(settings.model_repository, settings.storage, settings.cache_path(),
                             settings.cold_start_deadline_seconds)


def _server_options(settings: FunctionSettings, source: ObjectStoreSource | None) -> ServerOptions:
    from handlers import handler_class
    from handlers.auto_complete import complete_config
    from runtime.grpc.limits import GrpcLimits
    from runtime.http.server import HttpLimits
    from runtime.server import ServerOptions

    http_restrictions, grpc_restrictions = restrictions(settings)
    return ServerOptions(
        model_repository=settings.repository_path(),
        source=source,
        model_control=settings.model_control,
        startup_models=settings.load_models,
        model_load_concurrency=settings.model_load_thread_count,
        poll_interval=settings.poll_interval_seconds,
        idle_timeout=settings.idle_timeout_seconds,
        host=settings.host,
        http_port=settings.http_port,
        grpc_port=settings.grpc_port,
        metrics_port=settings.metrics_port,
        default_max_queue_size=settings.default_max_queue_size,
        sequence_slot_timeout=settings.sequence_slot_timeout_seconds,
        execute_timeout=settings.execute_timeout_seconds,
        use_gpu=settings.use_gpu,
        max_body_bytes=settings.max_request_bytes,
        grpc_max_message_bytes=settings.grpc_max_message_bytes,
        json_decode_budget=settings.json_decode_budget_bytes,
        http_limits=HttpLimits(
            header_timeout=settings.header_timeout_seconds,
            body_timeout=settings.body_timeout_seconds,
            max_connections=settings.max_connections,
            max_concurrent_streams=settings.max_streams_per_connection,
            send_timeout=settings.send_timeout_seconds,
            max_unsent_bytes=settings.max_unsent_response_bytes,
        ),
        grpc_limits=GrpcLimits(
            handshake_timeout=settings.header_timeout_seconds,
            stream_max_in_flight=settings.stream_max_in_flight,
            stream_max_bytes=settings.stream_max_bytes,
            streams_max_bytes=settings.streams_max_bytes,
        ),
        server_name=settings.server_name,
        strict_readiness=settings.strict_readiness,
        cache_size_bytes=settings.response_cache_bytes,
        frontend_processes=settings.frontend_processes,
        auto_complete_config=settings.auto_complete_config,
        auth_token=settings.auth_token,
        auth_exempt_health=settings.auth_exempt_health,
        http_restrictions=http_restrictions,
        grpc_restrictions=grpc_restrictions,
        shutdown_timeout=settings.shutdown_timeout_seconds,
        trace=trace_settings(settings),
        rate_limit_resources=rate_limit_resources(settings),
        handlers=handler_class,  # the composition root hands the core its backends
        completer=complete_config,
    )


async def _serve(settings: FunctionSettings) -> int:
    from runtime.server import Server

    options = _server_options(settings, _source(settings))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    where = settings.model_repository if settings.remote else options.model_repository
    logger.info("function '%s' serving repository %s (model control: %s)", settings.name, where,
                settings.model_control)
    return await Server(options).run(stop)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    # Options a command lacks take `run`'s defaults, so every command reads settings the same way.
    args = argparse.Namespace(**{**vars(parser.parse_args(["run"])), **vars(args)})
    if args.command == "sync":
        args.model_repository = args.source or args.model_repository
        args.cache_dir = args.destination or args.cache_dir
    try:
        settings = _settings(args)
    except SettingsError as exc:
        logger.error("invalid settings: %s", exc)
        return 2
    if args.command == "sync":
        return _sync(settings, args.model)
    if not settings.remote and not settings.repository_path().is_dir():
        logger.error("model repository %s is not a folder", settings.repository_path())
        return 2
    _start_worker_template(settings)
    if args.command == "check":
        return _check(settings, args.json)
    if settings.http_port is None and settings.grpc_port is None:
        logger.error("both HTTP and gRPC are disabled: nothing to serve")
        return 2
    _raise_open_file_limit(settings.max_connections)
    from runtime.allocator import tune_allocator

    tune_allocator()
    return _run(_serve(settings))


def _start_worker_template(settings: FunctionSettings) -> None:
    """Start the Python workers' template process now, in parallel with the server's own imports, when the
    repository may hold Python models (any object-storage repository; a local one with a model.py)."""
    if settings.remote or any(settings.repository_path().glob("*/[0-9]*/model.py")):
        from handlers.python.template import start_template

        start_template()


def _sync(settings: FunctionSettings, model: str | None) -> int:
    """``bootstrap sync``: the cold start's download, alone; exit 1 if any model failed to sync."""
    if not settings.remote:
        logger.error("model repository %s is a local folder: there is nothing to sync (give an s3:// or oss:// "
                     "URL in function.yaml or --model-repository)", settings.model_repository)
        return 2

    source = _source(settings)
    try:
        failures = source.refresh(model)
    except BootstrapError as exc:
        logger.error("sync failed: %s", exc)
        return 1
    source.prune()
    print(f"synced {settings.model_repository} into {source.repository_dir}"
          f"{f': {len(failures)} model(s) failed' if failures else ''}")
    for name, reason in sorted(failures.items()):
        print(f"FAIL {name}: {reason}")
    return 1 if failures else 0


def _check(settings: FunctionSettings, as_json: bool) -> int:
    """``bootstrap check``: exit 0 when every model version loads, 1 otherwise (the report says why)."""
    from bootstrap.check import check_repository, render_json, render_text

    options = _server_options(settings, source=_source(settings))
    options.model_control = "none"
    try:
        rows = _run(check_repository(options))
    except BootstrapError as exc:
        logger.error("check failed: %s", exc)
        return 1
    sys.stdout.write(render_json(rows) if as_json else render_text(rows))
    return 0 if rows and all(row.ok for row in rows) else 1


def _raise_open_file_limit(connections: int) -> None:
    """Lift the soft limit on open files to the hard one, so ``max_connections`` fit (with room for models)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, connections * 2 + 1024)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < connections + 256:
        logger.warning("the open-file limit (%d) is below server.max_connections (%d) plus room for models: "
                       "raise it (ulimit -n) or lower max_connections", soft, connections)


def _run(coroutine) -> int:
    """Run on uvloop when it is installed (lower per-request overhead), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    if os.environ.get("SERVERLESS_TRITON_LOOP", "uvloop") == "asyncio":
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


if __name__ == "__main__":
    sys.exit(main())
