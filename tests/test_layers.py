"""The layers' one direction (../shared/architecture.md): the core never imports a backend; the backends' registry
and auto-complete are handed to it by the composition root (bootstrap)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def test_runtime_never_imports_handlers_or_bootstrap():
    offenders = {str(path.relative_to(ROOT)): sorted(m for m in _imported_modules(path)
                                                       if m.split(".")[0] in ("handlers", "bootstrap"))
                 for path in (ROOT / "runtime").rglob("*.py")}
    assert {path: modules for path, modules in offenders.items() if modules} == {}
