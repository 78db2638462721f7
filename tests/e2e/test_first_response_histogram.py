"""``nv_inference_first_response_histogram_ms`` for every model, decoupled or not, with
``--metrics-config histogram_latencies=true`` (Triton 2.65, server #8580; qa/L0_metrics/histogram_metrics_test.py
checks each model's count and that its sum lies between the requests' wait and that plus a delta). Lone plain
requests, which the native lanes would otherwise serve past the core, are timed too; without the setting the
histogram is not exported, as in Triton."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, python_model_source, write_model

HISTOGRAM = "nv_inference_first_response_histogram_ms"
WAIT_SECONDS = 0.2
DELTA_SECONDS = 0.15
SLOW = python_model_source(f"time.sleep({WAIT_SECONDS})\nreturn [pb_utils.InferenceResponse([pb_utils.Tensor("
                           "'OUT', pb_utils.get_input_tensor_by_name(r, 'IN').as_numpy())]) for r in requests]")


def _serve(tmp_path, *extra: str) -> ServerProcess:
    write_model(tmp_path / "models", "slow", IDENTITY_PYTHON_CONFIG, {"1/model.py": SLOW})
    return ServerProcess(tmp_path / "models", *extra, strict=True)


def _histogram(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    return {sample.name: sample.value for family in text_string_to_metric_families(text) if family.name == HISTOGRAM
            for sample in family.samples if sample.labels.get("model") == "slow"}


def _ask(server: ServerProcess, protocol: str) -> None:
    data = np.ones(2, np.float32)
    if protocol == "http":
        tensor = httpclient.InferInput("IN", [2], "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        answer = httpclient.InferenceServerClient(server.http_url).infer("slow", [tensor])
    else:
        tensor = grpcclient.InferInput("IN", [2], "FP32")
        tensor.set_data_from_numpy(data)
        answer = grpcclient.InferenceServerClient(server.grpc_url).infer("slow", [tensor])
    assert answer.as_numpy("OUT").tolist() == [1.0, 1.0]


def test_a_plain_models_requests_each_count_once(tmp_path):
    with _serve(tmp_path, "--metrics-config", "histogram_latencies=true") as server:
        for request in range(1, 5):
            _ask(server, "http" if request % 2 else "grpc")
            histogram = _histogram(server)
            assert histogram[f"{HISTOGRAM}_count"] == request
            assert (WAIT_SECONDS * 1000 * request <= histogram[f"{HISTOGRAM}_sum"]
                    < (WAIT_SECONDS + DELTA_SECONDS) * 1000 * request)


@pytest.mark.parametrize("setting", [(), ("--metrics-config", "histogram_latencies=false")])
def test_off_unless_asked_for(tmp_path, setting):
    with _serve(tmp_path, *setting) as server:
        _ask(server, "http")
        assert _histogram(server) == {}


def test_a_models_config_sets_its_buckets(tmp_path):
    """Triton 2.52 (core #405): model_metrics { metric_control { metric_identifier { family } histogram_options
    { buckets } } } replaces the default buckets (100, 500, 2000, 5000) for that model."""
    config = IDENTITY_PYTHON_CONFIG + """
    model_metrics { metric_control [ { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
                                       histogram_options { buckets: [ 1000, 50, 1 ] } } ] }
    """
    write_model(tmp_path / "models", "slow", config, {"1/model.py": SLOW})
    with ServerProcess(tmp_path / "models", "--metrics-config", "histogram_latencies=true", strict=True) as server:
        _ask(server, "http")
        text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    counts = _histogram_buckets(text)
    assert list(counts) == ["1", "50", "1000", "+Inf"]
    assert counts == {"1": 0, "50": 0, "1000": 1, "+Inf": 1}  # one request of about 200 ms


def _histogram_buckets(text: str) -> dict[str, float]:
    return {sample.labels["le"]: sample.value for family in text_string_to_metric_families(text)
            if family.name == HISTOGRAM for sample in family.samples
            if sample.name.endswith("_bucket") and sample.labels["model"] == "slow"}
