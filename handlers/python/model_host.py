"""Where a Python model's pb_utils calls go, shared by the worker's runner and ``triton_python_backend_utils``.

The runner installs the host of its process (or, for a model run in the server's process, of its thread) and the
model version's folder; pb_utils reads them for every BLS call, response, log line and metric. pb_utils registers
here, at import, how the runner builds the requests it hands to ``execute`` and reads what the model did with
them (the module users import must list Triton's names only, so those stay private to it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_per_thread = threading.local()
_process_host: Any = None
_process_model_dir = ""
_build_request: Callable[..., Any] | None = None
_release_flags_of: Callable[[Any], int] | None = None


def install(host: Any, thread_only: bool = False, model_dir: str = "") -> None:
    """``host`` serves this thread's pb_utils calls (and the whole process's, unless ``thread_only`` and the
    process already has one); ``model_dir`` is what ``pb_utils.get_model_dir`` answers."""
    global _process_host, _process_model_dir
    _per_thread.host, _per_thread.model_dir = host, model_dir
    if not thread_only or _process_host is None:
        _process_host, _process_model_dir = host, model_dir


def set_thread_host(host: Any) -> None:
    """A thread that runs a model's call on its behalf (``async_exec``) serves it with the model's host."""
    _per_thread.host = host


def current() -> Any:
    """This thread's host, else the process's; None outside a running model."""
    return getattr(_per_thread, "host", None) or _process_host


def model_dir() -> str:
    return getattr(_per_thread, "model_dir", None) or _process_model_dir


def register_requests(build: Callable[..., Any], release_flags_of: Callable[[Any], int]) -> None:
    """pb_utils' side: how a received request is built, and how its release flags are read."""
    global _build_request, _release_flags_of
    _build_request, _release_flags_of = build, release_flags_of


def received_request(*arguments: Any) -> Any:
    """A ``pb_utils.InferenceRequest`` for a request the server handed to ``execute``."""
    assert _build_request is not None, "triton_python_backend_utils registers its requests at import"
    return _build_request(*arguments)


def release_flags(request: Any) -> int:
    """The flags the model released ``request`` with (``set_release_flags``; reschedule, say)."""
    assert _release_flags_of is not None, "triton_python_backend_utils registers its requests at import"
    return _release_flags_of(request)
