"""Each case sends one call to real Triton and to our server and compares what a client observes.

A case either agrees, or is listed in differences.py with the reason (and must then really differ).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.conformance.cases import GRPC_CASES, HTTP_CASES
from tests.conformance.differences import (
    DIFFERENCES,
    ERROR_ANSWERS,
    GLOBAL_DIFFERENCES,
    INDEX_CASES,
    our_answer_problem,
)
from tests.conformance.harness import agree, observe_grpc, observe_http, without_traceback

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=30) as http:
        yield http


def judge(name: str, theirs: dict, ours: dict) -> None:
    theirs = without_traceback(theirs)
    if name in DIFFERENCES:
        assert not agree(theirs, ours), f"{name} now agrees with Triton: take it out of differences.py"
        problem = our_answer_problem(name, theirs, ours)
        assert problem is None, problem
    else:
        assert agree(theirs, ours), f"\ntriton: {theirs}\nours:   {ours}"


@pytest.mark.parametrize("case", HTTP_CASES, ids=lambda case: case.name)
def test_http(pair, client, case):
    port = "metrics" if case.port == "metrics" else "http"
    judge(case.name, observe_http(getattr(pair.triton, port), case, client),
           observe_http(getattr(pair.ours, port), case, client))


@pytest.mark.parametrize("case", GRPC_CASES, ids=lambda case: case.name)
def test_grpc(pair, case):
    judge(case.name, observe_grpc(pair.triton.grpc, case), observe_grpc(pair.ours.grpc, case))


def test_case_names_are_distinct_and_differences_name_real_cases():
    names = [case.name for case in [*HTTP_CASES, *GRPC_CASES]]
    assert len(names) == len(set(names))
    assert len(names) >= 150
    assert set(DIFFERENCES) <= set(names) | _other_case_names()


def test_every_difference_documents_our_answer():
    assert set(ERROR_ANSWERS) | set(INDEX_CASES) == set(DIFFERENCES)
    assert not set(ERROR_ANSWERS) & set(INDEX_CASES)


def test_agree_lets_only_an_error_message_add_detail():
    assert agree({"status": 400, "body": {"error": "no such model"}},
                 {"status": 400, "body": {"error": "no such model: it failed to load"}})
    assert agree({"code": "NOT_FOUND", "details": "gone"}, {"code": "NOT_FOUND", "details": "gone: unloaded"})
    assert not agree({"body": [{"name": "m", "state": "READY"}]}, {"body": [{"name": "m", "state": "READY: no"}]})
    assert not agree({"body": {"reason": "x"}}, {"body": {"reason": "x: y"}})
    assert not agree({"status": 400, "body": {"error": "a"}}, {"status": 500, "body": {"error": "a"}})


def test_readme_table_lists_every_difference():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Where we differ from Triton, and why", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE))
    assert listed == set(DIFFERENCES) | set(GLOBAL_DIFFERENCES)


def _other_case_names() -> set[str]:
    """Cases of the other conformance modules (model control, statistics, metrics)."""
    from tests.conformance import test_control

    return set(test_control.CASE_NAMES)
