"""Model control (explicit and poll modes), exact statistics and the metrics families, against real Triton.

Each step is one call (or one change to both repository copies) whose answers are compared; the steps of a
mode run in order on their own pair of servers.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from tritonclient.grpc import service_pb2

from tests.conformance.cases import add_sub, grpc_add_sub
from tests.conformance.differences import DIFFERENCES, our_answer_problem
from tests.conformance.harness import (
    GrpcCase,
    HttpCase,
    agree,
    each,
    observe_grpc,
    observe_http,
    replace_at,
    sort_list,
    without_traceback,
)
from tests.conformance.models import ADD_SUB, VERSION, build_repository
from tests.conformance.servers import Pair, start_pair

INDEX = sort_list("body")
TEXT_CONFIG = json.dumps({"backend": "python", "max_batch_size": 0,
                          "input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]}],
                          "output": [{"name": "UPPER", "data_type": "TYPE_STRING", "dims": [-1]}],
                          "parameters": {"from_override": {"string_value": "yes"}}})


@dataclass(frozen=True)
class Step:
    """A call (HttpCase / GrpcCase) to compare, after ``before`` has been done to both repository copies."""

    case: HttpCase | GrpcCase
    before: Callable[[Pair], None] | None = None
    settle: float = 0.0  # poll mode: compare again until they agree, for at most this many seconds


def load(name: str, model: str, body: dict | bytes | None = None) -> HttpCase:
    return HttpCase(name, "POST", f"/v2/repository/models/{model}/load", body)


def unload(name: str, model: str, body: dict | None = None) -> HttpCase:
    return HttpCase(name, "POST", f"/v2/repository/models/{model}/unload", body)


def index(name: str) -> HttpCase:
    return HttpCase(name, "POST", "/v2/repository/index", normalize=INDEX)


EXPLICIT_STEPS = [
    Step(index("explicit-index-at-start")),
    Step(HttpCase("explicit-ready-at-start", "GET", "/v2/health/ready")),
    Step(HttpCase("explicit-not-loaded-metadata", "GET", "/v2/models/text")),
    Step(load("explicit-load", "text")),
    Step(HttpCase("explicit-infer-after-load", "POST", "/v2/models/text/infer",
                  {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a"]}]})),
    Step(load("explicit-load-again-unchanged", "text")),
    Step(load("explicit-load-unknown-model", "nonexistent")),
    Step(load("explicit-load-initialize-fails", "init_raises")),
    Step(load("explicit-load-syntax-error", "syntax_error")),
    Step(load("explicit-load-config-does-not-parse", "bad_config")),
    Step(index("explicit-index-after-loads")),
    Step(HttpCase("explicit-ready-after-a-failed-load", "GET", "/v2/health/ready")),
    Step(unload("explicit-unload", "text")),
    Step(unload("explicit-unload-unknown-model", "nonexistent")),
    Step(unload("explicit-unload-not-loaded", "versions_all")),
    Step(index("explicit-index-after-unload")),
    Step(HttpCase("explicit-metadata-after-unload", "GET", "/v2/models/text")),
    Step(HttpCase("explicit-infer-after-unload", "POST", "/v2/models/text/infer",
                  {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a"]}]})),
    Step(load("explicit-load-config-override", "text", {"parameters": {"config": TEXT_CONFIG}})),
    Step(HttpCase("explicit-config-after-override", "GET", "/v2/models/text/config")),
    Step(load("explicit-load-config-not-json", "text", {"parameters": {"config": "{bad"}})),
    Step(load("explicit-load-config-not-a-string", "text", {"parameters": {"config": 5}})),
    Step(load("explicit-load-with-a-file", "text", {"parameters": {"file:1/model.py": "aGVsbG8="}})),
    Step(load("explicit-load-unknown-parameter", "add_sub", {"parameters": {"foo": "bar"}})),
    Step(load("explicit-load-bad-json", "text", b"{bad")),
    Step(unload("explicit-unload-dependents", "text", {"parameters": {"unload_dependents": True}})),
    Step(GrpcCase("explicit-grpc-load", "RepositoryModelLoad",
                  service_pb2.RepositoryModelLoadRequest(model_name="versions_all"))),
    Step(GrpcCase("explicit-grpc-model-ready-after-load", "ModelReady",
                  service_pb2.ModelReadyRequest(name="versions_all"))),
    Step(GrpcCase("explicit-grpc-load-unknown-model", "RepositoryModelLoad",
                  service_pb2.RepositoryModelLoadRequest(model_name="nonexistent"))),
    Step(GrpcCase("explicit-grpc-unload", "RepositoryModelUnload",
                  service_pb2.RepositoryModelUnloadRequest(model_name="versions_all"))),
    Step(GrpcCase("explicit-grpc-index", "RepositoryIndex", service_pb2.RepositoryIndexRequest(),
                  normalize=sort_list("response.models"))),
]


def _add_version(pair: Pair) -> None:
    for repository in (pair.triton_process.repository, pair.ours_process.repository):
        (repository / "versions_default" / "5").mkdir()  # written afresh: Triton's poll looks at times
        (repository / "versions_default" / "5" / "model.py").write_text(VERSION)


def _remove_model(pair: Pair) -> None:
    for repository in (pair.triton_process.repository, pair.ours_process.repository):
        shutil.rmtree(repository / "text")


def _add_model(pair: Pair) -> None:
    for repository in (pair.triton_process.repository, pair.ours_process.repository):
        copy = repository / "add_sub_int_copy"
        (copy / "1").mkdir(parents=True)
        (copy / "1" / "model.py").write_text(ADD_SUB)
        config = (repository / "add_sub_int" / "config.pbtxt").read_text()
        (copy / "config.pbtxt").write_text(config.replace('name: "add_sub_int"', 'name: "add_sub_int_copy"'))


def touched_index(name: str) -> HttpCase:
    """The index rows of the models the poll steps change (Triton's poll also retries its failed models, so
    their rows flip between LOADING and UNAVAILABLE from one poll to the next)."""
    touched = {"versions_default", "text", "add_sub_int_copy", "add_sub"}
    return HttpCase(name, "POST", "/v2/repository/index", normalize=each(INDEX, replace_at(
        "body", lambda rows: [row for row in rows if row["name"] in touched])))


POLL_STEPS = [
    Step(touched_index("poll-index-at-start")),
    Step(load("poll-load-refused", "text")),
    Step(touched_index("poll-index-after-new-version"), before=_add_version, settle=30.0),
    Step(HttpCase("poll-metadata-after-new-version", "GET", "/v2/models/versions_default"), settle=30.0),
    Step(touched_index("poll-index-after-a-model-was-removed"), before=_remove_model, settle=30.0),
    Step(HttpCase("poll-metadata-of-removed-model", "GET", "/v2/models/text"), settle=30.0),
    Step(touched_index("poll-index-after-a-model-was-added"), before=_add_model, settle=30.0),
    Step(HttpCase("poll-infer-added-model", "POST", "/v2/models/add_sub_int_copy/infer",
                  add_sub([1, 2, 3, 4], [1, 1, 1, 1], "INT32"))),
]

COUNTED = each(replace_at("body.model_stats.*.last_inference", "<ms>"),
               replace_at("body.model_stats.*.inference_stats.*.ns", "<ns>"),
               replace_at("body.model_stats.*.batch_stats.*.compute_input.ns", "<ns>"),
               replace_at("body.model_stats.*.batch_stats.*.compute_infer.ns", "<ns>"),
               replace_at("body.model_stats.*.batch_stats.*.compute_output.ns", "<ns>"))
COUNTED_GRPC = each(replace_at("response.model_stats.*.last_inference", "<ms>"),
                    replace_at("response.model_stats.*.inference_stats.*.ns", "<ns>"),
                    replace_at("response.model_stats.*.batch_stats.*.compute_input.ns", "<ns>"),
                    replace_at("response.model_stats.*.batch_stats.*.compute_infer.ns", "<ns>"),
                    replace_at("response.model_stats.*.batch_stats.*.compute_output.ns", "<ns>"))
STATS_STEPS = [
    Step(HttpCase("stats-counted-infer-one", "POST", "/v2/models/counted/infer", add_sub(shape=[1, 4]))),
    Step(HttpCase("stats-counted-infer-three", "POST", "/v2/models/counted/infer",
                  add_sub([1.0, 2, 3, 4] * 3, [1.0] * 12, shape=[3, 4]))),
    Step(GrpcCase("stats-counted-infer-grpc", "ModelInfer", grpc_add_sub("counted", shape=(1, 4)))),
    Step(HttpCase("stats-counted-bad-request", "POST", "/v2/models/counted/infer", add_sub(shape=[4]))),
    Step(HttpCase("stats-counted-exact", "GET", "/v2/models/counted/stats", normalize=COUNTED)),
    Step(GrpcCase("stats-counted-exact-grpc", "ModelStatistics", service_pb2.ModelStatisticsRequest(name="counted"),
                  normalize=COUNTED_GRPC)),
    Step(HttpCase("stats-cached-infer-miss", "POST", "/v2/models/cached/infer", add_sub())),
    Step(HttpCase("stats-cached-infer-hit", "POST", "/v2/models/cached/infer", add_sub())),
    Step(GrpcCase("stats-cached-infer-hit-grpc", "ModelInfer", grpc_add_sub("cached"))),
    Step(HttpCase("stats-cached-exact", "GET", "/v2/models/cached/stats", normalize=COUNTED)),
    Step(HttpCase("stats-all-models", "GET", "/v2/models/stats",
                  normalize=each(sort_list("body.model_stats"), replace_at("body.model_stats", lambda rows: sorted(
                      (row["name"], row["version"]) for row in rows))))),
]

CASE_NAMES = [step.case.name for step in (*EXPLICIT_STEPS, *POLL_STEPS, *STATS_STEPS)] + [
    "metrics-families", "metrics-counted-model"]


def _observe(pair: Pair, case: HttpCase | GrpcCase, client: httpx.Client) -> tuple[dict, dict]:
    if isinstance(case, GrpcCase):
        return observe_grpc(pair.triton.grpc, case), observe_grpc(pair.ours.grpc, case)
    return observe_http(pair.triton.http, case, client), observe_http(pair.ours.http, case, client)


def _run_steps(pair: Pair, steps: list[Step]) -> list[str]:
    """Run every step; returns the disagreements not listed in differences.py (and listed ones that agree)."""
    problems = []
    with httpx.Client(timeout=30) as client:
        for step in steps:
            if step.before is not None:
                step.before(pair)
            deadline = time.monotonic() + step.settle
            while True:  # poll mode: both act on a change when their next poll comes; give them until the deadline
                theirs, ours = _observe(pair, step.case, client)
                theirs = without_traceback(theirs)
                same = agree(theirs, ours)
                if same or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            if step.case.name in DIFFERENCES and same:
                problems.append(f"{step.case.name} now agrees with Triton: take it out of differences.py")
            elif step.case.name in DIFFERENCES and (problem := our_answer_problem(step.case.name, theirs, ours)):
                problems.append(problem)
            elif step.case.name not in DIFFERENCES and not same:
                problems.append(f"{step.case.name}\n  triton: {theirs}\n  ours:   {ours}")
    return problems


@pytest.fixture
def explicit_pair(repository, tmp_path):
    servers = start_pair(repository, tmp_path, ("--model-control-mode=explicit", "--load-model=add_sub"),
                         ("--model-control-mode", "explicit", "--load-model", "add_sub"))
    yield servers
    servers.stop()


POLLED_MODELS = {"add_sub", "add_sub_int", "text", "versions_default"}  # what the poll steps touch


@pytest.fixture
def poll_pair(tmp_path):
    # Only the models the steps touch: Triton reloads the whole repository at its first poll, and on a loaded
    # two-core machine a large one kept its poll busy past the steps' deadlines.
    repository = build_repository(tmp_path / "models", label_files=False)
    for folder in repository.iterdir():
        if folder.name not in POLLED_MODELS:
            shutil.rmtree(folder)
    servers = start_pair(repository, tmp_path, ("--model-control-mode=poll", "--repository-poll-secs=1"),
                         ("--model-control-mode", "poll", "--poll-interval", "1"))
    _wait_for_tritons_first_poll(servers.triton_process.log_path)
    yield servers
    servers.stop()


def _wait_for_tritons_first_poll(log: Path, timeout: float = 30.0) -> None:
    """Triton 2.51 reloads every model at its first poll, right after it starts; a model folder removed while that
    reload runs leaves its model lifecycle stuck (the stub finds no model.py and the load never ends). The steps
    change the repository only once that reload is done: each model loaded twice."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if all(text.count(f"successfully loaded '{name}'") >= 2 for name in POLLED_MODELS):
            return
        time.sleep(0.2)


