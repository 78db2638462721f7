"""The local cache of a repository synced from object storage: where it lives, and who may write it.

Whatever is in the cache gets loaded, and loading a model runs its code.  So the cache folder
is private to the server's user (created 0700; refused if another user owns it or anyone else
can write it), and only what a sync published from storage is served (see ``sync.py``).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from bootstrap.errors import BootstrapError

APP = "serverless-triton"


class CacheError(BootstrapError):
    """The cache folder cannot be trusted or created."""


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/serverless-triton`` or ``~/.cache/serverless-triton``, where the user has a
    writable home; otherwise a folder of this user's own under the system temp folder."""
    if os.environ.get("XDG_CACHE_HOME"):
        return str(Path(os.environ["XDG_CACHE_HOME"]) / APP)
    home = Path(os.path.expanduser("~"))
    if home != Path("/") and home.is_dir() and os.access(home, os.W_OK):
        return str(home / ".cache" / APP)
    return str(Path(tempfile.gettempdir()) / f"{APP}-{os.getuid()}")


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (mode 0700) if missing; refuse it if it is not a folder this user alone can write."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(path)
    except OSError as exc:
        raise CacheError(f"cannot create the cache folder {path}: {exc.strerror}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise CacheError(f"the cache folder {path} is not a plain folder")
    if info.st_uid != os.getuid():
        raise CacheError(f"the cache folder {path} belongs to uid {info.st_uid}, not to this server's user "
                         f"({os.getuid()}): choose another cache_dir")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(f"the cache folder {path} is writable by other users (mode {stat.S_IMODE(info.st_mode):o}): "
                         "make it private (chmod 700) or choose another cache_dir")


def temp_folder_in_cache(cache_dir: Path) -> Path | None:
    """Where the system offers no writable temp folder (a read-only root file system, as Knative and Cloud Run can
    run a container, with only the cache's volume writable), a private folder in the cache becomes this process's
    and its children's (``TMPDIR``): the one port's private sockets are made there. The folder now in use where
    this moved it; None where the system's serves, or where the cache cannot hold one either."""
    try:
        tempfile.gettempdir()
        return None
    except FileNotFoundError:
        pass
    folder = cache_dir / "tmp"
    try:
        ensure_private_dir(folder)
    except CacheError:
        return None
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = str(folder)
    return folder
