"""Syncing a repository from a real S3 endpoint (moto server mode) through boto3."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootstrap.storage import StorageLocation, StorageSettings, parse_location, unsafe_key_reason
from bootstrap.sync import GENERATIONS, RepositorySync
from tests.support import FaultyProxy

VERSION_CONFIG = """backend: "python"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def put(s3, bucket: str, key: str, body: bytes | str) -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=body.encode() if isinstance(body, str) else body)


def upload_versioned(s3, bucket: str, model: str, policy: str, versions: list[int], prefix: str = "repo/") -> None:
    put(s3, bucket, f"{prefix}{model}/config.pbtxt", VERSION_CONFIG + policy)
    for version in versions:
        put(s3, bucket, f"{prefix}{model}/{version}/model.py", f"# version {version}\n")
        put(s3, bucket, f"{prefix}{model}/{version}/weights.bin", os.urandom(1000 + version))


def make_sync(endpoint: str, bucket: str, cache: Path, prefix: str = "repo/", **settings) -> RepositorySync:
    storage = StorageSettings(endpoint_url=endpoint, region="us-east-1", addressing_style="path", **settings)
    return RepositorySync(StorageLocation("s3", bucket, prefix), storage, cache)


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and ".manifest" not in p.name}


@pytest.fixture
def repository(s3, bucket):
    upload_versioned(s3, bucket, "latest_two", "version_policy: { latest { num_versions: 2 } }\n", [1, 2, 3])
    upload_versioned(s3, bucket, "specific", "version_policy: { specific { versions: [ 1 ] } }\n", [1, 2])
    upload_versioned(s3, bucket, "every", "version_policy: { all { } }\n", [1, 2])
    upload_versioned(s3, bucket, "newest", "", [4, 10])
    put(s3, bucket, "repo/every/labels.txt", "a\nb\n")
    put(s3, bucket, "repo/README.md", "not a model")
    return bucket


def test_sync_downloads_only_the_selected_versions(moto_endpoint, repository, tmp_path):
    sync = make_sync(moto_endpoint, repository, tmp_path / "cache")
    reports = sync.sync()
    root = sync.repository_dir
    assert files_under(root / "latest_two") == {"config.pbtxt", "2/model.py", "2/weights.bin", "3/model.py",
                                                 "3/weights.bin"}
    assert files_under(root / "specific") == {"config.pbtxt", "1/model.py", "1/weights.bin"}
    assert files_under(root / "every") == {"config.pbtxt", "labels.txt", "1/model.py", "1/weights.bin",
                                           "2/model.py", "2/weights.bin"}
    assert files_under(root / "newest") == {"config.pbtxt", "10/model.py", "10/weights.bin"}
    assert sorted(reports) == ["every", "latest_two", "newest", "specific"]
    assert reports["latest_two"].listed == 7
    assert reports["latest_two"].selected == 5
    assert reports["latest_two"].downloaded == 5
    assert all(not r.error for r in reports.values())
    assert (root / "latest_two" / "3" / "weights.bin").stat().st_size == 1003
    assert not list(root.rglob("*.part-*"))


def test_warm_restart_downloads_nothing(moto_endpoint, repository, tmp_path):
    make_sync(moto_endpoint, repository, tmp_path / "cache").sync()
    again = make_sync(moto_endpoint, repository, tmp_path / "cache").sync()
    assert all(r.downloaded == 0 and r.reused == r.selected and not r.changed for r in again.values())
    assert "downloaded 0 files (0 bytes)" in again["every"].log_line()


def test_changed_object_downloads_only_itself(s3, moto_endpoint, repository, tmp_path):
    sync = make_sync(moto_endpoint, repository, tmp_path / "cache")
    sync.sync()
    old_generation = (sync.repository_dir / "every").resolve()
    put(s3, repository, "repo/every/2/weights.bin", b"new weights")
    report = make_sync(moto_endpoint, repository, tmp_path / "cache").sync()["every"]
    assert report.changed
    assert report.downloaded == 1 and report.reused == 5
    assert (sync.repository_dir / "every" / "2" / "weights.bin").read_bytes() == b"new weights"
    assert (sync.repository_dir / "every").resolve() != old_generation
    sync.prune()
    assert not old_generation.exists()


def test_new_version_under_latest_policy(s3, moto_endpoint, repository, tmp_path):
    sync = make_sync(moto_endpoint, repository, tmp_path / "cache")
    sync.sync()
    upload_versioned(s3, repository, "newest", "", [11])
    report = sync.sync(only="newest")["newest"]
    assert report.changed and report.downloaded == 2  # only version 11's files: the config is reused
    assert files_under(sync.repository_dir / "newest") == {"config.pbtxt", "11/model.py", "11/weights.bin"}


@pytest.mark.parametrize(
    "key, reason",
    [
        ("repo/evil/../../escaped.txt", "'..' path segment"),
        ("repo/evil/1/..\\..\\escaped.txt", "backslash"),
        ("repo/evil/1/\x01bell", "control character"),
        ("repo/evil//escaped.txt", "empty"),
    ],
)
def test_malicious_keys_are_refused_and_the_model_fails_closed(s3, moto_endpoint, bucket, tmp_path, key, reason):
    upload_versioned(s3, bucket, "evil", "", [1])
    upload_versioned(s3, bucket, "good", "", [1])
    put(s3, bucket, key, "pwned")
    cache = tmp_path / "deep" / "cache"
    sync = make_sync(moto_endpoint, bucket, cache)
    reports = sync.sync()
    assert reason in reports["evil"].error
    assert "refused object key" in reports["evil"].error
    assert not (sync.repository_dir / "evil").exists()
    assert files_under(sync.repository_dir / "good") == {"config.pbtxt", "1/model.py", "1/weights.bin"}
    assert not list(tmp_path.rglob("escaped.txt"))
    assert not list(tmp_path.rglob("*bell*"))


