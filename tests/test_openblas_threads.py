"""numpy's OpenBLAS threads sleep at once instead of spinning a tenth of a second of a core each
(runtime/openblas_threads.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runtime.openblas_threads import SPIN_ENV

# Imports numpy (OpenBLAS starts its threads), waits, and prints the CPU milliseconds its other threads used.
OTHER_THREADS_CPU = """
import os, sys, time
if sys.argv[1] == "short":
    from runtime.openblas_threads import short_openblas_spin
    short_openblas_spin()
import numpy
time.sleep(0.4)
others = [tid for tid in os.listdir("/proc/self/task") if int(tid) != os.getpid()]
print(len(others), sum(int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0]) for tid in others) / 1e6)
"""


def _other_threads_cpu(mode: str) -> tuple[int, float]:
    environment = {key: value for key, value in os.environ.items() if key != SPIN_ENV}
    done = subprocess.run([sys.executable, "-c", OTHER_THREADS_CPU, mode], env=environment, capture_output=True,
                          text=True, check=True, timeout=60)
    count, milliseconds = done.stdout.split()
    return int(count), float(milliseconds)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")
def test_openblas_threads_sleep_instead_of_spinning():
    threads, spun = _other_threads_cpu("default")
    if threads == 0:
        pytest.skip("this numpy's OpenBLAS starts no threads here (one core)")
    assert spun > 20.0  # what the setting is for: each thread spins about 0.1 s of a core at numpy's import
    assert _other_threads_cpu("short")[1] < 5.0


def test_a_users_own_setting_is_kept(monkeypatch):
    from runtime.openblas_threads import short_openblas_spin

    monkeypatch.setenv(SPIN_ENV, "20")
    short_openblas_spin()
    assert os.environ[SPIN_ENV] == "20"
