"""Only what came from object storage is served from the cache, the cache is private, and the cold-start
deadline bounds the whole sync, listing included."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
import time
from pathlib import Path

import httpx
import pytest

from bootstrap.cache import CacheError, default_cache_dir, ensure_private_dir
from bootstrap.storage import StorageError
from bootstrap.sync import RepositorySync, SyncError
from runtime.models.repository import ModelRepository
from tests.conftest import S3_ENV
from tests.e2e.test_sync import files_under, make_sync, upload_versioned
from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, python_model_source

IDENTITY = python_model_source("return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', "
                               "pb_utils.get_input_tensor_by_name(r, 'IN').as_numpy())]) for r in requests]")


def plant(repository_dir: Path, marker: Path) -> None:
    """A model folder nobody uploaded, whose model.py leaves a marker when it is imported."""
    evil = repository_dir / "planted"
    (evil / "1").mkdir(parents=True)
    (evil / "config.pbtxt").write_text(IDENTITY_PYTHON_CONFIG)
    (evil / "1" / "model.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n" + IDENTITY)


def test_a_folder_planted_in_the_cache_is_removed_and_never_served(s3, moto_endpoint, bucket, tmp_path):
    upload_versioned(s3, bucket, "good", "", [1])
    marker = tmp_path / "planted-ran"
    sync = make_sync(moto_endpoint, bucket, tmp_path / "cache")
    sync.sync()
    plant(sync.repository_dir, marker)
    (sync.repository_dir / "stray.txt").write_text("x")
    (sync.repository_dir / "elsewhere").symlink_to(tmp_path)
    sync.sync()
    assert ModelRepository(sync.repository_dir).model_names() == ["good"]
    assert sorted(p.name for p in sync.repository_dir.iterdir() if not p.name.startswith(".")) == ["good"]


def test_a_planted_model_never_runs_in_the_server(s3, moto_endpoint, bucket, tmp_path):
    (tmp_path / "local").mkdir()
    s3.put_object(Bucket=bucket, Key="repo/echo/config.pbtxt", Body=IDENTITY_PYTHON_CONFIG.encode())
    s3.put_object(Bucket=bucket, Key="repo/echo/1/model.py", Body=IDENTITY.encode())
    cache = tmp_path / "cache"
    marker = tmp_path / "planted-ran"
    ensure_private_dir(cache)
    plant(cache / "repository", marker)
    config = tmp_path / "function.yaml"
    config.write_text(f"cache_dir: {cache}\nstorage: {{endpoint_url: '{moto_endpoint}', region: us-east-1, "
                      "addressing_style: path}\n")
    process = ServerProcess(Path("unused"), "--config", str(config), env=S3_ENV, log=tmp_path / "server.log")
    process.with_repository_url(f"s3://{bucket}/repo").start()
    try:
        index = httpx.post(f"http://{process.http_url}/v2/repository/index").json()
        assert [row["name"] for row in index] == ["echo"]
        assert not marker.exists()
        assert "'planted' in the cache did not come from storage: removed, never served" in process.log()
    finally:
        assert process.stop() == 0


def test_a_published_copy_changed_outside_the_server_is_downloaded_again(s3, moto_endpoint, bucket, tmp_path):
    upload_versioned(s3, bucket, "model", "", [1])
    make_sync(moto_endpoint, bucket, tmp_path / "cache").sync()
    published = (tmp_path / "cache" / "repository" / "model").resolve()
    (published / "1" / "extra.py").write_text("import os\n")
    (published / "1" / "weights.bin").write_bytes(b"tampered")
    report = make_sync(moto_endpoint, bucket, tmp_path / "cache").sync()["model"]
    assert not report.error and report.downloaded == 3
    assert files_under(tmp_path / "cache" / "repository" / "model") == {"config.pbtxt", "1/model.py",
                                                                         "1/weights.bin"}


def test_a_cache_folder_others_can_write_is_refused(moto_endpoint, bucket, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    with pytest.raises(SyncError, match="writable by other users"):
        make_sync(moto_endpoint, bucket, cache).sync()


@pytest.mark.skipif(os.getuid() != 0, reason="changing a folder's owner needs root")
def test_a_cache_folder_owned_by_another_user_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 4242, 4242)
    with pytest.raises(CacheError, match="belongs to uid 4242"):
        ensure_private_dir(cache)


def test_the_cache_is_created_private_and_defaults_outside_tmp(tmp_path, monkeypatch):
    cache = tmp_path / "new" / "cache"
    ensure_private_dir(cache)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == str(tmp_path / ".cache" / "serverless-triton")
    monkeypatch.setenv("HOME", "/")
    assert default_cache_dir().endswith(f"serverless-triton-{os.getuid()}")


class BlackHole:
    """A TCP endpoint that accepts connections and never answers."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.held: list[socket.socket] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.server.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._accepting.join(5)
        self.server.close()
        for connection in self.held:
            connection.close()


def test_the_deadline_bounds_listing(tmp_path):
    hole = BlackHole()
    try:
        from bootstrap.storage import StorageLocation, StorageSettings

        settings = StorageSettings(endpoint_url=f"http://127.0.0.1:{hole.port}", region="us-east-1",
                                   addressing_style="path")
        sync = RepositorySync(StorageLocation("s3", "bucket", "repo/"), settings, tmp_path / "cache",
                              deadline_seconds=2.0)
        started = time.monotonic()
        with pytest.raises(StorageError, match="did not finish: sync deadline of 2s"):
            sync.sync()
        assert time.monotonic() - started < 3.0
    finally:
        hole.close()


def test_an_unresponsive_endpoint_fails_the_cold_start_within_the_deadline(tmp_path):
    hole = BlackHole()
    try:
        config = tmp_path / "function.yaml"
        config.write_text(f"cache_dir: {tmp_path / 'cache'}\nstorage: {{endpoint_url: 'http://127.0.0.1:{hole.port}',"
                          " region: us-east-1, addressing_style: path, cold_start_deadline_seconds: 3}\n")
        process = ServerProcess(Path("unused"), "--config", str(config), env=S3_ENV, log=tmp_path / "server.log")
        started = time.monotonic()
        process.with_repository_url("s3://bucket/repo").start(wait_ready=False)
        assert process.process.wait(30) == 1
        assert time.monotonic() - started < 3.0 + 4.0  # the deadline, plus the process's own start
        assert "did not finish: sync deadline of 3s" in process.log()
    finally:
        hole.close()
