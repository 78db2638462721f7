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


TOKEN = "s3cr3t-t0ken-value"


def _chatter_with_the_token(process: ServerProcess) -> None:
    """Calls that carry the token in every way a client sends it: gRPC on the one port (hpack decodes its
    headers), REST over HTTP/1.1 and HTTP/2, and a wrong token (also a credential, someone's)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    grpc = grpcclient.InferenceServerClient(process.http_url)
    for _ in range(20):
        assert grpc.is_server_ready(headers={"authorization": f"Bearer {TOKEN}"})
    with httpx.Client(http1=False, http2=True, base_url=f"http://{process.http_url}") as client:
        for _ in range(10):
            client.get("/v2", headers=headers)
    for _ in range(10):
        httpx.get(f"http://{process.http_url}/v2", headers=headers)
        httpx.get(f"http://{process.http_url}/v2", headers={"Authorization": "Bearer someone-elses-token"})


def test_no_credential_reaches_the_log_at_any_level(tmp_path):
    """Verbose logging (over the API, or --log-level DEBUG at start) never writes a token or an Authorization
    header, whoever logs it: the server's own loggers and third-party ones (hpack, on the one port)."""
    write_model(tmp_path / "models", "chatty", IDENTITY_PYTHON_CONFIG, {"1/model.py": CHATTY})
    environment = {"AWS_SECRET_ACCESS_KEY": "aws-secret-key-value"}
    with ServerProcess(tmp_path / "models", "--single-port", "true", "--auth-token", TOKEN,
                       env=environment) as process:
        settings = httpx.post(f"http://{process.http_url}/v2/logging", json={"log_verbose_level": 1},
                              headers={"Authorization": f"Bearer {TOKEN}"}).json()
        assert settings["log_verbose_level"] == 1
        _chatter_with_the_token(process)
        time.sleep(0.3)
        log = process.log()
    assert TOKEN not in log and "someone-elses-token" not in log
    with ServerProcess(tmp_path / "models", "--single-port", "true", "--auth-token", TOKEN, "--log-level", "DEBUG",
                       env=environment, log=tmp_path / "debug.log") as process:
        _chatter_with_the_token(process)
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([5], np.float32))
        httpclient.InferenceServerClient(process.http_url).infer("chatty", [tensor],
                                                                 headers={"Authorization": f"Bearer {TOKEN}"})
        _wait_for(process, "verbose-5")  # debug records are written
        log = process.log()
    assert TOKEN not in log and "someone-elses-token" not in log and "aws-secret-key-value" not in log


def test_a_credential_in_any_record_is_redacted():
    import logging

    from runtime.extensions.log_settings import SecretRedaction

    redaction = SecretRedaction(["my-storage-secret"])
    record = logging.LogRecord("hpack.hpack", logging.DEBUG, __file__, 1, "Decoded %s, consumed %d bytes",
                               ((b"authorization", b"Bearer abc.DEF-123"), 7), None)
    assert redaction.filter(record)
    assert record.getMessage() == "Decoded (b'authorization', b'Bearer [redacted]'), consumed 7 bytes"
    try:
        raise ValueError("the key my-storage-secret was refused; Authorization: Basic dXNlcjpwYXNz")
    except ValueError:
        import sys

        failed = logging.LogRecord("boto", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    redaction.filter(failed)
    assert "my-storage-secret" not in failed.exc_text and "dXNlcjpwYXNz" not in failed.exc_text
