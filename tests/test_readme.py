"""The README stays what a user reads first: under 400 lines, every link into the tree pointing at a file there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_under_400_lines():
    assert len(README.splitlines()) < 400, "move detail into docs/ and link it"


def test_every_relative_link_resolves():
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        assert (ROOT / target).exists(), target
