"""How the side-by-side benchmark turns measurements into figures (``scripts/bench_vs_triton.py``,
``scripts/bench_load.py``): ratios paired within a round, medians and ranges over rounds, and every bad call counted
against the point, so that no figure says more than was shown."""

from __future__ import annotations

import numpy as np

from scripts.bench_load import Tally, bad_calls, load
from scripts.bench_vs_triton import ONE_PORT, one_port_rows, summarize, targets
from tests.support import free_port


def _row(run: int, server: str, rps: float, cpu_us: float, failed: int = 0, wrong: int = 0, model: str = "m",
         c: int = 32) -> dict:
    return {"run": run, "round": 0, "server": server, "protocol": "grpc", "model": model, "c": c, "rps": rps,
            "cpu_us": cpu_us, "p50_ms": 1.0, "failed": failed, "wrong": wrong,
            "first_problem": "boom" if failed or wrong else ""}


def test_a_ratio_pairs_the_two_servers_of_one_round_never_each_ones_best():
    # round 0: ours 100 vs Triton 100; round 1: ours 150 vs Triton 300; round 2: ours 120 vs Triton 100.
    # Each server's best (150 vs 300) would say 0.5x; the paired ratios are 1.0, 0.5 and 1.2: median 1.0.
    rows = [_row(0, "ours", 100, 10), _row(0, "triton", 100, 10), _row(1, "ours", 150, 10),
            _row(1, "triton", 300, 5), _row(2, "ours", 120, 10), _row(2, "triton", 100, 12)]
    point, = summarize(rows)
    assert point["ratio"] == {"median": 1.0, "low": 0.5, "high": 1.2, "n": 3}
    assert point["cpu_ratio"]["median"] == 1.0 and point["bad_calls"] == 0


def test_a_bad_call_on_either_server_fails_the_point_and_its_target():
    rows = [_row(0, "ours", 500, 10, failed=1), _row(0, "triton", 100, 10), _row(1, "ours", 500, 10),
            _row(1, "triton", 100, 10, wrong=2)]
    point, = summarize([{**row, "model": "add_sub_batch"} for row in rows])
    assert point["bad_calls"] == 3 and point["problem"] == "boom"
    assert [met for *_, met in targets([point])] == [False]  # 5x Triton, but calls failed


def test_one_port_is_paired_with_two_ports_of_the_same_round_and_bad_calls_count():
    rows = [_row(0, "ours", 100, 10), _row(0, ONE_PORT, 90, 12), _row(1, "ours", 200, 10),
            _row(1, ONE_PORT, 100, 12, failed=1), _row(2, "ours", 100, 10), _row(2, ONE_PORT, 110, 9),
            _row(2, "triton", 500, 1)]
    point, = one_port_rows(rows)
    assert point["ratio"] == {"median": 0.9, "low": 0.5, "high": 1.1, "n": 3}
    assert (point["two_cpu_us"], point["one_cpu_us"], point["bad_calls"]) == (10, 12, 1)


def test_answers_are_checked_at_the_rate_asked():
    expected = {"OUT": np.arange(4, dtype=np.float32)}
    every = Tally(expected, check_every=1)
    every.answer(0.001, lambda name: np.arange(4, dtype=np.float32))
    every.answer(0.001, lambda name: np.zeros(4, np.float32))
    every.answer(0.001, lambda name: None)
    assert (every.ok, every.wrong) == (1, 2) and every.first_problem.startswith("OUT: off by")
    sampled = Tally(expected, check_every=8)
    for _ in range(16):
        sampled.answer(0.001, lambda name: np.zeros(4, np.float32))
    assert (sampled.ok, sampled.wrong) == (14, 2)  # one in 8 checked, and each of those found wrong


def test_a_load_against_nothing_counts_every_call_failed():
    result = load("grpc", free_port(), "add_sub_batch", 1, 5, None)
    assert result["ok"] == 0 and result["rps"] == 0.0
    assert bad_calls(result) == 5 + 20  # the warm-up's calls too
