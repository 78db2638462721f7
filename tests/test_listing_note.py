"""bootstrap/listing_note.py and what it reads: the handlers a repository's listing suggests
(runtime/config/layout.py), the note the early sync's child tells, and the backends the server imports ahead
(handlers.import_ahead)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bootstrap.listing_note import ListingNote, listing_note
from handlers import import_ahead
from runtime.config.layout import handlers_listed

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Stored:
    relative: str


def test_each_version_s_default_model_file_names_its_handler():
    assert handlers_listed(["simple/config.pbtxt", "simple/1/model.onnx", "simple/2/model.onnx"]) == {"onnxruntime"}
    assert handlers_listed(["net/1/model.pt", "saved/1/model.savedmodel/saved_model.pb", "ov/3/model.xml",
                            "ov/3/model.bin"]) == {"pytorch", "tensorflow_savedmodel", "openvino"}


def test_a_model_with_model_py_is_a_python_model_whatever_else_it_holds():
    assert handlers_listed(["resnet/1/model.py", "resnet/1/model.pt", "other/1/model.onnx"]) == {"python",
                                                                                                 "onnxruntime"}


def test_files_outside_version_folders_or_unknown_suggest_nothing():
    assert handlers_listed(["m/model.onnx", "m/config.pbtxt", "m/0/model.onnx", "m/v1/model.onnx", "m/1/weights.bin",
                            "m/1/sub/model.onnx", "model.onnx", ""]) == set()


def test_the_note_tells_python_models_their_frameworks_and_the_other_backends():
    objects = [Stored("a/1/model.py"), Stored("a/config.pbtxt"), Stored("b/1/model.onnx")]
    read: list[list[str]] = []

    def sources(models: list[Stored]) -> list[str]:
        read.append([item.relative for item in models])
        return ["import torch\n"]

    note = listing_note(objects, sources, lambda texts: ["torch"] if "import torch\n" in texts else [])
    assert note == ListingNote(python_models=True, frameworks=("torch",), backends=("onnxruntime",))
    assert read == [["a/1/model.py"]]  # only the model.py files are read


def test_a_repository_without_python_reads_no_source():
    def never(models: list[Stored]) -> list[str]:
        raise AssertionError("read")

    note = listing_note([Stored("b/1/model.onnx"), Stored("b/config.pbtxt")], never, lambda texts: [])
    assert note == ListingNote(python_models=False, backends=("onnxruntime",))


def test_a_failed_look_at_the_sources_still_tells_the_python_models():
    def failing(models: list[Stored]) -> list[str]:
        raise OSError("gone")

    note = listing_note([Stored("a/1/model.py")], failing, lambda texts: ["torch"])
    assert note == ListingNote(python_models=True)


def test_a_backend_imported_ahead_is_imported_with_its_framework():
    """In a fresh interpreter: nothing of ONNX Runtime before, the handler and onnxruntime after."""
    code = ("import json, sys\nfrom handlers import import_ahead\nbefore = 'onnxruntime' in sys.modules\n"
            "done = import_ahead('onnxruntime')\n"
            "print(json.dumps([before, done, 'onnxruntime' in sys.modules, 'handlers.onnx.handler' in sys.modules]))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         check=True)
    assert json.loads(run.stdout) == [False, True, True, True]


def test_a_backend_that_cannot_be_imported_is_left_to_the_load():
    assert import_ahead("no_such_backend") is False
    if importlib.util.find_spec("tensorrt") is None:
        assert import_ahead("tensorrt") is False  # its handler imports, its framework does not
