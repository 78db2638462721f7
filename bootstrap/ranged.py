"""Large objects: parallel ranged GETs into one file, with bounded memory, resumable part by part, checksummed.

A file is staged in ``<cache>/downloads/<digest>.data`` (``digest`` names bucket, key, ETag and size, so a
changed object never resumes from a stale copy) beside a ``.parts`` record of the parts already written and
synced to disk; a sync interrupted anywhere (a killed pod, a dropped connection) fetches only the missing
parts next time. Every part is a ``Range`` GET with ``If-Match`` on the listed ETag, written in 1 MiB
chunks at its offset (so memory stays at one chunk per worker whatever the size).

Checks, before the file is handed over: its size; a multipart upload's ETag (``<md5 of part md5s>-<N>``),
when the parts are downloaded on the upload's own boundaries (read from ``HEAD ?partNumber=1``), from
per-part MD5s computed by the workers in parallel; a single upload's ETag (the object's MD5) by a
sequential pass that runs while later parts still download; and a SHA-256 for the manifest, in that pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap.errors import BootstrapError
from bootstrap.storage import StoredObject, describe_client_error, is_permanent_client_error

CHUNK = 1 << 20
MIN_PART = 5 << 20  # S3's smallest multipart part
MAX_PART = 512 << 20
PART_ATTEMPTS = 3


class RangedDownloadError(BootstrapError):
    """The object could not be downloaded whole; ``permanent`` when retrying cannot help (it changed, or
    access is denied)."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass
class PartPlan:
    """How an object is cut into parts, and whether their MD5s can prove its multipart ETag."""

    size: int
    part_size: int
    etag_parts: int = 0  # the N of a multipart ETag matched by these boundaries (0: not checkable this way)
    ranges: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ranges = [(start, min(start + self.part_size, self.size)) for start in range(0, self.size,
                                                                                           self.part_size)]


def multipart_etag_parts(etag: str) -> int:
    """N for a multipart ETag ``<32 hex>-N``; 0 otherwise."""
    digest, dash, count = etag.partition("-")
    if not dash or len(digest) != 32 or not count.isdigit():
        return 0
    return int(count)


def is_plain_md5(etag: str) -> bool:
    return len(etag) == 32 and all(c in "0123456789abcdef" for c in etag.lower())


def plan_parts(client, bucket: str, item: StoredObject, part_size: int) -> PartPlan:
    """Parts of ``part_size``, or of the upload's own part size when the ETag is a multipart one (so the ETag
    can be checked from the parts' MD5s)."""
    count = multipart_etag_parts(item.etag)
    if count > 1:
        try:
            # (no If-Match here: the part GETs carry it; moto answers 412 to If-Match with partNumber)
            head = client.head_object(Bucket=bucket, Key=item.key, PartNumber=1)
            first = int(head["ContentLength"])
        except Exception:  # noqa: BLE001 - a store without partNumber support: plain parts, size-checked
            first = 0
        if MIN_PART <= first <= MAX_PART and -(-item.size // first) == count:
            return PartPlan(item.size, first, etag_parts=count)
    return PartPlan(item.size, part_size)


class _Progress:
    """The ``.parts`` record: which parts are on disk (synced), and their MD5s."""

    def __init__(self, path: Path, identity: dict) -> None:
        self.path = path
        self.identity = identity
        self.md5s: dict[int, str] = {}
        self._lock = threading.Lock()
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
        if isinstance(saved, dict) and saved.get("identity") == identity and isinstance(saved.get("md5s"), dict):
            self.md5s = {int(index): str(md5) for index, md5 in saved["md5s"].items()}

    def done(self, index: int, md5: str) -> None:
        with self._lock:
            self.md5s[index] = md5
            temp = self.path.with_suffix(".parts-tmp")
            temp.write_text(json.dumps({"identity": self.identity, "md5s": self.md5s}))
            os.replace(temp, self.path)


class _SequentialHasher:
    """SHA-256 (and MD5 when the ETag is one) over the file in order, as its parts land."""

    def __init__(self, fd: int, plan: PartPlan, want_md5: bool) -> None:
        self.fd = fd
        self.plan = plan
        self.sha256 = hashlib.sha256()
        self.md5 = hashlib.md5() if want_md5 else None
        self._landed: set[int] = set()
        self._failed = False
        self._condition = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True, name="sync-hash")
        self._thread.start()

    def landed(self, index: int) -> None:
        with self._condition:
            self._landed.add(index)
            self._condition.notify()

    def abandon(self) -> None:
        with self._condition:
            self._failed = True
            self._condition.notify()

    def _run(self) -> None:
        for index, (start, end) in enumerate(self.plan.ranges):
            with self._condition:
                while index not in self._landed and not self._failed:
                    self._condition.wait()
                if self._failed:
                    return
            offset = start
            while offset < end:
                chunk = os.pread(self.fd, min(4 * CHUNK, end - offset), offset)
                if not chunk:
                    return
                self.sha256.update(chunk)
                if self.md5 is not None:
                    self.md5.update(chunk)
                offset += len(chunk)

    def result(self) -> tuple[str, str | None]:
        self._thread.join()
        return self.sha256.hexdigest(), self.md5.hexdigest() if self.md5 is not None else None


