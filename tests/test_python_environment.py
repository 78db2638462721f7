"""handlers.python.environment: the checks every entry of a packed environment passes before it is unpacked, and
where ``EXECUTION_ENV_PATH`` points."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from handlers.python.environment import entries_checked, environment_path, unpack_checked
from runtime.errors import ModelLoadError


def _archive(entries: list[tarfile.TarInfo]) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for entry in entries:
            tar.addfile(entry, io.BytesIO(b"x" * entry.size) if entry.isfile() else None)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer, mode="r")


def _entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type, entry.linkname, entry.mode = kind, link, mode
    entry.size = 1 if kind == tarfile.REGTYPE else 0
    return entry


@pytest.mark.parametrize("entries, why", [
    ([_entry("/abs")], "has an absolute path"),
    ([_entry("a/../../b")], "has '..' in its path"),
    ([_entry("..")], "has '..' in its path"),
    ([_entry("lib", tarfile.SYMTYPE, "/usr/lib"), _entry("lib/evil.so")], "is written through a link"),
    ([_entry("d", tarfile.SYMTYPE, "."), _entry("d/x/y")], "is written through a link"),
    ([_entry("lib", tarfile.SYMTYPE, "/usr/lib"), _entry("hard", tarfile.LNKTYPE, "lib/libc.so")],
     "links through a link"),
    ([_entry("hard", tarfile.LNKTYPE, "/etc/passwd")], "points to an absolute path"),
    ([_entry("hard", tarfile.LNKTYPE, "../outside")], "points out of the environment"),
    ([_entry("x"), _entry("./x")], "appears twice"),
    ([_entry("fifo", tarfile.FIFOTYPE)], "is a device or a pipe"),
    ([_entry("blk", tarfile.BLKTYPE)], "is a device or a pipe"),
])
def test_hostile_entries_are_refused(entries, why):
    with pytest.raises(ModelLoadError, match=why):
        entries_checked(_archive(entries))


def test_a_venv_s_links_pass_and_setuid_bits_go(tmp_path):
    members = entries_checked(_archive([
        _entry("bin", tarfile.DIRTYPE, mode=0o755),
        _entry("bin/python3", tarfile.SYMTYPE, "/usr/bin/python3.11"),  # a venv's interpreter: allowed
        _entry("bin/python", tarfile.SYMTYPE, "python3"),
        _entry("bin/tool", mode=0o4755),
        _entry("bin/copy", tarfile.LNKTYPE, "bin/tool"),
    ]))
    assert [member.name for member in members] == ["bin", "bin/python3", "bin/python", "bin/tool", "bin/copy"]
    assert members[3].mode == 0o755


def test_unpacked_as_checked(tmp_path):
    archive = tmp_path / "env.tar"
    with tarfile.open(archive, "w") as tar:
        for entry in (_entry("bin", tarfile.DIRTYPE, mode=0o755), _entry("bin/activate"),
                      _entry("bin/python", tarfile.SYMTYPE, "/usr/bin/python3")):
            tar.addfile(entry, io.BytesIO(b"x") if entry.isfile() else None)
    unpack_checked(archive, tmp_path / "out")
    assert (tmp_path / "out" / "bin" / "activate").read_bytes() == b"x"
    assert (tmp_path / "out" / "bin" / "python").readlink() == Path("/usr/bin/python3")


def test_the_model_directory_keyword():
    assert environment_path("$$TRITON_MODEL_DIRECTORY/env.tar.gz", Path("/repo/m")) == Path("/repo/m/env.tar.gz")
    assert environment_path("/opt/envs/a", Path("/repo/m")) == Path("/opt/envs/a")
