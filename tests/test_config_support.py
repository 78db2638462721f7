"""Config fields this server does not honour are never dropped silently: a field that changes what a model
computes fails the load naming it, one that only tunes how Triton runs it loads with a warning naming it."""

from __future__ import annotations

import pytest

from runtime.config.config_support import IGNORED, REFUSED, is_set
from runtime.config.pbtxt import parse_model_config
from runtime.errors import ModelLoadError
from runtime.protocol.model_config_pb2 import ModelConfig

BASE = """
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def test_every_listed_field_exists_in_the_proto():
    for path in [*REFUSED, *IGNORED]:
        is_set(ModelConfig(), path)  # KeyError for a path that names no field


@pytest.mark.parametrize(("extra", "field"), [
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_FP32 source_input: "IN" } ]',
     "batch_input"),
    ("sequence_batching { iterative_sequence: true }", "sequence_batching.iterative_sequence"),
    ('model_operations { op_library_filename: "libcustom.so" }', "model_operations"),
    ('model_repository_agents { agents [ { name: "checksum" } ] }', "model_repository_agents"),
])
def test_fields_that_change_results_fail_the_load(extra, field):
    with pytest.raises(ModelLoadError, match=f"config field '{field}' is not supported here"):
        parse_model_config(BASE + extra, "m")


def test_fields_that_only_tune_load_with_a_warning():
    spec = parse_model_config(BASE + """
        dynamic_batching { preserve_ordering: true }
        instance_group [ { kind: KIND_CPU count: 1 passive: true } ]
        metric_tags { key: "team" value: "x" }
    """, "m")
    assert [w.split("'")[3] for w in spec.ignored_fields] == ["dynamic_batching.preserve_ordering",
                                                             "instance_group.passive", "metric_tags"]
    assert parse_model_config(BASE, "m").ignored_fields == ()


def test_the_features_doc_lists_every_field_not_honoured():
    from pathlib import Path

    features = (Path(__file__).resolve().parents[1] / "docs" / "features.md").read_text()
    for path in [*REFUSED, *IGNORED]:
        assert f"| `{path}` |" in features, path
