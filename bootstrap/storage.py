"""Object storage access (S3 and OSS's S3-compatible API) through boto3, and key safety checks."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from urllib.parse import urlparse

from bootstrap.errors import BootstrapError
from bootstrap.settings_schema import one_of, optional_text, positive_int, seconds, setting

logger = logging.getLogger(__name__)

REMOTE_SCHEMES = ("s3", "oss")


class StorageError(BootstrapError):
    """Listing or downloading from object storage failed; the message is safe to log."""


@dataclass(frozen=True)
class StorageLocation:
    scheme: str  # s3 | oss
    bucket: str
    prefix: str  # "" or ending in "/"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}"


def _environment_region() -> str | None:
    """The region the AWS tools read from the environment (how containers are told; oss:// needs one)."""
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


@dataclass(frozen=True)
class StorageSettings:
    """How to reach the store (function.yaml's ``storage`` section); credentials come from the standard AWS chain,
    never from here."""

    endpoint_url: str | None = setting(
        None, key="storage.endpoint_url", check=optional_text, shown="AWS",
        meaning="S3-compatible endpoint (oss:// defaults to `https://s3.oss-<region>.aliyuncs.com`)")
    region: str | None = setting(
        key="storage.region", check=optional_text, factory=_environment_region, shown="`$AWS_REGION`, else none",
        meaning="region name")
    addressing_style: str = setting(
        "auto", key="storage.addressing_style", check=one_of("auto", "path", "virtual"),
        shown="`auto` (`virtual` for oss://)", meaning="`path` (MinIO, moto), `virtual` (OSS), `auto`")
    max_attempts: int = setting(5, key="storage.max_attempts", check=positive_int,
                                meaning="botocore standard-mode retries per request")
    max_concurrency: int = setting(8, key="storage.max_concurrency", check=positive_int,
                                   meaning="parallel downloads")
    connect_timeout_seconds: float = setting(10.0, key="storage.connect_timeout_seconds", check=seconds,
                                             meaning="time to connect, per request")
    read_timeout_seconds: float = setting(60.0, key="storage.read_timeout_seconds", check=seconds,
                                          meaning="time to wait for data, per request")
    ranged_threshold_bytes: int = setting(
        64 << 20, key="storage.ranged_threshold_bytes", check=positive_int,
        meaning="files this large download as parallel ranged GETs")
    ranged_part_bytes: int = setting(
        16 << 20, key="storage.ranged_part_bytes", check=positive_int,
        meaning="their part size (a multipart upload's own part size when it has one)")


def is_remote(url: str) -> bool:
    return urlparse(url).scheme in REMOTE_SCHEMES


def parse_location(url: str) -> StorageLocation:
    parsed = urlparse(url)
    if parsed.scheme not in REMOTE_SCHEMES:
        raise StorageError(f"not an object-storage URL (s3:// or oss://): {url}")
    if not parsed.netloc:
        raise StorageError(f"no bucket in {url}")
    prefix = parsed.path.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return StorageLocation(parsed.scheme, parsed.netloc, prefix)


def endpoint_for(location: StorageLocation, settings: StorageSettings) -> str | None:
    """The endpoint URL: the configured one, or OSS's S3 endpoint for the region."""
    if settings.endpoint_url:
        return settings.endpoint_url
    if location.scheme == "oss":
        if not settings.region:
            raise StorageError("oss:// needs storage.region (or storage.endpoint_url)")
        return f"https://s3.oss-{settings.region}.aliyuncs.com"
    return None


def make_client(location: StorageLocation, settings: StorageSettings):
    """A boto3 S3 client with standard retries and checksums only when required."""
    import boto3
    from botocore.config import Config

    addressing = settings.addressing_style
    if addressing == "auto":
        addressing = "virtual" if location.scheme == "oss" else "auto"
    config = Config(
        retries={"mode": "standard", "max_attempts": settings.max_attempts},
        s3={"addressing_style": addressing},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        connect_timeout=settings.connect_timeout_seconds,
        read_timeout=settings.read_timeout_seconds,
        max_pool_connections=max(10, settings.max_concurrency * 2),
    )
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_for(location, settings), region_name=settings.region, config=config
    )


def describe_client_error(exc: Exception) -> str:
    """A short, secret-free description of a botocore error."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {})
        code = error.get("Code", "")
        message = error.get("Message", "")
        return f"{code}: {message}".strip(": ") or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


# Client errors that retrying cannot cure: the object is gone, changed (If-Match), or not ours to read.
_PERMANENT_CODES = ("AccessDenied", "NoSuchKey", "PreconditionFailed", "412", "403", "404")


def is_permanent_client_error(exc: Exception) -> bool:
    """Whether a botocore ClientError means giving up on the object rather than trying again."""
    response = getattr(exc, "response", None)
    code = response.get("Error", {}).get("Code", "") if isinstance(response, dict) else ""
    return code in _PERMANENT_CODES


@dataclass(frozen=True)
class StoredObject:
    key: str  # full key
    relative: str  # key below the prefix, "/"-separated
    size: int
    etag: str  # without quotes


def list_objects(client, location: StorageLocation) -> list[StoredObject]:
    """Every object under the prefix; a folder placeholder (a key ending in '/') is kept, its relative key
    ending in '/': it is how storage holds an empty folder, such as an ensemble's version folder."""
    from botocore.exceptions import BotoCoreError, ClientError

    objects: list[StoredObject] = []
    try:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=location.bucket, Prefix=location.prefix):
            for item in page.get("Contents", []):
                key = item["Key"]
                relative = key[len(location.prefix) :]
                if not relative:
                    continue
                objects.append(StoredObject(key, relative, int(item["Size"]), item.get("ETag", "").strip('"')))
    except (ClientError, BotoCoreError) as exc:
        raise StorageError(f"cannot list {location.url}: {describe_client_error(exc)}") from None
    return objects


def unsafe_key_reason(relative: str) -> str | None:
    """Why a relative key must not become a file path, or None if it is safe (a folder placeholder's trailing
    '/' aside)."""
    relative = relative.removesuffix("/")
    if relative.startswith("/"):
        return "absolute key"
    if "\\" in relative:
        return "backslash in key"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in relative):
        return "control character in key"
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "empty, '.' or '..' path segment"
    if len(parts) < 2:
        return "not inside a model folder"
    if parts[0].startswith("."):
        return "hidden model folder"
    return None
