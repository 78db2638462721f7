"""`bootstrap run`: settings, start-up logs, and graceful shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from bootstrap.settings import SettingsError, load_settings, parse_settings
from tests.support import IDENTITY_PYTHON_CONFIG, ROOT, ServerProcess, write_model

SLOW_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils
import time, json
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marker = Path(config["parameters"]["finalize_marker"]["string_value"])

    def execute(self, requests):
        time.sleep(1.5)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                .as_numpy() * 2)]) for r in requests]

    def finalize(self):
        self.marker.write_text("finalized")
'''


def test_parse_settings_defaults_and_errors(tmp_path):
    settings = parse_settings({"model_repository": "repo", "server": {"http_port": 9000}}, tmp_path)
    assert settings.repository_path() == tmp_path / "repo"
    assert settings.http_port == 9000
    assert parse_settings({"server": {"http_port": None}}, tmp_path).http_port is None
    assert settings.frontend_processes == 0
    assert parse_settings({"server": {"frontend_processes": 3}}, tmp_path).frontend_processes == 3
    assert parse_settings({"server": {"frontend_processes": "auto"}}, tmp_path).frontend_processes == len(
        os.sched_getaffinity(0)) - 1
    for bad, fragment in [
        ({"server": {"frontend_processes": -1}}, "server.frontend_processes"),
        ({"server": {"frontend_processes": 65}}, "server.frontend_processes"),
        ({"server": {"frontend_processes": True}}, "server.frontend_processes"),
        ({"server": {"http_port": 70000}}, "server.http_port"),
        ({"instance": {"device": "tpu"}}, "instance.device"),
        ({"unknown_key": 1}, "unknown function.yaml keys"),
        ({"model_repository": 5}, "model_repository"),
        ([1, 2], "mapping at the top level"),
        ({"shutdown_timeout_seconds": -1}, "shutdown_timeout_seconds"),
    ]:
        with pytest.raises(SettingsError, match=fragment):
            parse_settings(bad, tmp_path)


def test_bundled_function_yaml_points_at_the_example_repository():
    settings = load_settings(ROOT / "function.yaml")
    assert settings.repository_path() == ROOT / "examples" / "model_repository"
    assert settings.http_port == 8000


def test_invalid_function_yaml_exits_2_with_a_clear_error(tmp_path):
    config = tmp_path / "function.yaml"
    config.write_text("server: {http_port: 'eighty'}\n")
    result = subprocess.run([sys.executable, "-m", "bootstrap.cli", "run", "--config", str(config)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "server.http_port must be a port number" in result.stderr


def test_missing_repository_exits_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bootstrap.cli", "run", "--model-repository",
                             str(tmp_path / "nope")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "is not a folder" in result.stderr


def test_startup_logs_each_model_with_version_and_device(server):
    log = server.log()
    assert "loaded model 'simple_onnx' version 1 (onnxruntime, 1 instance(s) on cpu)" in log
    assert "loaded model 'simple_torch' version 1 (pytorch" in log
    assert "model 'broken_syntax' UNAVAILABLE" in log


def _slow_repository(tmp_path: Path) -> tuple[Path, Path]:
    repository = tmp_path / "models"
    marker = tmp_path / "finalized.txt"
    write_model(
        repository, "slow_python",
        IDENTITY_PYTHON_CONFIG + f'parameters {{ key: "finalize_marker" value {{ string_value: "{marker}" }} }}\n',
        {"1/model.py": SLOW_MODEL},
    )
    return repository, marker


@pytest.mark.parametrize("sig, group", [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGINT, True)],
                         ids=["SIGTERM", "SIGINT", "SIGINT-to-the-process-group"])
def test_signal_drains_in_flight_requests_finalizes_and_exits_0(tmp_path, sig, group):
    """Ctrl-C in a terminal signals the whole group: the Python workers too, and they must still finalize."""
    repository, marker = _slow_repository(tmp_path)
    process = ServerProcess(repository).start(new_session=group)
    results: dict[str, object] = {}

    def call() -> None:
        client = httpclient.InferenceServerClient(process.http_url, network_timeout=30)
        tensor = httpclient.InferInput("IN", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
        try:
            results["out"] = client.infer("slow_python", [tensor]).as_numpy("OUT")
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion below
            results["error"] = exc

    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(0.5)  # the request is now executing
    if group:
        os.killpg(process.process.pid, sig)
    else:
        process.process.send_signal(sig)
    time.sleep(0.3)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{process.http_url}/v2/health/ready", timeout=2).raise_for_status()
    worker.join(30)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.process.wait(60)  # it exits on the first signal: a second one, sent while it exits, would kill it
    code = process.stop()
    assert "error" not in results, results.get("error")
    np.testing.assert_array_equal(results["out"], np.array([2.0, 4.0], dtype=np.float32))
    assert code == 0, process.log()
    assert marker.read_text() == "finalized"
    assert "unloaded model 'slow_python' version 1" in process.log()


def test_a_port_in_use_exits_1(tmp_path):
    import socket

    repository, _ = _slow_repository(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        process = ServerProcess(repository)
        process.http_port = taken.getsockname()[1]
        process.start(wait_ready=False)
        assert process.process.wait(60) == 1
    log = process.log()
    assert "Address already in use" in log or "address" in log.lower()
    # models start loading while the listeners bind: a bind failure winds the load down cleanly
    assert "Traceback" not in log, log
