"""A Python model's own environment: config.pbtxt's ``EXECUTION_ENV_PATH`` parameter, as python_backend reads it.

The parameter names a packed environment (conda-pack's or venv-pack's ``.tar.gz``, or any tar) or a directory
holding one, ``$$TRITON_MODEL_DIRECTORY`` standing for the model's folder; the model's workers then run that
environment's interpreter (``environment_process.py``), so two models whose dependencies conflict serve side by
side.  An archive is unpacked once into the server's private cache, in a folder named by its content (sha256), so a
warm start, a second instance or a second model with the same archive reuse it; its entries are checked first as
python_backend 2.70 (#437) has libarchive check them: no absolute paths, no ``..``, nothing written through a
symbolic link (a link may point anywhere, as a venv's ``bin/python`` points at its base interpreter, but no entry
lands through one), no hard link to a file outside, no devices, and no more than :data:`MAX_UNPACKED_BYTES`.
The interpreter is tried once before the first worker starts, so a missing interpreter, or a Python that cannot run
the worker (older than 3.10, or without numpy), fails the load with the reason instead of a worker that never
answers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import shutil
import stat
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import ModelLoadError

logger = logging.getLogger(__name__)

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY_KEYWORD = "$$TRITON_MODEL_DIRECTORY"
MAX_UNPACKED_BYTES = 32 << 30  # an archive whose entries add up to more is refused (a gzip bomb fills no disk)
MAX_ENTRIES = 1_000_000
PROBE_TIMEOUT_SECONDS = 60.0
# What the worker imports beside the standard library: tried in the environment before the first worker starts.
_PROBE = ("import sys\n"
          "if sys.version_info < (3, 10): raise SystemExit('Python %d.%d is too old: the worker needs 3.10 or newer'"
          " % sys.version_info[:2])\n"
          "import numpy, handlers.python.worker\n"
          "print('%d.%d' % sys.version_info[:2])")


@dataclass(frozen=True)
class PythonEnvironment:
    """An environment ready to run workers: its folder, its interpreter and what they see of our code."""

    root: Path
    interpreter: Path
    python_version: str  # "3.12", as the interpreter reported it
    code_path: Path  # a folder holding only our worker's packages, put first on the worker's sys.path

    def process_environment(self) -> dict[str, str]:
        """The variables a worker runs with: the environment's bin and lib first, our code on PYTHONPATH, and
        nothing of the server's own interpreter (PYTHONHOME, user site-packages)."""
        variables = {key: value for key, value in os.environ.items()
                     if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONSTARTUP")}
        variables["PATH"] = os.pathsep.join(filter(None, [str(self.root / "bin"), os.environ.get("PATH", "")]))
        variables["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, [str(self.root / "lib"), os.environ.get("LD_LIBRARY_PATH", "")]))
        variables["CONDA_PREFIX" if (self.root / "conda-meta").is_dir() else "VIRTUAL_ENV"] = str(self.root)
        variables["PYTHONPATH"] = str(self.code_path)
        variables["PYTHONNOUSERSITE"] = "1"
        return variables


def default_environments_dir() -> Path:
    """Where environments are unpacked when the server names no folder (a core run without bootstrap)."""
    return Path(tempfile.gettempdir()) / f"serverless-triton-environments-{os.getuid()}"


def environment_path(parameter: str, model_dir: Path) -> Path:
    """The parameter's path, ``$$TRITON_MODEL_DIRECTORY`` replaced by the model's folder."""
    return Path(parameter.replace(MODEL_DIRECTORY_KEYWORD, str(model_dir)))


_prepared: dict[tuple, PythonEnvironment] = {}  # (path, size, mtime) -> the environment made of it
_prepare_lock = threading.Lock()


def prepare_environment(parameter: str, model_dir: Path, cache_dir: Path) -> PythonEnvironment:
    """The environment ``parameter`` names, unpacked into ``cache_dir`` if it is an archive and its interpreter
    tried; ModelLoadError saying what is wrong.  Instances and models naming the same unchanged path share it."""
    path = environment_path(parameter, model_dir)
    try:
        resolved = path.resolve(strict=True)
        info = resolved.stat()
    except OSError:
        raise ModelLoadError(f"Failed to get the canonical path for {path}.") from None  # python_backend's words
    key = (resolved, info.st_size, info.st_mtime_ns, cache_dir)
    with _prepare_lock:  # instances load in parallel: one unpacks, the others wait for it
        known = _prepared.get(key)
        if known is not None and known.interpreter.exists():
            return known
        root = resolved if stat.S_ISDIR(info.st_mode) else _unpacked(resolved, _private_dir(cache_dir))
        environment = _checked(root, path, _worker_code(_private_dir(cache_dir)))
        _prepared[key] = environment
    logger.info("Using Python execution env %s (Python %s)", path, environment.python_version)
    return environment


def _private_dir(path: Path) -> Path:
    """``path``, created 0700 if missing; refused unless it is a plain folder only this user can write (what is
    unpacked there runs)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(path)
    except OSError as exc:
        raise ModelLoadError(f"cannot create the folder for Python environments {path}: {exc.strerror}") from None
    if (stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        raise ModelLoadError(f"the folder for Python environments {path} is not a private folder of this user")
    return path


def _unpacked(archive: Path, cache_dir: Path) -> Path:
    """The folder ``archive`` is unpacked in, named by its content: unpacked now unless a start before did."""
    digest = hashlib.sha256()
    with archive.open("rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    destination = cache_dir / f"env-{digest.hexdigest()[:40]}"
    if destination.is_dir():
        return destination
    try:
        _made_once(destination, lambda staging: unpack_checked(archive, staging))
    except (OSError, tarfile.TarError) as exc:
        raise ModelLoadError(f"cannot unpack the Python execution env {archive}: {exc}") from None
    logger.info("unpacked the Python execution env %s into %s", archive, destination)
    return destination


def _made_once(destination: Path, make: Callable[[Path], None]) -> Path:
    """``destination``, made by ``make`` into a private staging folder and renamed into place (atomic: a reader sees
    all of it or none) unless it exists; another server making it meanwhile is no error."""
    if destination.is_dir():
        return destination
    staging = destination.parent / f".{destination.name}.{os.getpid()}.{threading.get_ident()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    try:
        make(staging)
        try:
            staging.rename(destination)
        except OSError:
            if not destination.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return destination


def unpack_checked(archive: Path, destination: Path) -> None:
    """Unpack ``archive`` into ``destination`` after checking every entry; ModelLoadError naming the first entry
    that would reach outside it, or the archive's size past the bound."""
    with tarfile.open(archive, "r:*") as tar:
        members = entries_checked(tar)
        tar.extractall(destination, members=members)  # noqa: S202 - every entry checked above


def entries_checked(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """The archive's entries, each checked (setuid and setgid bits dropped); ModelLoadError for the first that
    fails a check."""
    members: list[tarfile.TarInfo] = []
    links: set[str] = set()  # entries that are symbolic links: nothing may be written through them
    seen: set[str] = set()
    total = 0
    for member in tar:
        name = _inside(member.name, member.name)
        parents = Path(name).parents
        if any(str(parent) in links for parent in parents):
            _refuse(member.name, "is written through a link")
        if name in seen:
            _refuse(member.name, "appears twice")
        seen.add(name)
        if member.issym():
            links.add(name)
        elif member.islnk():
            target = _inside(member.linkname, member.name, member.linkname)
            if any(str(parent) in links for parent in Path(target).parents) or target in links:
                _refuse(member.name, "links through a link")
        elif not (member.isfile() or member.isdir()):
            _refuse(member.name, "is a device or a pipe")
        total += member.size
        if total > MAX_UNPACKED_BYTES or len(members) >= MAX_ENTRIES:
            raise ModelLoadError(f"the Python execution env holds more than {MAX_UNPACKED_BYTES >> 30} GiB or "
                                 f"{MAX_ENTRIES} entries")
        member.mode &= 0o777 if not member.isdir() else 0o1777
        members.append(member)
    return members


def _inside(path: str, entry: str, target: str | None = None) -> str:
    """``path`` normalized, refused if it is absolute or leads out of the archive's root."""
    if path.startswith("/") or (target is not None and target.startswith("/")):
        _refuse(entry, "points to an absolute path" if target is not None else "has an absolute path")
    normal = posixpath.normpath(path)
    if normal == ".." or normal.startswith("../"):
        _refuse(entry, "points out of the environment" if target is not None else "has '..' in its path")
    return normal


def _refuse(entry: str, why: str) -> None:
    raise ModelLoadError(f"the Python execution env's archive entry '{entry}' {why}: refused")


def _worker_code(cache_dir: Path) -> Path:
    """A folder holding links to our worker's packages and nothing else (the server's own site-packages must not
    reach the environment's interpreter): made once per server installation."""
    import handlers
    import runtime
    import triton_python_backend_utils

    sources = {"handlers": Path(handlers.__file__).parent, "runtime": Path(runtime.__file__).parent,
               "triton_python_backend_utils.py": Path(triton_python_backend_utils.__file__)}
    key = hashlib.sha256("\0".join(str(source.resolve()) for source in sources.values()).encode()).hexdigest()[:16]

    def link(staging: Path) -> None:
        for name, source in sources.items():
            (staging / name).symlink_to(source.resolve())

    return _made_once(cache_dir / f"worker-code-{key}", link)


def _checked(root: Path, named: Path, code_path: Path) -> PythonEnvironment:
    """The environment at ``root`` once its interpreter ran the worker's imports; ModelLoadError otherwise."""
    if not (root / "bin" / "activate").exists():  # python_backend's check and words
        raise ModelLoadError(f"Path {root / 'bin' / 'activate'} does not exist. The Python environment should "
                             "contain an 'activate' script.")
    interpreter = next((root / "bin" / name for name in ("python3", "python") if (root / "bin" / name).exists()),
                       None)
    if interpreter is None:
        raise ModelLoadError(f"the Python execution env {named} has no interpreter (bin/python3)")
    environment = PythonEnvironment(root, interpreter, "", code_path)
    try:
        probe = subprocess.run([str(interpreter), "-c", _PROBE], env=environment.process_environment(),
                               capture_output=True, text=True, timeout=PROBE_TIMEOUT_SECONDS, check=False,
                               stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelLoadError(f"the Python execution env {named}: its interpreter cannot run ({exc})") from None
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[-1][:400]
        raise ModelLoadError(f"the Python execution env {named} cannot run the worker (it needs Python 3.10 or "
                             f"newer with numpy): {reason}")
    return PythonEnvironment(root, interpreter, probe.stdout.strip(), code_path)
