"""The container image's recipe, tested without a container engine.

The Dockerfile's install step is scripts/install.sh: here it runs as written, into a fresh venv from the wheel,
and the result serves the example repository (ONNX, TorchScript and Python models) and answers the image's own
HEALTHCHECK command. The Dockerfile itself is read instruction by instruction and held to what a production
image needs (non-root, ports, health check, entrypoint, every COPY source present and not ignored).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from examples.build_models import EXAMPLE_REPOSITORY, build_example_models
from tests.support import ROOT, ServerProcess, free_port

DOCKERFILE = ROOT / "Dockerfile"


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, arguments = line.partition(" ")
        result.append((keyword.upper(), arguments.strip()))
    return result


def final_stage(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last = max(index for index, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last:]


def test_the_dockerfile_builds_a_non_root_image_with_ports_health_and_entrypoint():
    steps = instructions()
    stages = [arguments for keyword, arguments in steps if keyword == "FROM"]
    assert any(stage.endswith("AS wheel") for stage in stages) and "base-${FLAVOR}" in stages[-1]
    arguments = dict(argument.split("=", 1) for keyword, argument in steps if keyword == "ARG" and "=" in argument)
    assert "${BASE_GPU} AS base-gpu" in stages and arguments["BASE_GPU"].startswith("nvidia/cuda:")
    assert "${BASE_CPU} AS base-cpu" in stages and arguments["BASE_CPU"] == "python:3.11-slim-bookworm"
    image = final_stage(steps)
    runs = [arguments for keyword, arguments in image if keyword == "RUN"]
    assert any("/opt/serverless-triton/install.sh /opt/venv" in run and '"${FLAVOR}"' in run for run in runs)
    users = [arguments for keyword, arguments in image if keyword == "USER"]
    assert users and users[-1].isdigit() and int(users[-1]) != 0
    exposed = {port for keyword, arguments in image if keyword == "EXPOSE" for port in arguments.split()}
    assert exposed == {"8000", "8001", "8002"}
    assert json.loads(dict(image)["ENTRYPOINT"]) == ["bootstrap", "run"]
    assert dict(image)["STOPSIGNAL"] == "SIGTERM"
    assert "/v2/health/ready" in dict(image)["HEALTHCHECK"]


def test_every_copied_source_exists_and_is_not_docker_ignored():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for keyword, arguments in instructions():
        if keyword != "COPY" or arguments.startswith("--from"):
            continue
        *sources, _ = shlex.split(arguments)
        for source in sources:
            assert (ROOT / source).exists(), source
            assert not any(fnmatch.fnmatch(source, pattern) or source.startswith(pattern.rstrip("/") + "/")
                           for pattern in ignored), f"{source} is excluded by .dockerignore"


def healthcheck_command() -> list[str]:
    arguments = dict(final_stage(instructions()))["HEALTHCHECK"]
    return json.loads(arguments[arguments.index("CMD") + 3:].strip())


@pytest.mark.timeout(900)
def test_the_install_script_installs_an_image_that_serves_and_passes_its_healthcheck(wheel, tmp_path):
    venv = tmp_path / "opt-venv"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), str(venv), "cpu", str(wheel)],
                             env=env, capture_output=True, text=True, timeout=840)
    assert install.returncode == 0, install.stdout + install.stderr
    assert subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), str(venv), "cpu", str(wheel)], env=env,
                          capture_output=True, text=True).returncode == 2  # never over an existing venv
    used = subprocess.run([str(venv / "bin" / "python"), "-c", "import bootstrap.cli, runtime.server\n"
                           "from runtime import dataclass_code\nprint(dataclass_code.compiled_code_used())"],
                          env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert int(used.stdout) > 100, used.stderr  # the start's dataclass code, compiled by the install

    models = tmp_path / "models"
    shutil.copytree(EXAMPLE_REPOSITORY, models, ignore=shutil.ignore_patterns("model.onnx", "model.pt"))
    build_example_models(models)
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    check = subprocess.run(["bootstrap", "check", "--model-repository", str(models), "--device", "cpu"], env=env,
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "5 model(s), 5 version(s) ready, 0 failed" in check.stdout  # ONNX, TorchScript and Python models

    port = free_port()
    process = ServerProcess(models, env={**env, "PORT": str(port)}, log=tmp_path / "server.log")
    process.http_port = port
    process.command = lambda: ["bootstrap", "run", "--model-repository", str(models), "--host", "127.0.0.1",
                               "--grpc-port", str(process.grpc_port), "--metrics-port", str(process.metrics_port)]
    process.start(cwd=tmp_path)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/v2/models/simple_torch/ready").status_code == 200
        health = subprocess.run(healthcheck_command(), env={**env, "PORT": str(port)}, capture_output=True,
                                timeout=30)
        assert health.returncode == 0, health.stderr
    finally:
        assert process.stop() == 0
    down = subprocess.run(healthcheck_command(), env={**env, "PORT": str(port)}, capture_output=True, timeout=30)
    assert down.returncode != 0  # the check can fail: nothing serves there now
