"""runtime/dataclass_code.py: a class made from the recorded code behaves as one compiled at the start; a file that
is not this interpreter's table changes nothing. Each case runs in a fresh interpreter (the table and
``dataclasses``' ``exec`` are the process's)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHAPES = '''
from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field


@dataclass(frozen=True)
class Point:
    x: int
    y: int = 2
    tags: tuple[str, ...] = ()


@dataclass(order=True)
class Box:
    width: float
    _: KW_ONLY
    depth: float = 1.0
    items: list[int] = field(default_factory=list)
    label: str = field(default="box", repr=False)
    area: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.area = self.width * self.depth
'''

# What each class does, printed as JSON: with the table or without it, the same.
BEHAVIOUR = '''
import dataclasses, json
from probe_shapes.shapes import Box, Point

point = Point(1, tags=("a",))
try:
    point.x = 5
    frozen = False
except dataclasses.FrozenInstanceError:
    frozen = True
box, other = Box(2.0, depth=3.0), Box(2.0, depth=3.0, items=[1])
behaviour = {
    "point": [repr(point), point == Point(1, 2, ("a",)), hash(point) == hash(Point(1, 2, ("a",))), frozen],
    "box": [repr(box), box.area, box == other, box < Box(3.0), other.items, Box(1.0).items is not Box(1.0).items],
    "code": [Point.__init__.__code__.co_code.hex(), Box.__init__.__code__.co_code.hex(),
             repr(Box.__init__.__code__.co_consts), Point.__hash__.__code__.co_code.hex()],
}
'''


def _package(folder: Path) -> Path:
    package = folder / "probe_shapes"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "shapes.py").write_text(SHAPES)
    return folder


def _python(code: str, folder: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                         cwd=folder, env={"PYTHONPATH": f"{folder}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_class_made_from_the_recorded_code_is_the_class_compiled_at_the_start(tmp_path):
    folder, table = _package(tmp_path), tmp_path / "table.marshal"
    recorded = _python(f"""
        import json
        from runtime import dataclass_code
        codes = dataclass_code.record(("probe_shapes",))
        dataclass_code.write(codes, __import__("pathlib").Path({str(table)!r}))
        print(json.dumps({{"texts": len(codes)}}))
        """, folder)
    assert recorded["texts"] >= 7  # Point: init, repr, eq, setattr, delattr, hash; Box: init, repr, eq, order

    with_table = _python(f"""
        import dataclasses, json
        from runtime import dataclass_code
        loaded = dataclass_code.use_compiled_code(__import__("pathlib").Path({str(table)!r}))
        {textwrap.indent(BEHAVIOUR, " " * 8).strip()}
        behaviour["loaded"] = loaded
        behaviour["used"] = dataclass_code.compiled_code_used()
        dataclass_code.release_compiled_code()
        behaviour["released"] = "exec" not in vars(dataclasses)

        @dataclasses.dataclass
        class Later:  # made after the release: compiled as ever
            value: int = 3
        behaviour["later"] = repr(Later())
        print(json.dumps(behaviour))
        """, folder)
    without = _python(f"""
        import json
        {textwrap.indent(BEHAVIOUR, " " * 8).strip()}
        print(json.dumps(behaviour))
        """, folder)

    assert with_table["loaded"] == recorded["texts"]
    assert with_table["used"] >= 7  # the classes came from the table
    assert with_table["released"] and with_table["later"] == "Later(value=3)"
    for key in ("point", "box", "code"):
        assert with_table[key] == without[key]
    assert without["point"][3] is True and without["box"][2] is False  # the behaviour compared is the real one


def test_a_class_the_table_lacks_is_compiled_as_before(tmp_path):
    folder, table = _package(tmp_path), tmp_path / "table.marshal"
    _python(f"""
        import json
        from runtime import dataclass_code
        dataclass_code.write({{}}, __import__("pathlib").Path({str(table)!r}))
        print("{{}}")
        """, folder)
    result = _python(f"""
        import json, pathlib
        from runtime import dataclass_code
        loaded = dataclass_code.use_compiled_code(pathlib.Path({str(table)!r}))
        from probe_shapes.shapes import Point
        print(json.dumps({{"loaded": loaded, "used": dataclass_code.compiled_code_used(), "point": repr(Point(1))}}))
        """, folder)
    assert result == {"loaded": 0, "used": 0, "point": "Point(x=1, y=2, tags=())"}


def test_a_foreign_or_broken_file_changes_nothing(tmp_path):
    magic = importlib.util.MAGIC_NUMBER
    files = {"missing": None, "other_python": b"\x00\x00\r\n" + b"\xe3" * 64, "broken": magic + b"\xff\x00garbage",
             "not_a_table": magic + __import__("marshal").dumps([1, 2, 3]),
             "wrong_values": magic + __import__("marshal").dumps({"text": 5})}
    for name, content in files.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
    result = _python(f"""
        import dataclasses, json, pathlib
        from runtime import dataclass_code
        loaded = {{name: dataclass_code.use_compiled_code(pathlib.Path({str(tmp_path)!r}) / name)
                  for name in {sorted(files)!r}}}
        print(json.dumps({{"loaded": loaded, "exec_replaced": "exec" in vars(dataclasses)}}))
        """, tmp_path)
    assert result == {"loaded": dict.fromkeys(files, 0), "exec_replaced": False}


def test_the_start_makes_its_dataclasses_from_the_installed_table(tmp_path):
    """The server's start: bootstrap loads the table scripts/setup.sh wrote, and the start's classes use it."""
    table = ROOT / "runtime" / f"dataclass_code.{sys.implementation.cache_tag}.marshal"
    assert table.is_file(), "scripts/setup.sh writes it (python -m runtime.dataclass_code)"
    result = _python("""
        import json
        import bootstrap.cli, runtime.server, runtime.adapters
        from runtime import dataclass_code
        print(json.dumps({"used": dataclass_code.compiled_code_used()}))
        """, tmp_path)
    assert result["used"] > 100
