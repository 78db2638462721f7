"""``bootstrap run | sync | check``: the function's entry point.

Only what parsing arguments and settings needs is imported at the top: each command imports its own stack when
it runs, and a Python-backend worker process (which imports this module as its parent's ``__main__``) pays for
none of it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bootstrap.cache import temp_folder_in_cache
from bootstrap.errors import BootstrapError
from bootstrap.hand_off import hand_off
from bootstrap.settings import SETTINGS_CLASSES, FunctionSettings, SettingsError, apply_settings_flags, load_settings
from bootstrap.settings_meaning import (
    histogram_latencies,
    openai_options,
    rate_limit_resources,
    restriction_secrets,
    restrictions,
    serves_single_port,
    trace_settings,
)
from bootstrap.settings_schema import add_flags
from handlers.onnx.environment import quiet_onnxruntime
from runtime.extensions.log_settings import redact_secrets, storage_secrets
from runtime.openblas_threads import short_openblas_spin
from runtime.startup_gc import pause_collection

if TYPE_CHECKING:
    from bootstrap.early_sync import EarlySync
    from bootstrap.source import ObjectStoreSource
    from runtime.server import ServerOptions

logger = logging.getLogger("bootstrap")
Result = TypeVar("Result")


COMMANDS = ("run", "sync", "check")


def _add_common(parser: argparse.ArgumentParser, command: str, flags: bool) -> None:
    """Options every command reads (where settings are, how much to log), and, where ``flags``, the command's
    setting flags."""
    parser.add_argument("--config", type=Path, default=None, help="function.yaml (default: ./function.yaml)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")
    if flags:
        add_flags(parser, command, SETTINGS_CLASSES)


def main_parser(commands: Iterable[str] = COMMANDS) -> argparse.ArgumentParser:
    """The command line; only ``commands`` get their setting flags (each command's hundred or so: a few
    milliseconds of a start for the commands not run)."""
    with_flags = set(commands)
    parser = argparse.ArgumentParser(prog="bootstrap", description="Serverless Triton-compatible runtime")
    subparsers = parser.add_subparsers(dest="command", required=True)
    run = subparsers.add_parser("run", help="serve the model repository until SIGINT/SIGTERM")
    _add_common(run, "run", "run" in with_flags)
    run.add_argument("--model-namespacing", choices=["true", "false"],
                     help="Triton's flag, accepted: with one model repository, names cannot collide")
    sync = subparsers.add_parser("sync", help="download the repository from object storage into the cache, then "
                                              "exit (to bake the cache into an image, or as an init container)")
    _add_common(sync, "sync", "sync" in with_flags)
    sync.add_argument("--model", metavar="NAME", help="sync only this model")
    sync.add_argument("source", nargs="?", help="the repository's s3:// or oss:// URL (as --model-repository)")
    sync.add_argument("destination", nargs="?",
                      help="the cache folder (as --cache-dir); the repository lands in <destination>/repository. "
                           "`bootstrap sync SOURCE DESTINATION` is KServe's storage-initializer contract")
    check = subparsers.add_parser("check", help="load every model as `run` would, serve nothing, report and exit "
                                                "(0: every model version loads)")
    _add_common(check, "check", "check" in with_flags)
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def _settings(args: argparse.Namespace) -> FunctionSettings:
    """function.yaml (./function.yaml unless --config names one), then the flags over it."""
    config = args.config
    if config is None and Path("function.yaml").is_file():
        config = Path("function.yaml")
    settings = load_settings(config)
    apply_settings_flags(settings, args)
    return settings


def _source(settings: FunctionSettings) -> ObjectStoreSource | None:
    if not settings.remote:
        return None
    from bootstrap.source import ObjectStoreSource

    return ObjectStoreSource(settings.model_repository, settings.storage, settings.cache_path(),
                             settings.cold_start_deadline_seconds)


def _first_refresh(settings: FunctionSettings, tell: Callable[[object], None]) -> dict[str, str]:
    """The early sync's child (bootstrap/early_sync.py): the first full refresh, as the server's own would be; once
    listed, it tells what the listing shows (bootstrap/listing_note.py), read ahead of the download."""
    from bootstrap.listing_note import listing_note

    source = _source(settings)
    assert source is not None  # only a remote repository is synced early
    sync = source.sync

    def frameworks(sources: list[str]) -> list[str]:
        from handlers.python.template import frameworks_imported  # where a Python model is listed only

        return frameworks_imported(sources)

    def listed(objects: list) -> None:
        tell(listing_note(objects, lambda models: _decoded(sync.read_small(models, MODEL_SOURCE_BYTES)), frameworks))

    sync.on_listed = listed
    return source.refresh()


def _server_options(settings: FunctionSettings, source: ObjectStoreSource | None) -> ServerOptions:
    from handlers import handler_class
    from handlers.auto_complete import complete_config
    from runtime.adapter_settings import AdapterSettings
    from runtime.grpc.limits import GrpcLimits
    from runtime.http.limits import HttpLimits
    from runtime.models.on_demand import OnDemandSettings
    from runtime.server import ServerOptions

    http_restrictions, grpc_restrictions = restrictions(settings)
    openai = openai_options(settings)
    if openai.restrictions:
        logger.info("OpenAI API restrictions enabled: %s", openai.restrictions.summary())  # header names only
    single_port = serves_single_port(settings) and settings.http_port is not None
    environments_dir = settings.cache_path() / "python-environments"  # made when a model first needs it
    if settings.grpc_infer_thread_count is not None:
        logger.info("--grpc-infer-thread-count is accepted as Triton's flag and has no effect "
                    "here: the native gRPC edge has no completion-queue handler threads")
    # each record from the settings declared into it (bootstrap/hand_off.py), and what comes from elsewhere
    adapters = hand_off(
        settings, "adapters", AdapterSettings,
        grpc_port=None if single_port else settings.grpc_port, single_port=single_port, openai=openai,
        http_limits=hand_off(settings, "http", HttpLimits), grpc_limits=hand_off(settings, "grpc", GrpcLimits),
        http_restrictions=http_restrictions, grpc_restrictions=grpc_restrictions)
    return hand_off(
        settings, "server", ServerOptions,
        model_repository=settings.repository_path(), source=source,
        on_demand=hand_off(settings, "on_demand", OnDemandSettings), adapters=adapters,
        metrics_histograms=histogram_latencies(settings), use_gpu=settings.use_gpu, trace=trace_settings(settings),
        rate_limit_resources=rate_limit_resources(settings),
        handlers=handler_class,  # the composition root hands the core its backends
        completer=partial(complete_config, environments_dir=environments_dir), environments_dir=environments_dir)


async def _serve(settings: FunctionSettings, source: ObjectStoreSource | None) -> int:
    import asyncio

    from runtime.server import Server

    options = _server_options(settings, source)
    early = source.early if source is not None else None
    if early is not None:  # the template and the backends, once the listing shows what the repository holds
        threading.Thread(target=_prepare_when_listed, args=(settings, early), daemon=True,
                         name="prepare-when-listed").start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    where = settings.model_repository if settings.remote else options.model_repository
    logger.info("function '%s' serving repository %s (model control: %s)", settings.name, where,
                settings.model_control)
    return await Server(options).run(stop)


def main(argv: list[str] | None = None) -> int:
    quiet_onnxruntime()  # before any process starts, so that every worker inherits it too
    short_openblas_spin()  # before numpy's import, here and in every worker
    given = sys.argv[1:] if argv is None else argv
    # the command given, and `run`, whose defaults every command reads (below); no command: each one's (--help)
    parser = main_parser({given[0], "run"} if given and given[0] in COMMANDS else COMMANDS)
    args = parser.parse_args(given)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    # Options a command lacks take `run`'s defaults, so every command reads settings the same way.
    args = argparse.Namespace(**{**vars(parser.parse_args(["run"])), **vars(args)})
    if args.command == "sync":
        args.flag_model_repository = args.source or args.flag_model_repository
        args.flag_cache_dir = str(Path(args.destination).resolve()) if args.destination else args.flag_cache_dir
    try:
        settings = _settings(args)
    except SettingsError as exc:
        logger.error("invalid settings: %s", exc)
        return 2
    # no credential reaches the log, at any level (nor a restricted API's header value)
    redact_secrets([settings.auth_token or "", *storage_secrets(), *restriction_secrets(settings)])
    if args.command == "sync":
        return _sync(settings, args.model)
    if not settings.remote and not settings.repository_path().is_dir():
        logger.error("model repository %s is not a folder", settings.repository_path())
        return 2
    if args.command == "check":
        _start_worker_template(settings)
        return _check(settings, args.json)
    if settings.http_port is None and settings.grpc_port is None:
        logger.error("both HTTP and gRPC are disabled: nothing to serve")
        return 2
    moved = temp_folder_in_cache(Path(settings.cache_dir).expanduser())
    if moved is not None:
        logger.info("no writable temp folder on this file system: temp files go to %s", moved)
    early = None
    if settings.remote and settings.model_control in ("none", "poll"):  # their first refresh is a full one
        from bootstrap.early_sync import start_early_sync

        # forked before any thread starts, and before the sync's own imports: the download goes on beside them
        early = start_early_sync(partial(_first_refresh, settings))
    source = _source(settings)
    if source is not None:
        source.early = early
    if early is None:
        _start_worker_template(settings)  # else once the early sync has told what the repository holds
    _raise_open_file_limit(settings.max_connections)
    pause_collection()  # after the early sync's fork; the server resumes it once the cold start is over
    from runtime.allocator import tune_allocator

    tune_allocator()
    return _run(_serve(settings, source))


def _start_worker_template(settings: FunctionSettings, frameworks: list[str] | None = None) -> None:
    """Start the Python workers' template process now, in parallel with the server's own imports, when the
    repository may hold Python models (any object-storage repository; a local one with a model.py), with the heavy
    frameworks the models import (``frameworks`` where already known; a local repository's are read here)."""
    models = [] if settings.remote else list(settings.repository_path().glob("*/[0-9]*/model.py"))
    if settings.remote or models:
        from handlers.python.template import frameworks_imported, start_template, workers_skip_the_entry_script

        if frameworks is None:
            frameworks = frameworks_imported(_model_sources(models))
        workers_skip_the_entry_script()  # `bootstrap` imports the whole command line
        start_template(frameworks=frameworks)
        # The backend's server side, imported now rather than by the first load, where it would share the
        # interpreter with the protocol stacks' imports (runtime/server.py) and ask the template for a worker later.
        import handlers.python.backend  # noqa: F401


MODEL_SOURCE_BYTES = 1 << 20  # what is read of a model.py for its imports


def _model_sources(paths: list[Path]) -> list[str]:
    """The first MODEL_SOURCE_BYTES of each readable file, as text."""
    contents = []
    for path in paths:
        try:
            with open(path, "rb") as source:
                contents.append(source.read(MODEL_SOURCE_BYTES))
        except OSError:
            continue
    return _decoded(contents)


def _decoded(contents: list[bytes]) -> list[str]:
    return [content.decode("utf-8", "replace") for content in contents]


def _prepare_when_listed(settings: FunctionSettings, early: EarlySync) -> None:
    """Once the early sync has listed the repository: the workers' template, unless no ``.py`` file is there (an
    ONNX repository's cold start keeps its cores), with the frameworks its models import; and the backends the
    listed model files suggest, imported while the download goes on."""
    from bootstrap.listing_note import ListingNote
    from handlers import import_ahead

    note = early.wait_note()
    if not isinstance(note, ListingNote):  # the child ended without telling: a Python model may be there
        _start_worker_template(settings, None)
        return
    if note.python_models:
        _start_worker_template(settings, list(note.frameworks))
    for backend in note.backends:
        import_ahead(backend)


def _sync(settings: FunctionSettings, model: str | None) -> int:
    """``bootstrap sync``: the cold start's download, alone; exit 1 if any model failed to sync."""
    if not settings.remote:
        logger.error("model repository %s is a local folder: there is nothing to sync (give an s3:// or oss:// "
                     "URL in function.yaml or --model-repository)", settings.model_repository)
        return 2

    source = _source(settings)
    assert source is not None  # a remote repository has one
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


def _run(coroutine: Coroutine[Any, Any, Result]) -> Result:
    """Run on uvloop when it is installed (lower per-request overhead), else on asyncio's loop (imported here, after
    the cold start's early fork: the download's child has no use for it)."""
    import asyncio

    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    if os.environ.get("SERVERLESS_TRITON_LOOP", "uvloop") == "asyncio":
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


if __name__ == "__main__":
    sys.exit(main())
