"""The code ``dataclasses`` compiles for each class, compiled once at install instead of at every start.

Making a dataclass generates its methods (``__init__``, ``__repr__``, ``__eq__``; a frozen one's ``__setattr__``,
``__delattr__`` and ``__hash__``) as source text and compiles each with ``exec``: the 70 classes a server's start
makes (ours, starlette's, granian's) took 37-60 ms of its one core here, two thirds of it compiling (measured in
docs/benchmarks.md). The install (scripts/install.sh, scripts/setup.sh) imports every module of the project once,
records each text's code object and writes them to :data:`CODE_FILE`, beside this module; the composition root
(``bootstrap``) loads that file before any class is made, and ``dataclasses`` gets the recorded code object for a
text it holds instead of compiling the text again. The key is the whole text and the file holds this interpreter's
bytecode only (its magic number leads the file), so a code object used is the one the text compiles to. A text the
file lacks (a class changed since the install, a module it did not import) is compiled as before; a missing,
unreadable or foreign file changes nothing. The server lets the table go once its cold start is over.

How: ``dataclasses`` calls the builtin ``exec`` by name; a module global of that name in ``dataclasses`` comes first
(the Python versions that run this one call it so; one that does not simply never finds the table).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import marshal
import sys
from pathlib import Path
from types import CodeType
from typing import Any

logger = logging.getLogger(__name__)

CODE_FILE = Path(__file__).with_name(f"dataclass_code.{sys.implementation.cache_tag}.marshal")
PACKAGES = ("runtime", "handlers", "bootstrap")  # what the install imports to record

_codes: dict[str, CodeType] = {}
_used = 0  # texts served from the table since it was loaded
_recording = False


def _compiled(source: str) -> CodeType:
    """What ``exec`` would run for ``source`` when ``dataclasses`` calls it: compiled without this module's own
    ``__future__`` flags (``dataclasses`` has none)."""
    return compile(source, "<string>", "exec", dont_inherit=True)


def _exec(source: str | CodeType, globals: dict[str, Any] | None = None,
          locals: dict[str, Any] | None = None) -> None:
    """``dataclasses``' ``exec``: the recorded code object for a text the table holds."""
    global _used
    if isinstance(source, str):
        code = _codes.get(source)
        if code is not None:
            _used += 1
        else:
            code = _compiled(source)
            if _recording:
                _codes[source] = code
        source = code
    if globals is None:  # what exec called in dataclasses would take: that module's globals
        globals = vars(dataclasses)
    exec(source, globals, locals)  # noqa: S102 - what dataclasses itself runs, compiled from the same text


def use_compiled_code(path: Path = CODE_FILE) -> int:
    """Load the recorded code objects from ``path`` and have ``dataclasses`` use them; how many there are (0: none,
    and nothing changed; also while :func:`record` runs)."""
    if _recording:
        return 0
    try:
        content = path.read_bytes()
    except OSError:
        return 0
    magic = importlib.util.MAGIC_NUMBER
    if not content.startswith(magic):  # another interpreter's bytecode: never unmarshalled
        return 0
    try:
        table = marshal.loads(memoryview(content)[len(magic):])
    except (ValueError, EOFError, TypeError):
        logger.warning("ignoring %s: not a table of code objects", path)
        return 0
    if not isinstance(table, dict) or not all(isinstance(key, str) and isinstance(code, CodeType)
                                              for key, code in table.items()):
        logger.warning("ignoring %s: not a table of code objects", path)
        return 0
    if not table:
        return 0
    _codes.update(table)
    dataclasses.exec = _exec  # type: ignore[attr-defined]
    return len(table)


def release_compiled_code() -> None:
    """Let the table go: ``dataclasses`` compiles every text again (what is made after the start is little)."""
    global _recording
    if vars(dataclasses).get("exec") is _exec:
        del dataclasses.exec  # type: ignore[attr-defined]
    _codes.clear()
    _recording = False


def compiled_code_used() -> int:
    """How many texts came from the table since it was loaded."""
    return _used


def record(packages: tuple[str, ...] = PACKAGES) -> dict[str, CodeType]:
    """Import every module of ``packages`` (those that cannot be imported here are passed over) and return the code
    object of each text ``dataclasses`` compiled meanwhile, in this process and before it (classes made earlier are
    not seen: call this in a fresh interpreter)."""
    import pkgutil

    global _recording
    _codes.clear()
    _recording = True
    dataclasses.exec = _exec  # type: ignore[attr-defined]
    try:
        for package in packages:
            root = importlib.import_module(package)
            for module in pkgutil.walk_packages(root.__path__, f"{package}.", onerror=lambda _: None):
                if module.name in sys.modules:
                    continue
                try:
                    importlib.import_module(module.name)
                except Exception:  # noqa: BLE001 - an optional framework missing here: its classes are not recorded
                    logger.debug("not recorded: %s", module.name, exc_info=True)
        return dict(_codes)
    finally:
        release_compiled_code()


def write(table: dict[str, CodeType], path: Path = CODE_FILE) -> None:
    """Write ``table`` to ``path``, this interpreter's magic number first, replacing it at once."""
    partial = path.with_name(f"{path.name}.partial")
    partial.write_bytes(importlib.util.MAGIC_NUMBER + marshal.dumps(table))
    partial.replace(path)


def main() -> int:
    """``python -m runtime.dataclass_code [PATH]``: record the project's dataclass code and write it (the install's
    step)."""
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else CODE_FILE
    table = record()
    write(table, path)
    print(f"recorded the code of {len(table)} dataclass methods into {path}")
    return 0


if __name__ == "__main__":
    # this module's own copy, not this __main__ one: bootstrap's import of it then finds the table being recorded
    from runtime import dataclass_code

    sys.exit(dataclass_code.main())
