"""The target of tests/test_python_template.py's workers: which process imported this module first, the workers'
template (before the fork) or the worker itself."""

from __future__ import annotations

import os
from multiprocessing.connection import Connection

IMPORTED_BY = os.getpid()


def report_importer(connection: Connection) -> None:
    """Sends whether this module came from the template (imported by another process)."""
    connection.send(IMPORTED_BY != os.getpid())
    connection.close()

