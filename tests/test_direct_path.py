"""handlers/python/direct_answer.py: a direct batch's answer read as the core takes a model's;
runtime/direct_path.py: the side door's closing hooks; with the statistics it adds to (runtime/scheduling/stats.py)
and the model scan that keeps BLS models off it (handlers/python/backend.py)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from handlers.python.backend import mentions_bls
from handlers.python.direct_answer import answer_outputs
from handlers.python.transport import INLINE, REQUEST_INPUT
from runtime.datatypes import serialize_bytes
from runtime.direct_path import DirectChannel
from runtime.errors import ServingError, Status
from runtime.scheduling.stats import FailureReason, ModelStatistics


def _frame(encoded) -> bytes:
    return pickle.dumps(("results", 7, [encoded]), pickle.HIGHEST_PROTOCOL)


def test_outputs_in_the_message_and_as_the_requests_input():
    doubled = np.arange(6, dtype=np.float32).reshape(2, 3)
    words = np.array([b"ab", b"c"], dtype=object)
    given = np.arange(4, dtype=np.int64)
    frame = _frame(("ok", [
        ("D", "FP32", (2, 3), INLINE, 0, doubled.nbytes, doubled.tobytes()),
        ("W", "BYTES", (2,), INLINE, 0, 0, bytes(serialize_bytes(words))),
        ("G", "INT64", (2, 2), REQUEST_INPUT, 1, given.nbytes, None),
    ], '{"k": 1}'))
    outputs = answer_outputs(frame, [b"", given.tobytes()])
    assert outputs.parameters == {"k": 1}
    np.testing.assert_array_equal(outputs["D"], doubled)
    assert outputs["W"].tolist() == [b"ab", b"c"]
    np.testing.assert_array_equal(outputs["G"], given.reshape(2, 2))


def test_an_error_and_a_reschedule():
    error = answer_outputs(_frame(("error", "bad input", "INVALID_ARG")), [])
    assert isinstance(error, ServingError) and (error.message, error.status) == ("bad input", Status.INVALID_ARG)
    assert answer_outputs(_frame(None), []) is None
    assert answer_outputs(_frame(("ok", [], "{}")), []).parameters == {}


def test_closing_hooks_run_once_and_none_join_after():
    told, dropped = [], []
    channel = DirectChannel(3, 4, 1024, 1 << 30, 5.0, lambda timed_out: "why", answer_outputs)
    assert channel.on_close(told.append)
    channel.on_close(dropped.append)()  # taken off again: not run
    channel.close(True)
    channel.close(False)
    assert told == [True] and dropped == []
    assert channel.on_close(told.append) is None and told == [True]


def test_what_a_direct_path_served_is_counted_when_the_statistics_are_read():
    stats = ModelStatistics()
    served = [([(2, 3, 3000, 300, 2400, 300)], 1, 500, 1_700_000_000_000_000_000)]
    state = [(True, True)]
    remove = stats.add_source(lambda: served.pop() if served else ([], 0, 0, 0), lambda: state[0])
    assert stats.lanes() == (1, 1, 4)  # one lane open, serving a request now, and 3 + 1 served
    state[0] = (False, False)
    assert stats.lanes() == (0, 0, 4)  # stopped (retired), until removed
    counted = stats.to_dict("m", 1)
    assert (counted["inference_count"], counted["execution_count"]) == (6, 4)
    assert counted["inference_stats"]["success"] == {"count": 3, "ns": 3000}
    assert counted["inference_stats"]["queue"] == {"count": 3, "ns": 3}  # 1 ns each: never queued
    assert counted["inference_stats"]["compute_infer"] == {"count": 3, "ns": 2400}
    assert counted["inference_stats"]["fail"] == {"count": 1, "ns": 500}
    assert counted["batch_stats"][0]["batch_size"] == 2
    assert counted["batch_stats"][0]["compute_input"] == {"count": 3, "ns": 300}
    assert counted["last_inference"] == 1_700_000_000_000
    assert stats.failure_counts()[FailureReason.BACKEND] == 1
    served.append(([(1, 1, 10, 1, 8, 1)], 0, 0, 0))
    remove()  # takes the last rows with it
    assert stats.to_dict("m", 1)["inference_count"] == 7
    assert stats.lanes() == (0, 0, 5)
    served.append(([(1, 1, 10, 1, 8, 1)], 0, 0, 0))
    assert stats.to_dict("m", 1)["inference_count"] == 7  # no longer asked


@pytest.mark.parametrize("source, sends", [
    ('"""requests: a list of pb_utils.InferenceRequest"""\n', False),
    ("request = pb_utils.InferenceRequest(model_name='x', inputs=[], requested_output_names=[])\n", True),
    ("r = InferenceRequest (\n", True),
])
def test_a_model_that_builds_bls_requests_is_found(tmp_path, source, sends):
    (tmp_path / "helpers").mkdir()
    (tmp_path / "model.py").write_text("import helpers\n")
    (tmp_path / "helpers" / "calls.py").write_text(source)
    assert mentions_bls(tmp_path) is sends
