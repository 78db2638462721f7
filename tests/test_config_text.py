"""runtime/config/config_text.py: a config's text and its version policy, read with protobuf alone (the cold start's
early sync reads them before it downloads, where numpy has not been imported)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime.config.config_text import VersionPolicy, read_model_config, version_policy_of
from runtime.errors import ModelLoadError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("text", "expected"), [
    ('name: "m"', VersionPolicy()),
    ('version_policy: { all { } }', VersionPolicy(kind="all")),
    ('version_policy: { latest { num_versions: 3 } }', VersionPolicy(kind="latest", num_versions=3)),
    ('version_policy: { specific { versions: [1, 4] } }', VersionPolicy(kind="specific", versions=(1, 4))),
])
def test_the_version_policy_a_config_sets(text, expected):
    assert version_policy_of(text, "m") == expected


def test_a_config_that_does_not_parse_names_its_model():
    with pytest.raises(ModelLoadError, match="model 'broken': config.pbtxt syntax error"):
        version_policy_of("version_policy: {", "broken")
    assert read_model_config('name: "m"\nmax_batch_size: 8', "m").max_batch_size == 8


def test_reading_a_config_s_versions_imports_no_numpy():
    code = ("import sys\nfrom runtime.config.config_text import version_policy_of\n"
            "version_policy_of('version_policy: { all { } }', 'm')\nprint('numpy' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         check=True)
    assert run.stdout.strip() == "False"
