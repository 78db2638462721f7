"""The vendored protocol modules are tritonclient's, and a server start does not import what it does not use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scripts.vendor_protocol import MODULES, TARGET, generated_sources

ROOT = Path(__file__).resolve().parents[1]


def test_vendored_modules_are_the_pinned_wheels_files():
    """A tritonclient pin moved without running scripts/vendor_protocol.py fails here."""
    for name, text in generated_sources().items():
        assert (TARGET / f"{name}.py").read_text(encoding="utf-8") == text, f"rerun scripts.vendor_protocol ({name})"
    assert {path.stem for path in TARGET.glob("*_pb2.py")} == set(MODULES)


def test_vendored_classes_are_tritonclients_own():
    from tritonclient.grpc import model_config_pb2, service_pb2

    from runtime.protocol import model_config_pb2 as ours_config
    from runtime.protocol import service_pb2 as ours_service

    assert ours_config.ModelConfig is model_config_pb2.ModelConfig
    assert ours_service.ModelInferRequest is service_pb2.ModelInferRequest


def test_the_classes_are_shared_whichever_is_imported_first():
    """The server imports its copy first, a model or a test may import tritonclient's after: one class either way
    (both register the same descriptors), so a message of one is a message of the other."""
    probe = ("import runtime.protocol.service_pb2 as ours; from tritonclient.grpc import service_pb2 as theirs; "
             "request = theirs.ModelInferRequest(model_name='m'); "
             "print(ours.ModelInferRequest is theirs.ModelInferRequest, isinstance(request, ours.ModelInferRequest), "
             "ours.ModelInferRequest.FromString(request.SerializeToString()) == request)")
    shared = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert shared.stdout.split() == ["True", "True", "True"]


def test_start_up_imports_leave_out_what_is_loaded_on_demand():
    """``bootstrap run``'s modules alone load neither the client package, gRPC, YAML, metrics, RE2, the extras'
    packages (runtime/extras.py), nor any framework: each comes when a flag, a file, a scrape or a model asks for
    it. The protocol adapters count too: the native gRPC edge and the one port's gRPC serve without grpcio
    (runtime/grpc/status_codes.py), which loads only with one of its own servers."""
    probe = ("import sys, bootstrap.cli, runtime.server, runtime.adapters, runtime.grpc.server, runtime.grpc.native, "
             "runtime.grpc.asgi, runtime.listen.single_port; "
             "print(sorted(m for m in ('tritonclient', 'grpc', 'yaml', 'prometheus_client', 'psutil', 'watchdog', "
             "'onnx', 'onnxruntime', 'torch', 'boto3', 'tensorflow', 'openvino', 're2', 'jinja2', 'tokenizers', "
             "'opentelemetry') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_the_type_stubs_name_every_message_and_enum():
    """runtime/protocol/*_pb2.pyi (scripts/vendor_protocol.py says how they are made) cover the descriptors."""
    from runtime.protocol import model_config_pb2, service_pb2

    for module in (model_config_pb2, service_pb2):
        stub = (ROOT / "runtime" / "protocol" / f"{module.__name__.rsplit('.', 1)[1]}.pyi").read_text()
        names = [*module.DESCRIPTOR.message_types_by_name, *module.DESCRIPTOR.enum_types_by_name]
        missing = [name for name in names if f"class {name}(" not in stub]
        assert not missing, f"stale stubs: regenerate them ({missing})"
