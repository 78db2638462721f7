"""JSON tensor data, read and written by runtime/http/json_data.py: with its native number arrays
(runtime/http/json_numbers.cc), with msgspec alone (where the native part is not built), and with the module as it
was at ``--before`` (by default the commit before msgspec became the server's one JSON library: pysimdjson reading,
orjson writing; needs both installed), all in this run, for a large tensor and a small one (the common JSON
request). Reading is ``array_from_json``; writing is a message holding the tensor's ``json_fragment``, as the
response's encoder writes it. Per case: the median of ``--runs`` runs (each the
best of 5 timings, the machine's noise taken out; a small tensor's timing is of 1000 calls), and each way's time as a
ratio of the native one's (above 1: slower than native).

Usage: python -m scripts.bench_json_numbers [--elements 1000000] [--runs 3] [--before REV]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType

import numpy as np

if __package__ in (None, ""):  # run as a file: the project's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.http import json_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _best_of(call: Callable[[], object], repeat: int = 1) -> float:
    """The best of 5 timings of ``repeat`` calls, per call."""
    times = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeat):
            call()
        times.append((time.perf_counter() - started) / repeat)
    return min(times)


def _module_at(revision: str) -> ModuleType | None:
    """runtime/http/json_data.py as it was at ``revision`` (None where its libraries are not installed)."""
    source = subprocess.run(["git", "show", f"{revision}:runtime/http/json_data.py"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    module = ModuleType(f"json_data_at_{revision}")
    try:
        exec(compile(source, f"{revision}:runtime/http/json_data.py", "exec"), module.__dict__)  # noqa: S102
    except ImportError:
        return None
    return module


def _write(module: ModuleType, array: np.ndarray, datatype: str) -> bytes:
    return module.dumps({"name": "OUT", "data": module.json_fragment(array, datatype)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", default="9a1c038", help="the revision to compare with (default: before the move)")
    args = parser.parse_args()
    if json_data.json_numbers is None:
        sys.exit("runtime/http/_json_numbers is not built (python setup.py build_ext --inplace)")
    rng = np.random.default_rng(0)
    print(f"median of {args.runs} runs, each the best of 5 timings; time a call, and its ratio to native's")
    print(f"{'case':<22}{'native':>10}{'msgspec':>10}{'ratio':>8}{'before':>10}{'ratio':>8}")
    native_module = json_data.json_numbers
    before = _module_at(args.before)
    if before is None:
        print(f"(the module at {args.before} needs pysimdjson and orjson: its column is left out)")
    for elements, unit, scale, repeat in ((args.elements, "ms", 1e3, 1), (16, "us", 1e6, 1000)):
        cases = {"FP32": (rng.random(elements) * 100).astype(np.float32),
                 "INT32": rng.integers(-(1 << 31), 1 << 31, elements).astype(np.int32)}
        for datatype, array in cases.items():
            text = bytes(json_data.json_fragment(array, datatype))
            shape = (elements,)
            rows: dict[str, dict[str, list[float]]] = {"read": {}, "write": {}}
            for _ in range(args.runs):
                for way in ("native", "msgspec"):
                    json_data.json_numbers = native_module if way == "native" else None
                    try:
                        rows["read"].setdefault(way, []).append(
                            _best_of(partial(json_data.array_from_json, datatype, shape, text), repeat))
                        rows["write"].setdefault(way, []).append(
                            _best_of(partial(_write, json_data, array, datatype), repeat))
                    finally:
                        json_data.json_numbers = native_module
                if before is not None:
                    rows["read"].setdefault("before", []).append(
                        _best_of(partial(before.array_from_json, datatype, shape, text), repeat))
                    rows["write"].setdefault("before", []).append(
                        _best_of(partial(_write, before, array, datatype), repeat))
            for job, ways in rows.items():
                median = {way: statistics.median(times) * scale for way, times in ways.items()}
                line = f"{f'{datatype} {elements:,} {job} ({unit})':<22}{median['native']:>10.1f}" \
                       f"{median['msgspec']:>10.1f}{median['msgspec'] / median['native']:>8.2f}"
                if "before" in median:
                    line += f"{median['before']:>10.1f}{median['before'] / median['native']:>8.2f}"
                print(line)

if __name__ == "__main__":
    main()
