"""The Python workers do not run the server's entry script again (handlers/python/template.py): multiprocessing
would run the parent's ``__main__`` file again in each worker it starts (as ``__mp_main__``), and the entry script
(``bootstrap``) imports the whole command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from handlers.python.template import uses_template

ROOT = Path(__file__).resolve().parents[1]
# An entry script: each process that runs it notes its pid in a file; the parent then starts a worker and prints
# what the worker sent and its pid.
ENTRY_SCRIPT = """
import os, sys
with open(os.environ["RAN_BY"], "a") as ran_by:
    ran_by.write(f"{os.getpid()}\\n")

if __name__ == "__main__":
    from handlers.python.template import start_template, worker_context, workers_skip_the_entry_script
    from tests.template_probe import report_importer

    if sys.argv[1] == "skip":
        workers_skip_the_entry_script()
    start_template(background=False, frameworks=[])
    context = worker_context()
    ours, theirs = context.Pipe()
    process = context.Process(target=report_importer, args=(theirs,))
    process.start()
    print(ours.recv(), process.pid)
    process.join(30)
"""


def _entry_script_runs(tmp_path: Path, mode: str) -> tuple[set[int], int]:
    script, ran_by = tmp_path / f"entry_{mode}.py", tmp_path / f"ran_by_{mode}"
    script.write_text(ENTRY_SCRIPT)
    done = subprocess.run([sys.executable, str(script), mode], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=True, env={"RAN_BY": str(ran_by), "PYTHONPATH": str(ROOT),
                                                        "PATH": "/usr/bin:/bin"})
    _, worker = done.stdout.split()
    return {int(pid) for pid in ran_by.read_text().split()}, int(worker)


@pytest.mark.skipif(not uses_template(), reason="workers start from fresh interpreters here")
def test_workers_do_not_run_the_entry_script_again(tmp_path):
    runs, worker = _entry_script_runs(tmp_path, "skip")
    assert worker not in runs and len(runs) == 1  # the parent only
    runs, worker = _entry_script_runs(tmp_path, "rerun")
    assert worker in runs  # what multiprocessing does otherwise: the test can fail
