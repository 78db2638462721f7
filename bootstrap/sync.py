"""Sync a model repository from object storage into a local cache, only the versions each policy selects.

Layout of the cache (``<cache_dir>/repository`` is what the server loads)::

    repository/<model>                 -> .generations/<model>/<fingerprint>   (relative symlink)
    repository/.generations/<model>/<fingerprint>/...                          (complete copies)
    repository/.generations/<model>/<fingerprint>.partial-<id>/                (being written)

A generation is published (the symlink swapped atomically) only once every file is
downloaded, size- and ETag-checked, and its manifest written; a failed or interrupted
sync leaves the previous generation in place.  A warm restart whose objects match the
current generation's manifest downloads nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import queue
import shutil
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bootstrap.cache import CacheError, ensure_private_dir
from bootstrap.errors import BootstrapError
from bootstrap.ranged import RangedDownload, RangedDownloadError, is_plain_md5
from bootstrap.storage import (
    StorageError,
    StorageLocation,
    StorageSettings,
    StoredObject,
    describe_client_error,
    is_permanent_client_error,
    list_objects,
    make_client,
    unsafe_key_reason,
)
from runtime.config.layout import (
    CONFIG_FILE,
    CONFIG_OPTIONAL_MODEL_FILES,
    MAX_CONFIG_BYTES,
    is_model_folder_name,
    is_version_folder_name,
)
from runtime.errors import ModelLoadError

logger = logging.getLogger(__name__)

GENERATIONS = ".generations"
STAGING = "downloads"  # large files being downloaded in parts (kept across runs to resume)
MANIFEST = ".manifest.json"
_BODY_ATTEMPTS = 3
_CHUNK = 1 << 20


@dataclass
class ModelSyncReport:
    """What one model's sync did (logged at start-up, and read by tests)."""

    name: str
    listed: int = 0
    selected: int = 0
    downloaded: int = 0
    downloaded_bytes: int = 0
    reused: int = 0
    seconds: float = 0.0
    changed: bool = False
    error: str = ""

    def log_line(self) -> str:
        if self.error:
            return f"model '{self.name}': sync failed: {self.error}"
        return (
            f"model '{self.name}': listed {self.listed} objects, {self.selected} selected; downloaded "
            f"{self.downloaded} files ({self.downloaded_bytes} bytes) in {self.seconds:.2f}s, reused {self.reused}"
        )


class SyncError(BootstrapError):
    pass


