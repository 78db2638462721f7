"""``bootstrap check``: load a repository exactly as ``bootstrap run`` would, serve nothing, report, unload.

Every check a serving start makes happens here with the same code: configs parse and validate, model files
exist, backends are installed, Python models import and initialize, ensembles wire up, warm-up runs. The
report has one row per model version (or per model that failed before it had versions).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from runtime.models.model import ModelState
from runtime.server import Server, ServerOptions


@dataclass(frozen=True)
class CheckRow:
    """One model version's outcome (``version`` is empty when the model failed before choosing versions)."""

    name: str
    version: str
    state: str
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.state == ModelState.READY.value


async def check_repository(options: ServerOptions, unload_timeout: float = 30.0) -> list[CheckRow]:
    """Load every model of ``options.model_repository`` (after syncing it, for object storage) and report."""
    server = Server(options)
    try:
        await server.service.load_initial_models()
        rows = server.manager.index()
    finally:
        await server.manager.unload_all(time.monotonic() + unload_timeout)
    unavailable = ModelState.UNAVAILABLE.value
    return [CheckRow(row["name"], row.get("version", ""), row.get("state", unavailable), row.get("reason", ""))
            for row in rows]


def render_text(rows: list[CheckRow]) -> str:
    """A readable report: aligned rows, then a summary line."""
    if not rows:
        return "no models found in the repository\n"
    width = max(len(row.name) for row in rows)
    lines = []
    for row in rows:
        mark = "ok  " if row.ok else "FAIL"
        version = row.version or "-"
        line = f"{mark} {row.name:<{width}}  version {version:<4} {row.state}"
        lines.append(f"{line}: {row.reason}" if row.reason else line)
    failed = sum(1 for row in rows if not row.ok)
    models = len({row.name for row in rows})
    lines.append(f"{models} model(s), {len(rows) - failed} version(s) ready, {failed} failed")
    return "\n".join(lines) + "\n"


def render_json(rows: list[CheckRow]) -> str:
    return json.dumps({"ok": all(row.ok for row in rows) and bool(rows),
                       "models": [asdict(row) for row in rows]}, indent=2) + "\n"