def test_explicit_model_control(explicit_pair):
    problems = _run_steps(explicit_pair, EXPLICIT_STEPS)
    assert not problems, "\n".join(problems)


def test_poll_model_control(poll_pair):
    problems = _run_steps(poll_pair, POLL_STEPS)
    assert not problems, "\n".join(problems)


def test_exact_statistics(pair):
    problems = _run_steps(pair, STATS_STEPS)
    assert not problems, "\n".join(problems)


def _families(text: str) -> dict[str, tuple[str, str]]:
    """metric family -> (type, help) from the exposition's comment lines."""
    families: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            families.setdefault(name, ["", ""])[1] = help_text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            families.setdefault(name, ["", ""])[0] = kind
    return {name: (kind, help_text) for name, (kind, help_text) in families.items()}


def _series(text: str, model: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#") and f'model="{model}"' in line}


# Families a newer Triton than the oracle's 2.51 exports, and so do we (the README's differences table)
NEWER_TRITON_FAMILIES = ("nv_model_load_duration_secs",)


def test_metrics_families_and_the_counted_model(pair):
    test_exact_statistics(pair)  # the same calls on both: counted's series must then match exactly
    theirs = httpx.get(f"http://{pair.triton.metrics}/metrics").text
    ours = httpx.get(f"http://{pair.ours.metrics}/metrics").text
    triton_families, our_families = _families(theirs), _families(ours)
    missing = {name: family for name, family in triton_families.items() if our_families.get(name) != family}
    assert not missing, f"metric families Triton has and we do not (or differently): {missing}"
    extra = set(our_families) - set(triton_families)
    assert all(name.startswith("serverless_triton_") or name in NEWER_TRITON_FAMILIES for name in extra), extra
    their_series, our_series = _series(theirs, "counted"), _series(ours, "counted")
    durations = ("_duration_us",)
    assert set(their_series) == {s for s in our_series
                                 if not s.startswith(("serverless_triton_", *NEWER_TRITON_FAMILIES))}
    for series, value in their_series.items():
        if not any(marker in series for marker in durations):
            assert our_series[series] == value, series
