"""The one root of bootstrap's errors (settings, storage, sync, cache), so that the CLI reports any of them the
same way: a message and an exit code, never a traceback."""

from __future__ import annotations


class BootstrapError(Exception):
    """A start-up step failed for a reason worth telling the operator as it is."""
