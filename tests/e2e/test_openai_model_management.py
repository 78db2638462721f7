"""``POST /v1/models/{model}/load`` and ``/unload`` on the OpenAI-compatible endpoints, as Triton 2.68's OpenAI
frontend answers them (python/openai: routers/model_management.py, engine/triton_engine.py): explicit model control
only, the model ready (or gone) when the answer comes, FastAPI's ``{"detail": ...}`` for a refusal."""

from __future__ import annotations

import httpx
import pytest

from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, python_model_source, write_model


@pytest.fixture
def repository(tmp_path):
    write_model(tmp_path / "models", "tiny", IDENTITY_PYTHON_CONFIG, {"1/model.py": python_model_source(
        "return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', pb_utils.get_input_tensor_by_name(r, 'IN')"
        ".as_numpy())]) for r in requests]")})
    return tmp_path / "models"


def test_load_and_unload_in_explicit_mode(repository):
    with ServerProcess(repository, "--model-control-mode", "explicit") as server:
        base = f"http://{server.http_url}/v1/models"
        assert httpx.get(f"{base}/tiny").status_code == 404  # not loaded at start
        loaded = httpx.post(f"{base}/tiny/load", timeout=60)
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["id"] == "tiny" and loaded.json()["object"] == "model"
        assert httpx.get(f"http://{server.http_url}/v2/models/tiny/ready").status_code == 200  # ready on answer
        again = httpx.post(f"{base}/tiny/load")
        assert (again.status_code, again.json()) == (400, {"detail": "Model 'tiny' is already loaded"})
        unloaded = httpx.post(f"{base}/tiny/unload", timeout=60)
        assert (unloaded.status_code, unloaded.json()) == (200, {"status": "success", "model": "tiny"})
        assert httpx.get(f"http://{server.http_url}/v2/models/tiny/ready").status_code != 200
        again = httpx.post(f"{base}/tiny/unload")
        assert (again.status_code, again.json()) == (400, {"detail": "Unknown model: tiny"})
        unknown = httpx.post(f"{base}/nope/load")
        assert unknown.status_code == 400 and unknown.json()["detail"].startswith("Failed to load model 'nope': ")


def test_refused_unless_models_are_controlled_explicitly(repository):
    with ServerProcess(repository) as server:
        for action in ("load", "unload"):
            answer = httpx.post(f"http://{server.http_url}/v1/models/tiny/{action}")
            assert (answer.status_code, answer.json()) == (
                400, {"detail": "Model load/unload requires --model-control-mode=explicit"})
