"""The layers' one direction (../shared/architecture.md): the core never imports a backend; the backends' registry
and auto-complete are handed to it by the composition root (bootstrap). And no module reads another's private
members (tests included): what a second module needs is a public interface."""

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


# The layers, top to bottom (../shared/architecture.md): a module imports only from its own layer or those below.
# Models build their schedulers, so models sit over scheduling; the OpenAI adapter uses the HTTP adapter's
# helpers and is mounted beside it by runtime/adapters.py; both adapters hand plain requests to the native data path
# (runtime/native), which knows the core only by its interface; handlers implement runtime/handler.py's contract.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("bootstrap",),
    ("runtime.server",),
    ("runtime.frontends",),
    ("runtime.adapters", "runtime.adapter_settings"),
    ("runtime.openai",),
    ("runtime.listen",),
    ("runtime.http", "runtime.grpc"),
    ("runtime.native",),
    ("runtime.api", "runtime.auth", "runtime.restricted_api", "runtime.header_forward"),
    ("runtime.core", "runtime.responses", "runtime.validation"),
    ("runtime.extensions",),
    ("runtime.models",),
    ("runtime.scheduling",),
    ("handlers", "triton_python_backend_utils"),
    ("runtime.handler",),
    ("runtime.direct_path", "runtime.tensor_pool", "runtime.memfd_arena", "runtime.deadline_wheel",
     "runtime.loop_local", "runtime.process_memory", "runtime.thread_policy", "runtime.allocator", "runtime.devices"),
    ("runtime.config", "runtime.types", "runtime.datatypes", "runtime.errors", "runtime.protocol", "runtime"),
)


def _layer(module: str) -> int | None:
    """The index of the layer ``module`` belongs to (its longest prefix in LAYERS); None: not ours."""
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    return best[0] if best is not None else None


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_runs_back_up_a_layer():
    """Every import of ours points to the importer's own layer or one below it: no exception list."""
    files = [ROOT / "triton_python_backend_utils.py"]
    for folder in ("runtime", "handlers", "bootstrap"):
        files += [path for path in (ROOT / folder).rglob("*.py")]
    upward = []
    for path in files:
        source = _module_name(path)
        layer = _layer(source)
        assert layer is not None, f"{source} is in no layer: add it to LAYERS"
        for target in _imported_modules(path):
            target_layer = _layer(target)
            if target_layer is not None and target_layer < layer:
                upward.append(f"{source} -> {target}")
    assert upward == []


def test_models_sit_over_scheduling():
    scheduling = [path for path in (ROOT / "runtime" / "scheduling").rglob("*.py")]
    assert not [f"{_module_name(path)} -> {target}" for path in scheduling for target in _imported_modules(path)
                if target.startswith("runtime.models")]


_OURS = ("runtime", "handlers", "bootstrap", "tests", "scripts", "examples", "triton_python_backend_utils")
# Private names of other libraries that we use on purpose: os._exit (a process that must end now), torch's JIT
# switches (as Triton's pytorch backend sets them) and the kubernetes client's deserializer (the deploy manifests
# checked against the API's own models).
_THIRD_PARTY_PRIVATE = ("os", "sys", "torch", "kubernetes")


def _defined_here(tree: ast.AST) -> set[str]:
    """Private names a file defines itself (functions, classes, attributes it assigns): its own to read."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _private_reach_ins(path: Path) -> list[str]:
    """``from <ours> import _name``, and ``<something>._name`` where the file does not define ``_name`` itself."""
    tree = ast.parse(path.read_text(), str(path))
    own = _defined_here(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in _OURS:
            found += [f"import {node.module}.{alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = ast.unparse(node.value)
            if (owner in ("self", "cls", "super()") or node.attr in own
                    or owner.split(".")[0] in _THIRD_PARTY_PRIVATE):
                continue
            found.append(f"{owner}.{node.attr} (line {node.lineno})")
    return found


def test_no_module_reads_another_ones_private_members():
    files = [ROOT / "triton_python_backend_utils.py"]
    for folder in ("runtime", "handlers", "bootstrap", "tests", "scripts"):
        files += [path for path in (ROOT / folder).rglob("*.py") if "protocol" not in path.relative_to(ROOT).parts]
    offenders = {str(path.relative_to(ROOT)): found for path in files if (found := _private_reach_ins(path))}
    assert offenders == {}
