"""``--model-load-thread-count`` (Triton's flag): how many models load at once.  Each model here records when its
``initialize`` ran (it takes 1 s): one load thread never lets two overlap, three let them all overlap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, write_model

SLOW_INIT = '''
import json, os, time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        began = time.time()
        time.sleep(1.0)
        path = os.path.join(os.path.dirname(pb_utils.get_model_dir()), "loaded.json")
        with open(path, "w") as stream:
            json.dump([began, time.time()], stream)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "IN")]) for r in requests]
'''


def _intervals(repository: Path) -> list[tuple[float, float]]:
    return sorted(tuple(json.loads((repository / name / "loaded.json").read_text())) for name in ("a", "b", "c"))


@pytest.mark.parametrize(("threads", "overlapping"), [(1, False), (3, True)])
def test_load_thread_count_bounds_models_loading_at_once(tmp_path, threads, overlapping):
    repository = tmp_path / "models"
    for name in ("a", "b", "c"):
        write_model(repository, name, IDENTITY_PYTHON_CONFIG, {"1/model.py": SLOW_INIT})
    with ServerProcess(repository, "--model-load-thread-count", str(threads)):
        intervals = _intervals(repository)
    overlaps = [later[0] < earlier[1] for earlier, later in zip(intervals, intervals[1:], strict=False)]
    assert all(overlaps) if overlapping else not any(overlaps), intervals
