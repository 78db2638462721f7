"""The process environment onnxruntime must find before it is first imported.

Since 1.32 the Linux wheel runs Microsoft's 1DS telemetry client: at the first session it writes a device id and an
SQLite queue under ``~/.cache/Microsoft`` (outside any folder of ours; on a read-only root it fails) and from then
on wakes every five to six seconds for good (a thread, two more, DNS queries for ``mobile.events.data.microsoft.com``):
an idle server's largest CPU cost, egress a function must not make. Only ``ORT_DISABLE_TELEMETRY`` set before the
import stops it (``disable_telemetry_events()`` after it does not). Imported by the composition root before the
Python workers' template forks, so a ``model.py`` that imports onnxruntime inherits it too; a user's own value wins.
"""

from __future__ import annotations

import os

ONNXRUNTIME_ENVIRONMENT = {"ORT_DISABLE_TELEMETRY": "1"}


def quiet_onnxruntime() -> None:
    """Set onnxruntime's environment in this process (and so in the processes it starts), keeping what is set."""
    for name, value in ONNXRUNTIME_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