class RangedDownload:
    """One large object into ``staging``; ``run`` returns the finished file's path and its manifest record."""

    def __init__(self, client, bucket: str, item: StoredObject, staging: Path, part_size: int,
                 submit: Callable[..., Future], deadline: float, late: Callable[[], str]) -> None:
        self.client = client
        self.bucket = bucket
        self.item = item
        self.submit = submit
        self.deadline = deadline
        self.late = late
        identity = f"{bucket}\0{item.key}\0{item.etag}\0{item.size}"
        name = hashlib.sha256(identity.encode()).hexdigest()[:32]
        self.data_path = staging / f"{name}.data"
        self.plan = plan_parts(client, bucket, item, part_size)
        self.progress = _Progress(staging / f"{name}.parts", {"key": item.key, "etag": item.etag, "size": item.size,
                                                              "part_size": self.plan.part_size})

    def run(self) -> tuple[Path, dict]:
        fd = os.open(self.data_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size != self.item.size:  # new, or not ours any more: start over
                os.ftruncate(fd, 0)
                os.ftruncate(fd, self.item.size)
                self.progress.md5s.clear()
            hasher = _SequentialHasher(fd, self.plan, want_md5=is_plain_md5(self.item.etag))
            try:
                self._fetch_missing(fd, hasher)
            except BaseException:
                hasher.abandon()
                raise
            sha256, md5 = hasher.result()
        finally:
            os.close(fd)
        self._verify(md5)
        return self.data_path, {"size": self.item.size, "etag": self.item.etag, "sha256": sha256}

    def discard(self) -> None:
        self.data_path.unlink(missing_ok=True)
        self.progress.path.unlink(missing_ok=True)

    def _fetch_missing(self, fd: int, hasher: _SequentialHasher) -> None:
        futures = []
        for index in range(len(self.plan.ranges)):
            if index in self.progress.md5s:
                hasher.landed(index)
            else:
                futures.append(self.submit(self._fetch_part, fd, index, hasher))
        try:
            for future in futures:
                future.result(timeout=max(0.0, self.deadline - time.monotonic()))
        except BaseException:
            for future in futures:
                future.cancel()
            raise

    def _fetch_part(self, fd: int, index: int, hasher: _SequentialHasher) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        start, end = self.plan.ranges[index]
        last_error = ""
        for _ in range(PART_ATTEMPTS):
            if time.monotonic() > self.deadline:
                raise RangedDownloadError(self.late(), permanent=True)
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=self.item.key,
                                                  Range=f"bytes={start}-{end - 1}", IfMatch=f'"{self.item.etag}"')
                md5, offset = hashlib.md5(), start
                for chunk in response["Body"].iter_chunks(CHUNK):
                    if offset + len(chunk) > end:
                        raise RangedDownloadError(f"{self.item.key!r}: part {index} is longer than its range")
                    os.pwrite(fd, chunk, offset)
                    md5.update(chunk)
                    offset += len(chunk)
                if offset != end:
                    raise RangedDownloadError(f"{self.item.key!r}: part {index}: got {offset - start} bytes, "
                                              f"expected {end - start}")
                os.fdatasync(fd)
                self.progress.done(index, md5.hexdigest())
                hasher.landed(index)
                return
            except ClientError as exc:
                last_error = describe_client_error(exc)
                if is_permanent_client_error(exc):
                    raise RangedDownloadError(f"cannot download {self.item.key!r}: {last_error}",
                                              permanent=True) from None
            except (BotoCoreError, RangedDownloadError, ConnectionError) as exc:
                last_error = str(exc) if isinstance(exc, RangedDownloadError) else describe_client_error(exc)
        raise RangedDownloadError(f"cannot download {self.item.key!r} (part {index}): {last_error}")

    def _verify(self, md5: str | None) -> None:
        etag = self.item.etag
        if md5 is not None and md5 != etag:
            self.discard()
            raise RangedDownloadError(f"{self.item.key!r}: content does not match its ETag", permanent=True)
        if self.plan.etag_parts:
            digests = b"".join(bytes.fromhex(self.progress.md5s[i]) for i in range(len(self.plan.ranges)))
            if f"{hashlib.md5(digests).hexdigest()}-{self.plan.etag_parts}" != etag.lower():
                self.discard()
                raise RangedDownloadError(f"{self.item.key!r}: content does not match its multipart ETag",
                                          permanent=True)