def test_keys_outside_model_folders_are_ignored(s3, moto_endpoint, bucket, tmp_path):
    upload_versioned(s3, bucket, "good", "", [1])
    for key in ("repo//abs/1/x", "repo/./y/1/x", "repo/../z/1/x", "repo/.hidden/1/x"):
        put(s3, bucket, key, "x")
    reports = make_sync(moto_endpoint, bucket, tmp_path / "cache").sync()
    assert sorted(reports) == ["good"]
    assert not list(tmp_path.rglob("x"))


def test_a_symlink_planted_in_the_cache_is_not_followed(s3, moto_endpoint, bucket, tmp_path):
    upload_versioned(s3, bucket, "model", "", [1])
    outside = tmp_path / "outside"
    outside.mkdir()
    repository_dir = tmp_path / "cache" / "repository"
    repository_dir.mkdir(parents=True)
    (repository_dir / "model").symlink_to(outside)
    sync = make_sync(moto_endpoint, bucket, tmp_path / "cache")
    report = sync.sync()["model"]
    assert not report.error
    assert list(outside.iterdir()) == []
    assert (sync.repository_dir / "model").resolve().is_relative_to(sync.repository_dir / GENERATIONS)


def test_interrupted_download_keeps_the_previous_good_state(s3, moto_endpoint, bucket, tmp_path):
    upload_versioned(s3, bucket, "model", "", [1])
    port = int(moto_endpoint.rsplit(":", 1)[1])
    proxy = FaultyProxy(port)
    try:
        endpoint = f"http://127.0.0.1:{proxy.port}"
        sync = make_sync(endpoint, bucket, tmp_path / "cache", max_attempts=2)
        assert not sync.sync()["model"].error
        good = (sync.repository_dir / "model").resolve()
        put(s3, bucket, "repo/model/2/model.py", "# v2")
        put(s3, bucket, "repo/model/2/weights.bin", os.urandom(3 * 1024 * 1024))
        proxy.cut_after = 256 * 1024  # every response is cut after 256 KiB
        report = make_sync(endpoint, bucket, tmp_path / "cache", max_attempts=2).sync()["model"]
        assert proxy.cuts >= 1
        assert "cannot download" in report.error and "weights.bin" in report.error
        assert (sync.repository_dir / "model").resolve() == good
        assert files_under(sync.repository_dir / "model") == {"config.pbtxt", "1/model.py", "1/weights.bin"}
        assert not list((tmp_path / "cache").rglob("*.partial-*"))
        assert not list((tmp_path / "cache").rglob("*.part-*"))
        proxy.cut_after = None
        healed = make_sync(endpoint, bucket, tmp_path / "cache").sync()["model"]
        assert not healed.error and healed.downloaded == 2
        assert files_under(sync.repository_dir / "model") == {"config.pbtxt", "2/model.py", "2/weights.bin"}
    finally:
        proxy.stop()


def test_unreachable_storage_is_a_clear_error(tmp_path):
    from bootstrap.storage import StorageError

    sync = make_sync("http://127.0.0.1:9", "bucket", tmp_path / "cache", max_attempts=1)
    with pytest.raises(StorageError, match="cannot list s3://bucket/repo/"):
        sync.sync()


def test_missing_config_and_bad_config(s3, moto_endpoint, bucket, tmp_path):
    put(s3, bucket, "repo/noconfig/1/model.pt", "x")  # TorchScript models need a config (ONNX ones do not)
    put(s3, bucket, "repo/badconfig/config.pbtxt", "backend: {")
    put(s3, bucket, "repo/badconfig/1/model.py", "x")
    for version in (1, 2):  # a Python model may come without a config, as in Triton: the newest version only
        put(s3, bucket, f"repo/python_only/{version}/model.py", "x")
    reports = make_sync(moto_endpoint, bucket, tmp_path / "cache").sync()
    assert "no config.pbtxt" in reports["noconfig"].error
    assert "syntax error" in reports["badconfig"].error
    assert not reports["python_only"].error and reports["python_only"].selected == 1


def test_location_parsing_and_key_checks():
    assert parse_location("s3://bucket/a/b") == StorageLocation("s3", "bucket", "a/b/")
    assert parse_location("oss://bucket") == StorageLocation("oss", "bucket", "")
    assert unsafe_key_reason("m/1/model.onnx") is None
    assert unsafe_key_reason("/m/1") == "absolute key"
    assert unsafe_key_reason("m/../x") is not None
    assert unsafe_key_reason("m/1/") is None  # a folder placeholder
    assert unsafe_key_reason("m/../") is not None
    assert unsafe_key_reason("m/1//") is not None


def test_a_folder_placeholder_makes_an_empty_version_folder(s3, moto_endpoint, bucket, tmp_path):
    put(s3, bucket, "repo/ensemble/config.pbtxt", VERSION_CONFIG)
    put(s3, bucket, "repo/ensemble/", "")  # the model folder's own placeholder: ignored
    put(s3, bucket, "repo/ensemble/1/", "")
    sync = make_sync(moto_endpoint, bucket, tmp_path / "cache")
    assert not sync.sync()["ensemble"].error
    assert (sync.repository_dir / "ensemble" / "1").is_dir()
    assert files_under(sync.repository_dir / "ensemble") == {"config.pbtxt"}
    assert make_sync(moto_endpoint, bucket, tmp_path / "cache").sync()["ensemble"].downloaded == 0