class DaemonPool:
    """``submit`` as in ThreadPoolExecutor, on daemon threads: work abandoned at the sync deadline (a request
    to a storage endpoint that never answers) cannot hold up the process's exit, as executor threads would."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        for index in range(max_workers):
            threading.Thread(target=self._work, daemon=True, name=f"{name}-{index}").start()

    def _work(self) -> None:
        while True:
            future, function, args = self._tasks.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(function(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)

    def submit(self, function, *args) -> Future:
        future: Future = Future()
        self._tasks.put((future, function, args))
        return future


def _fingerprint(files: list[tuple[str, StoredObject]]) -> str:
    digest = hashlib.sha256()
    for relative, item in sorted(files, key=lambda f: f[0]):
        digest.update(f"{relative}\0{item.size}\0{item.etag}\n".encode())
    return digest.hexdigest()[:20]


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


class RepositorySync:
    """Mirrors ``location`` into ``cache_dir/repository``."""

    def __init__(
        self,
        location: StorageLocation,
        settings: StorageSettings,
        cache_dir: Path,
        deadline_seconds: float = 600.0,
    ) -> None:
        self.location = location
        self.settings = settings
        self.cache_dir = Path(cache_dir).resolve()
        self.repository_dir = self.cache_dir / "repository"
        self.generations_dir = self.repository_dir / GENERATIONS
        self.staging_dir = self.cache_dir / STAGING
        self.deadline_seconds = deadline_seconds
        self._client: Any = None  # made when first used: botocore's import and client cost 0.17 s
        self.on_listed: Callable[[list[StoredObject]], None] | None = None  # told each full listing, before downloads
        self._client_lock = threading.Lock()
        self._files = DaemonPool(settings.max_concurrency, "sync-file")
        self._models = DaemonPool(4, "sync-model")
        self._calls = DaemonPool(1, "sync-call")
        self._parts = DaemonPool(settings.max_concurrency, "sync-part")
        self._staged: set[str] = set()  # staging files this sync used (the others are stale)

    # -- public ----------------------------------------------------------------
    @property
    def client(self) -> Any:
        """The S3 client, made on first use; no single request may outlast the whole sync's deadline."""
        with self._client_lock:
            if self._client is None:
                settings, deadline = self.settings, self.deadline_seconds
                self._client = make_client(self.location, dataclasses.replace(
                    settings, connect_timeout_seconds=min(settings.connect_timeout_seconds, deadline),
                    read_timeout_seconds=min(settings.read_timeout_seconds, deadline)))
            return self._client

    def read_small(self, items: list[StoredObject], max_bytes: int) -> list[bytes]:
        """The content of each of ``items`` no larger than ``max_bytes`` (read apart from any sync, for a look
        ahead of it: what ``model.py`` imports); an object that cannot be read is left out."""
        from botocore.exceptions import BotoCoreError, ClientError

        def read(item: StoredObject) -> bytes | None:
            try:
                return self.client.get_object(Bucket=self.location.bucket, Key=item.key)["Body"].read(max_bytes)
            except (ClientError, BotoCoreError, OSError):
                return None

        reads = [self._files.submit(read, item) for item in items if item.size <= max_bytes]  # side by side
        deadline = time.monotonic() + self.deadline_seconds
        contents = []
        for future in reads:
            try:
                content = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                continue
            if content is not None:
                contents.append(content)
        return contents

    def sync(self, only: str | None = None) -> dict[str, ModelSyncReport]:
        """Sync every model (or just ``only``); per-model failures are reported, never raised.

        Raises SyncError if the cache cannot be trusted, StorageError if storage cannot be listed."""
        try:
            ensure_private_dir(self.cache_dir)
        except CacheError as exc:
            raise SyncError(str(exc)) from None
        self.repository_dir.mkdir(mode=0o700, exist_ok=True)
        self.generations_dir.mkdir(mode=0o700, exist_ok=True)
        self.staging_dir.mkdir(mode=0o700, exist_ok=True)
        self._drop_partials()
        self._drop_strays()
        deadline = time.monotonic() + self.deadline_seconds
        if only is None:
            self._staged = set()  # what this full sync stages; anything else in the staging folder is stale
        objects = self._within(deadline, "listing", list_objects, self.client, self.location)
        if self.on_listed is not None:
            self.on_listed(objects)
        by_model: dict[str, list[StoredObject]] = defaultdict(list)
        for item in objects:
            model, separator, rest = item.relative.partition("/")
            if not separator or not rest:
                continue  # a file beside the model folders (README, ...), or a model folder's placeholder
            if not is_model_folder_name(model):
                logger.warning("refused object key %r: not inside a valid model folder", item.key)
                continue
            by_model[model].append(item)
        names = [only] if only else sorted(by_model)
        futures = {n: self._models.submit(self._sync_model, n, by_model.get(n, []), deadline) for n in names}
        reports = {}
        for name, future in futures.items():
            try:
                reports[name] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                future.cancel()
                reports[name] = ModelSyncReport(name=name, error=self._late())
        if only is None:
            self._remove_deleted(set(by_model))
            self._drop_stale_staging()
        for report in reports.values():
            (logger.error if report.error else logger.info)("%s", report.log_line())
        return reports

    def model_names(self) -> list[str]:
        """The model folders in storage, listed only (nothing is downloaded): what on-demand loading offers."""
        deadline = time.monotonic() + self.deadline_seconds
        objects = self._within(deadline, "listing", list_objects, self.client, self.location)
        names = {item.relative.partition("/")[0] for item in objects if "/" in item.relative.strip("/")}
        return sorted(name for name in names if is_model_folder_name(name))

    def _late(self) -> str:
        return f"sync deadline of {self.deadline_seconds:g}s (storage.cold_start_deadline_seconds) exceeded"

    def _within(self, deadline: float, what: str, function, *args):
        """``function(*args)``, given up (StorageError) if it has not returned by ``deadline``."""
        try:
            return self._calls.submit(function, *args).result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            raise StorageError(f"{what} {self.location.url} did not finish: {self._late()}") from None

    def prune(self) -> None:
        """Delete generations no model link points at any more."""
        if not self.generations_dir.is_dir():
            return
        live = {self._current_generation(p.name) for p in self.repository_dir.iterdir() if p.is_symlink()}
        for model_dir in self.generations_dir.iterdir():
            for generation in model_dir.iterdir():
                if generation.resolve() not in live:
                    shutil.rmtree(generation, ignore_errors=True)

    # -- one model ---------------------------------------------------------------
    def _sync_model(self, name: str, objects: list[StoredObject], deadline: float) -> ModelSyncReport:
        report = ModelSyncReport(name=name, listed=len(objects))
        started = time.perf_counter()
        try:
            self._sync_model_files(name, objects, report, deadline)
        except (SyncError, StorageError, ModelLoadError, OSError) as exc:
            report.error = str(exc) if not isinstance(exc, OSError) else f"{type(exc).__name__}: {exc.strerror}"
        report.seconds = time.perf_counter() - started
        return report

    def _sync_model_files(self, name: str, objects: list[StoredObject], report: ModelSyncReport,
                          deadline: float) -> None:
        if not objects:
            raise SyncError(f"no objects under {self.location.url}{name}/")
        for item in objects:
            reason = unsafe_key_reason(item.relative)
            if reason:
                raise SyncError(f"refused object key {item.key!r}: {reason}")
        files = {item.relative.split("/", 1)[1]: item for item in objects}
        config = files.get(CONFIG_FILE)
        config_optional = any(r.count("/") == 1 and r.split("/", 1)[1] in CONFIG_OPTIONAL_MODEL_FILES for r in files)
        if config is None and not config_optional:
            raise SyncError(f"no {CONFIG_FILE} in storage")
        current = self._current_generation(name)
        manifest = self._manifest(current) if current else {}
        if config is None:  # a config-less Python or ONNX model (as in Triton): Triton's default version policy
            config_bytes, config_text = b"", ""
        else:
            config_bytes = self._config_bytes(config, current, manifest)
            try:
                config_text = config_bytes.decode("utf-8")
            except UnicodeDecodeError:
                raise SyncError(f"{CONFIG_FILE} is not UTF-8") from None
        from runtime.config.config_text import version_policy_of  # protobuf: after the listing, not before

        policy = version_policy_of(config_text, name)
        versions = sorted({int(r.split("/")[0]) for r in files if "/" in r and is_version_folder_name(r.split("/")[0])})
        selected = set(policy.select(versions))
        if not selected:
            raise SyncError(f"no version in storage matches its version_policy (in storage: {versions or 'none'})")
        chosen = [
            (relative, item) for relative, item in files.items()
            if not (is_version_folder_name(relative.split("/")[0]) and "/" in relative)
            or int(relative.split("/")[0]) in selected
        ]
        report.selected = len(chosen)
        fingerprint = _fingerprint(chosen)
        target = self.generations_dir / name / fingerprint
        if target.is_dir() and not _holds_exactly(target, self._manifest(target)):
            logger.warning("model '%s': the cached copy was changed outside the server: downloading it again", name)
            shutil.rmtree(target)
        if current is not None and current == target.resolve() and manifest and target.is_dir():
            report.reused = len(chosen)
            return
        if not (target / MANIFEST).is_file():
            self._build_generation(target, chosen, current, manifest, config_bytes, report, deadline)
        else:
            report.reused = len(chosen)
        self._publish(name, target)
        report.changed = True

    def _config_bytes(self, config: StoredObject, current: Path | None, manifest: dict) -> bytes:
        """The config's content: from the current generation when unchanged, else downloaded."""
        entry = manifest.get(CONFIG_FILE)
        if current is not None and entry and entry["etag"] == config.etag and entry["size"] == config.size:
            return (current / CONFIG_FILE).read_bytes()
        if config.size > MAX_CONFIG_BYTES:
            raise SyncError(f"{CONFIG_FILE} is larger than {MAX_CONFIG_BYTES} bytes")
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self.client.get_object(Bucket=self.location.bucket, Key=config.key)
            body = response["Body"].read(MAX_CONFIG_BYTES + 1)
        except (ClientError, BotoCoreError) as exc:
            raise SyncError(f"cannot download {CONFIG_FILE}: {describe_client_error(exc)}") from None
        if len(body) != config.size:
            raise SyncError(f"{CONFIG_FILE}: got {len(body)} bytes, expected {config.size}")
        return body

    def _build_generation(self, target: Path, chosen: list[tuple[str, StoredObject]], current: Path | None,
                          manifest: dict, config_bytes: bytes, report: ModelSyncReport, deadline: float) -> None:
        partial = target.with_name(f"{target.name}.partial-{uuid.uuid4().hex[:8]}")
        partial.mkdir(parents=True)
        futures = []
        records: dict[str, dict] = {}
        try:
            for relative, item in chosen:
                destination = partial / relative
                if relative.endswith("/"):  # a folder placeholder: a folder that may stay empty (a version's)
                    destination.mkdir(parents=True, exist_ok=True)
                    continue
                destination.parent.mkdir(parents=True, exist_ok=True)
                if not _inside(destination, partial):
                    raise SyncError(f"refused object key {item.key!r}: escapes the cache")
                previous = manifest.get(relative)
                old_file = current / relative if current is not None else None
                if (previous and old_file is not None and previous["etag"] == item.etag
                        and previous["size"] == item.size and old_file.is_file() and not old_file.is_symlink()
                        and current is not None and _inside(old_file, current)
                        and old_file.stat().st_size == item.size):
                    _link_or_copy(old_file, destination)
                    records[relative] = previous
                    report.reused += 1
                    continue
                if relative == CONFIG_FILE:  # already fetched and checked to parse it
                    _write_bytes_atomically(destination, config_bytes)
                    records[relative] = {"size": len(config_bytes), "etag": item.etag,
                                         "sha256": hashlib.sha256(config_bytes).hexdigest()}
                    report.downloaded += 1
                    report.downloaded_bytes += len(config_bytes)
                    continue
                futures.append((relative, self._files.submit(self._download, item, destination, deadline)))
            for relative, future in futures:
                records[relative] = future.result()
                report.downloaded += 1
                report.downloaded_bytes += records[relative]["size"]
            _write_json_atomically(partial / MANIFEST, records)
            os.replace(partial, target)
        except BaseException:
            for _, future in futures:
                future.cancel()
            shutil.rmtree(partial, ignore_errors=True)
            raise

    def _download(self, item: StoredObject, destination: Path, deadline: float) -> dict:
        """Download one object to a temp file beside ``destination`` (or in parts, if large), check it,
        rename it."""
        if item.size >= self.settings.ranged_threshold_bytes:
            return self._download_ranged(item, destination, deadline)
        from botocore.exceptions import BotoCoreError, ClientError

        last_error = ""
        for _ in range(_BODY_ATTEMPTS):
            if time.monotonic() > deadline:
                raise SyncError(self._late())
            temp = destination.with_name(f".{destination.name}.part-{uuid.uuid4().hex[:8]}")
            try:
                arguments = {"Bucket": self.location.bucket, "Key": item.key}
                if item.etag:
                    arguments["IfMatch"] = f'"{item.etag}"'
                response = self.client.get_object(**arguments)
                sha256, md5, written = hashlib.sha256(), hashlib.md5(), 0
                with open(temp, "wb") as handle:
                    for chunk in response["Body"].iter_chunks(_CHUNK):
                        handle.write(chunk)
                        sha256.update(chunk)
                        md5.update(chunk)
                        written += len(chunk)
                    handle.flush()
                    os.fsync(handle.fileno())
                if written != item.size:
                    raise SyncError(f"{item.key!r}: got {written} bytes, expected {item.size}")
                if is_plain_md5(item.etag) and md5.hexdigest() != item.etag:
                    raise SyncError(f"{item.key!r}: content does not match its ETag")
                os.replace(temp, destination)
                return {"size": written, "etag": item.etag, "sha256": sha256.hexdigest()}
            except ClientError as exc:
                last_error = describe_client_error(exc)
                if is_permanent_client_error(exc):
                    break  # not transient
            except (BotoCoreError, SyncError, OSError) as exc:
                if isinstance(exc, OSError) and exc.errno is not None and not isinstance(exc, ConnectionError):
                    last_error = f"{type(exc).__name__}: {exc.strerror}"
                    break  # disk errors (ENOSPC, EACCES) do not get better by retrying
                last_error = str(exc) if isinstance(exc, SyncError) else describe_client_error(exc)
            finally:
                if temp.exists():
                    temp.unlink()
        raise SyncError(f"cannot download {item.key!r}: {last_error}")

    def _download_ranged(self, item: StoredObject, destination: Path, deadline: float) -> dict:
        download = RangedDownload(self.client, self.location.bucket, item, self.staging_dir,
                                  self.settings.ranged_part_bytes, self._parts.submit, deadline, self._late)
        self._staged.update({download.data_path.name, download.progress.path.name})
        try:
            path, record = download.run()
        except RangedDownloadError as exc:
            if exc.permanent:
                download.discard()
            raise SyncError(str(exc)) from None  # otherwise the parts on disk stay, for the next sync to resume
        except FutureTimeout:
            raise SyncError(self._late()) from None
        os.replace(path, destination)
        download.discard()
        return record

    def _drop_stale_staging(self) -> None:
        """Staged parts of objects this sync did not want (changed or deleted since) are dropped."""
        for entry in self.staging_dir.iterdir():
            if entry.name not in self._staged:
                entry.unlink(missing_ok=True)

    # -- cache bookkeeping ---------------------------------------------------------
    def _current_generation(self, name: str) -> Path | None:
        link = self.repository_dir / name
        if not link.is_symlink():
            return None
        target = link.resolve()
        if not target.is_relative_to((self.generations_dir / name).resolve()) or not target.is_dir():
            return None
        return target

    def _manifest(self, generation: Path) -> dict:
        try:
            data = json.loads((generation / MANIFEST).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _publish(self, name: str, target: Path) -> None:
        link = self.repository_dir / name
        temp = self.repository_dir / f".{name}.link-{uuid.uuid4().hex[:8]}"
        os.symlink(os.path.relpath(target, self.repository_dir), temp)
        if link.exists() and not link.is_symlink():
            shutil.rmtree(link)  # a stray folder in our cache
        os.replace(temp, link)

    def _remove_deleted(self, present: set[str]) -> None:
        for entry in self.repository_dir.iterdir():
            if entry.is_symlink() and not entry.name.startswith(".") and entry.name not in present:
                entry.unlink()
                logger.info("model '%s' is no longer in storage: removed from the cache", entry.name)

    def _drop_strays(self) -> None:
        """Remove what a sync did not publish (a folder or file planted in the repository, a link pointing
        anywhere but our generations): only models that came from storage are served."""
        for entry in self.repository_dir.iterdir():
            if entry.name.startswith("."):
                continue
            if entry.is_symlink() and self._current_generation(entry.name) is not None:
                continue
            logger.warning("'%s' in the cache did not come from storage: removed, never served", entry.name)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def _drop_partials(self) -> None:
        for model_dir in self.generations_dir.iterdir():
            for generation in model_dir.glob("*.partial-*"):
                shutil.rmtree(generation, ignore_errors=True)
        for temp in self.repository_dir.glob(".*.link-*"):
            temp.unlink(missing_ok=True)


def _holds_exactly(generation: Path, manifest: dict) -> bool:
    """Whether a generation folder holds its manifest's files, with their sizes, and nothing else."""
    if not manifest:
        return False
    found = {}
    for path in generation.rglob("*"):
        if path.is_symlink():
            return False
        if path.is_file() and path.name != MANIFEST and "__pycache__" not in path.parts:
            found[path.relative_to(generation).as_posix()] = path.stat().st_size
    return found == {relative: entry.get("size") for relative, entry in manifest.items()}


def _link_or_copy(source: Path, destination: Path) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def _write_bytes_atomically(path: Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.part-{uuid.uuid4().hex[:8]}")
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def _write_json_atomically(path: Path, data: dict) -> None:
    _write_bytes_atomically(path, json.dumps(data, sort_keys=True).encode())
