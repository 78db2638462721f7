"""Large files sync as parallel ranged GETs from a real S3 endpoint (moto server): checked, resumable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from tests.conftest import S3_ENV
from tests.e2e.test_sync import VERSION_CONFIG, make_sync, put
from tests.support import ROOT, FaultyProxy

MIB = 1 << 20


def upload_model(s3, bucket: str, weights: bytes, multipart: bool) -> None:
    """A model whose weights are uploaded as `aws s3 cp` would: multipart (8 MiB parts) above 8 MiB."""
    put(s3, bucket, "repo/big/config.pbtxt", VERSION_CONFIG)
    put(s3, bucket, "repo/big/1/model.py", "# big\n")
    path = Path(f"/tmp/weights-{bucket}.bin")
    path.write_bytes(weights)
    try:
        threshold = 8 * MIB if multipart else 1 << 40
        s3.upload_file(str(path), bucket, "repo/big/1/weights.bin",
                       Config=TransferConfig(multipart_threshold=threshold, multipart_chunksize=8 * MIB))
    finally:
        path.unlink()


def ranges_requested(sync) -> list[str]:
    """Watch the ranged GETs a sync's own boto3 client sends (an observer on its event hooks)."""
    seen: list[str] = []

    def record(request, **_):
        if request.headers.get("Range"):
            seen.append(request.headers["Range"].decode() if isinstance(request.headers["Range"], bytes)
                        else request.headers["Range"])

    sync.client.meta.events.register("before-send.s3.GetObject", record)
    return seen


@pytest.mark.parametrize("multipart", [True, False], ids=["multipart-etag", "md5-etag"])
def test_a_large_file_downloads_in_parallel_parts_and_matches(s3, moto_endpoint, bucket, tmp_path, multipart):
    weights = os.urandom(26 * MIB + 12345)
    upload_model(s3, bucket, weights, multipart)
    etag = s3.head_object(Bucket=bucket, Key="repo/big/1/weights.bin")["ETag"]
    assert etag.endswith('-4"') if multipart else "-" not in etag
    sync = make_sync(moto_endpoint, bucket, tmp_path / "cache", ranged_threshold_bytes=4 * MIB,
                     ranged_part_bytes=4 * MIB)
    seen = ranges_requested(sync)
    report = sync.sync()["big"]
    assert not report.error, report.error
    assert (sync.repository_dir / "big" / "1" / "weights.bin").read_bytes() == weights
    part = 8 * MIB if multipart else 4 * MIB  # a multipart upload is read on its own part boundaries
    assert sorted(seen, key=lambda r: int(r[6:].split("-")[0])) == [
        f"bytes={start}-{min(start + part, len(weights)) - 1}" for start in range(0, len(weights), part)]
    assert not any((tmp_path / "cache" / "downloads").iterdir())
    again = make_sync(moto_endpoint, bucket, tmp_path / "cache", ranged_threshold_bytes=4 * MIB)
    assert again.sync()["big"].downloaded == 0  # a warm restart downloads nothing


@pytest.mark.parametrize("multipart", [True, False], ids=["multipart-etag", "md5-etag"])
def test_a_corrupted_part_fails_the_model_and_keeps_nothing(s3, moto_endpoint, bucket, tmp_path, multipart):
    upload_model(s3, bucket, os.urandom(17 * MIB), multipart)
    proxy = FaultyProxy(int(moto_endpoint.rsplit(":", 1)[1]))
    proxy.corrupt_at = 100_000  # a byte of every answer's body is flipped on the way
    try:
        sync = make_sync(f"http://127.0.0.1:{proxy.port}", bucket, tmp_path / "cache",
                         ranged_threshold_bytes=4 * MIB, ranged_part_bytes=4 * MIB)
        error = sync.sync()["big"].error
    finally:
        proxy.stop()
    assert "does not match its" in error and "weights.bin" in error
    assert not (sync.repository_dir / "big").exists()
    assert not any((tmp_path / "cache" / "downloads").iterdir())


def test_a_killed_sync_resumes_with_only_the_missing_parts(s3, moto_endpoint, bucket, tmp_path):
    weights = os.urandom(32 * MIB)
    upload_model(s3, bucket, weights, multipart=True)
    proxy = FaultyProxy(int(moto_endpoint.rsplit(":", 1)[1]))
    proxy.delay = 0.004  # about 16 MB/s: a part of 8 MiB takes half a second
    cache = tmp_path / "cache"
    config = tmp_path / "function.yaml"
    config.write_text(f"cache_dir: {cache}\nstorage: {{endpoint_url: 'http://127.0.0.1:{proxy.port}', "
                      "region: us-east-1, addressing_style: path, max_concurrency: 1, "
                      f"ranged_threshold_bytes: {4 * MIB}}}\n")
    process = subprocess.Popen([sys.executable, "-m", "bootstrap.cli", "sync", "--config", str(config),
                                "--model-repository", f"s3://{bucket}/repo"], cwd=ROOT, env={**os.environ, **S3_ENV},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any(p.suffix == ".parts" for p in (cache / "downloads").glob("*")) if (cache / "downloads").is_dir() \
                else True:
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)  # a pod killed mid-download
        process.wait()
    finally:
        proxy.stop()
    assert not (cache / "repository" / "big").exists()
    sync = make_sync(moto_endpoint, bucket, cache, ranged_threshold_bytes=4 * MIB)
    seen = ranges_requested(sync)
    assert not sync.sync()["big"].error
    assert (cache / "repository" / "big" / "1" / "weights.bin").read_bytes() == weights
    assert 1 <= len(seen) <= 3, seen  # of 4 parts, those already on disk were not fetched again
    assert not any((cache / "downloads").iterdir())


def test_staged_parts_of_an_object_that_changed_are_dropped(s3, moto_endpoint, bucket, tmp_path):
    upload_model(s3, bucket, os.urandom(9 * MIB), multipart=False)
    staging = tmp_path / "cache" / "downloads"
    staging.mkdir(parents=True)
    (staging / "0123456789abcdef0123456789abcdef.data").write_bytes(b"left by an older object")
    sync = make_sync(moto_endpoint, bucket, tmp_path / "cache", ranged_threshold_bytes=4 * MIB)
    assert not sync.sync()["big"].error
    assert not any(staging.iterdir())
