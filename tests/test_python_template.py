"""The Python workers' template imports the server's entry modules before it forks (handlers/python/template.py):
each worker re-runs the entry script as it starts (multiprocessing's fix-up of ``__main__``, never preloaded by
CPython 3.11's forkserver), which must find them imported instead of importing them again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from handlers.python.template import uses_template

ROOT = Path(__file__).resolve().parents[1]
# Starts a template (in a fresh interpreter: the template is one per process) and prints what a worker reports.
FORKED_WORKER = """
import sys
from handlers.python.template import start_template, worker_context
from tests.template_probe import report_importer

start_template(background=False, entry_modules=sys.argv[1:])
context = worker_context()
ours, theirs = context.Pipe()
process = context.Process(target=report_importer, args=(theirs,))
process.start()
print(ours.recv())
process.join(30)
"""


def _imported_by_the_template(entry_modules: list[str]) -> bool:
    done = subprocess.run([sys.executable, "-c", FORKED_WORKER, *entry_modules], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)
    return done.stdout.strip() == "True"


@pytest.mark.skipif(not uses_template(), reason="workers start from fresh interpreters here")
def test_the_template_imports_the_entry_modules_before_it_forks():
    assert _imported_by_the_template(["tests.template_probe"]) is True
    assert _imported_by_the_template([]) is False  # the worker imported it itself
