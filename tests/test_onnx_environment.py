"""handlers/onnx/environment.py: what onnxruntime must find in the environment, set unless the user set it."""

from __future__ import annotations

import os

from handlers.onnx.environment import ONNXRUNTIME_ENVIRONMENT, quiet_onnxruntime


def test_telemetry_is_turned_off_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("ORT_DISABLE_TELEMETRY", raising=False)
    quiet_onnxruntime()
    assert os.environ["ORT_DISABLE_TELEMETRY"] == "1" == ONNXRUNTIME_ENVIRONMENT["ORT_DISABLE_TELEMETRY"]
    monkeypatch.setenv("ORT_DISABLE_TELEMETRY", "0")
    quiet_onnxruntime()
    assert os.environ["ORT_DISABLE_TELEMETRY"] == "0"
