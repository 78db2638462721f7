"""The wheel is what images install: built, installed non-editable into a fresh venv, served from elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from examples.build_models import EXAMPLE_REPOSITORY, build_example_models
from tests.support import ROOT, ServerProcess

PACKAGES = ("runtime", "handlers", "bootstrap")


def test_the_wheel_holds_every_module_of_the_source_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {str(path.relative_to(ROOT)) for package in PACKAGES for path in (ROOT / package).rglob("*.py")
               if "__pycache__" not in path.parts}
    assert sources, "no sources found"
    assert sources - names == set()
    assert "triton_python_backend_utils.py" in names
    assert not any(name.startswith(("tests/", "examples/", "scripts/")) for name in names)


def test_the_installed_wheel_serves_http_and_grpc_from_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"{wheel}[onnx]"], check=True)
    repository = tmp_path / "elsewhere" / "models"
    shutil.copytree(EXAMPLE_REPOSITORY, repository, ignore=shutil.ignore_patterns("model.onnx", "model.pt"))
    build_example_models(repository)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    process = ServerProcess(repository, env=env, log=tmp_path / "server.log")
    process.command = lambda: [str(venv / "bin" / "bootstrap"), "run", "--model-repository", str(repository),
                               "--host", "127.0.0.1", "--http-port", str(process.http_port),
                               "--grpc-port", str(process.grpc_port), "--metrics-port", str(process.metrics_port),
                               *process.extra]
    process.start(cwd=tmp_path / "elsewhere")
    try:
        http = httpclient.InferenceServerClient(process.http_url)
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        assert http.infer("simple_onnx", inputs).as_numpy("OUTPUT0").tolist() == (a + a).tolist()
        grpc = grpcclient.InferenceServerClient(process.grpc_url)
        text = grpcclient.InferInput("TEXT", [2], "BYTES")
        text.set_data_from_numpy(np.array([b"hello", b"wheel"], dtype=object))
        assert grpc.infer("text_python", [text]).as_numpy("UPPER").tolist() == [b"HELLO", b"WHEEL"]
        index = {row["name"]: row for row in httpx.post(f"http://{process.http_url}/v2/repository/index").json()}
        assert index["simple_torch"]["state"] == "UNAVAILABLE"  # torch is not in this venv: the reason says how
        assert "pip install 'serverless-triton[torch]'" in index["simple_torch"]["reason"]
    finally:
        assert process.stop() == 0, process.log()
