"""The logging extension changes what the server logs at once: levels, verbose records (models' log_verbose
included) and the timestamp format."""

from __future__ import annotations

import re
import time

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, write_model

CHATTY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        logger = pb_utils.Logger
        for request in requests:
            tag = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            logger.log_verbose(f"verbose-{tag}")
            logger.log_info(f"info-{tag}")
            logger.log_warn(f"warning-{tag}")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy())]) for r in requests]
"""


def _call(client, tag: int) -> None:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([tag], np.float32))
    client.infer("chatty", [tensor])


def _wait_for(process: ServerProcess, text: str) -> None:
    deadline = time.monotonic() + 10
    while text not in process.log():
        assert time.monotonic() < deadline, f"{text!r} never logged"
        time.sleep(0.05)


def test_log_settings_take_effect_at_once(tmp_path):
    write_model(tmp_path / "models", "chatty", IDENTITY_PYTHON_CONFIG, {"1/model.py": CHATTY})
    with ServerProcess(tmp_path / "models") as process:
        client = httpclient.InferenceServerClient(process.http_url)
        base = f"http://{process.http_url}/v2/logging"
        assert httpx.get(base).json() == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                                          "log_verbose_level": 0, "log_format": "default"}
        _call(client, 1)
        _wait_for(process, "warning-1")
        assert "info-1" in process.log() and "verbose-1" not in process.log()

        settings = httpx.post(base, json={"log_info": False, "log_verbose_level": 1}).json()
        assert settings["log_info"] is False and settings["log_verbose_level"] == 1
        _call(client, 2)
        _wait_for(process, "warning-2")
        assert "verbose-2" in process.log() and "info-2" not in process.log()

        grpc = grpcclient.InferenceServerClient(process.grpc_url)
        grpc.update_log_settings({"log_info": True, "log_verbose_level": 0, "log_format": "ISO8601"})
        _call(client, 3)
        _wait_for(process, "warning-3")
        line = next(line for line in process.log().splitlines() if "info-3" in line)
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d ", line), line  # ISO 8601 timestamps from now on
        assert "verbose-3" not in process.log()
        assert grpc.get_log_settings(as_json=True)["settings"]["log_format"]["string_param"] == "ISO8601"

        refused = httpx.post(base, json={"log_file": "/tmp/somewhere-else.log"})
        assert refused.status_code == 501 and "can not be updated" in refused.json()["error"]
        assert httpx.post(base, json={"log_warning": "no"}).status_code == 400
        assert httpx.get(base).json()["log_warning"] is True  # a refused request changes nothing
