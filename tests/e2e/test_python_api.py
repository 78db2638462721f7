"""Triton's Python-backend API end to end: BLS, decoupled models, async execute, logger, custom metrics,
response parameters, DLPack, rescheduling, cancellation, auto-complete and the model loading API, through a
real server and the real tritonclient."""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.python_api_models import build_python_api_repository
from tests.support import ServerProcess


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_python_api_repository(tmp_path_factory.mktemp("python-api") / "models")


@pytest.fixture(scope="module", params=[0, 2], ids=["one-process", "two-front-ends"])
def server(repository: Path, request: pytest.FixtureRequest):
    """The server as one process, and with two front-end processes serving HTTP and gRPC over its models."""
    process = ServerProcess(repository, "--device", "cpu", "--model-control-mode", "explicit",
                            "--load-model", "*", "--frontend-processes", str(request.param)).start(timeout=180)
    process.wait_loaded()
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def http(server: ServerProcess):
    client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: ServerProcess):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def _bls(client, target: str, a=(1.0, 2.0, 3.0, 4.0), model: str = "bls") -> tuple[np.ndarray, str]:
    inputs = [httpclient.InferInput("TARGET", [1], "BYTES"), httpclient.InferInput("A", [4], "FP32")]
    inputs[0].set_data_from_numpy(np.array([target.encode()], dtype=object))
    inputs[1].set_data_from_numpy(np.array(a, dtype=np.float32))
    result = client.infer(model, inputs)
    return result.as_numpy("OUT"), result.as_numpy("ERROR")[0].decode()


def _stream(client: grpcclient.InferenceServerClient, model: str, name: str, data: np.ndarray, count: int = 1,
            expect: int | None = None, **options) -> list:
    """Send ``count`` requests on one stream; every callback (result or error) until each request ended (or,
    since a bare final flag is not sent unless asked for, until ``expect`` callbacks came and no more follow)."""
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for index in range(count):
            tensor = grpcclient.InferInput(name, list(data.shape), "INT32")
            tensor.set_data_from_numpy(data)
            client.async_stream_infer(model, [tensor], request_id=str(index), **options)
        received, ended = [], 0
        while ended < count and len(received) != expect:
            result, error = answers.get(timeout=30)
            received.append((result, error))
            if error is not None:
                ended += 1
                continue
            final = result.get_response().parameters["triton_final_response"].bool_param
            ended += final
        if expect is not None:
            time.sleep(0.5)
            assert answers.empty(), "more responses than expected"
        return received
    finally:
        client.stop_stream()


# -- BLS ------------------------------------------------------------------------------------------------------------
def test_bls_calls_an_onnx_model_through_its_scheduler(http):
    before = http.get_inference_statistics("onnx_add_sub")["model_stats"][0]["inference_count"]
    out, error = _bls(http, "onnx_add_sub")
    assert error == ""
    np.testing.assert_array_equal(out, [2.0, 3.0, 4.0, 5.0])
    after = http.get_inference_statistics("onnx_add_sub")["model_stats"][0]["inference_count"]
    assert after == before + 1


def test_bls_requests_are_batched_with_other_requests(http):
    """BLS calls (four in flight at once from each async execute, eight such requests at once) meet the ONNX
    model's dynamic batcher like any request.  Whether a burst coalesces depends on timing (the batcher waits
    only when more requests are arriving, and a tiny model runs as soon as its instance is free), so up to three
    bursts are sent: calls that bypassed the batcher would never share an execution."""
    inputs = [httpclient.InferInput("TARGET", [1], "BYTES"), httpclient.InferInput("A", [4], "FP32")]
    inputs[0].set_data_from_numpy(np.array([b""], dtype=object))
    inputs[1].set_data_from_numpy(np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32))
    for _ in range(3):
        before = http.get_inference_statistics("onnx_add_sub")["model_stats"][0]
        pending = [http.async_infer("async_bls", inputs) for _ in range(8)]
        for request in pending:
            result = request.get_result()
            assert result.as_numpy("ERROR")[0] == b""
            np.testing.assert_array_equal(result.as_numpy("OUT"), np.array([1.0, 2.0, 3.0, 4.0]) * 10)  # (1+2+3+4) a
        after = http.get_inference_statistics("onnx_add_sub")["model_stats"][0]
        assert after["inference_count"] - before["inference_count"] == 32
        if after["execution_count"] - before["execution_count"] < 32:
            return  # some of them ran as one batch
    pytest.fail("three bursts of 32 BLS calls never shared an execution")


def test_bls_to_an_unknown_model_is_an_error_response(http):
    out, error = _bls(http, "no_such_model")
    assert out.size == 0
    code, message = error.split("|", 1)
    assert int(code) == 1  # pb_utils.TritonError.INTERNAL, as Triton's BLS reports it
    assert "'no_such_model'" in message  # the name sent as bytes, read as text


def test_bls_is_bounded_by_its_timeout(http):
    started = time.monotonic()
    out, error = _bls(http, "slow")
    assert time.monotonic() - started < 1.4  # the callee sleeps 1.5 s; the call gave up after 0.2 s
    assert "timed out" in error


def test_bls_from_decoupled_model_yields_each_response(http):
    out, error = _bls(http, "repeat", a=(5.0, 6.0, 7.0, 8.0))
    assert error == ""
    assert out.tolist() == [5, 6, 7, 8, -1]  # the bare final flag arrives as an empty response, as in Triton


def test_bls_calling_itself_without_end_is_stopped(http):
    """bls (2 instances) calls itself: the second nested call could only wait for an instance forever."""
    out, error = _bls(http, "self")
    assert "whose 2 instance(s) are all busy waiting on this chain of BLS calls (bls -> bls)" in error
    assert "it would wait forever" in error


# -- decoupled ------------------------------------------------------------------------------------------------------
def test_decoupled_model_streams_responses_over_grpc(grpc):
    received = _stream(grpc, "repeat", "IN", np.array([4, 5, 6], dtype=np.int32), count=2, expect=6)
    assert all(error is None for _, error in received)
    by_request: dict[str, list] = {}
    for result, _ in received:
        response = result.get_response()
        by_request.setdefault(response.id, []).append(
            (int(result.as_numpy("OUT")[0]), response.parameters["triton_final_response"].bool_param))
    # the final flag came alone, without a response: it is not sent unless asked for
    assert by_request == {"0": [(4, False), (5, False), (6, False)], "1": [(4, False), (5, False), (6, False)]}


def test_empty_final_response_when_asked(grpc):
    received = _stream(grpc, "repeat", "IN", np.array([7], dtype=np.int32), enable_empty_final_response=True)
    responses = [result.get_response() for result, _ in received]
    assert [r.parameters["triton_final_response"].bool_param for r in responses] == [False, True]
    assert responses[1].id == "0" and not responses[1].outputs and responses[1].model_version == ""


def test_decoupled_model_with_zero_responses(grpc):
    received = _stream(grpc, "repeat", "IN", np.zeros([0], dtype=np.int32), enable_empty_final_response=True)
    assert len(received) == 1 and not received[0][0].get_response().outputs


def test_response_after_final_is_refused_in_the_model(grpc, server):
    _stream(grpc, "repeat", "IN", np.array([1], dtype=np.int32), expect=1)
    deadline = time.monotonic() + 10
    while "the final response was already sent" not in server.log():
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.1)


def test_unary_infer_on_decoupled_model_answers_as_triton(http, grpc):
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        http.infer("repeat", [tensor])
    assert info.value.status() == "501"
    assert "HTTP end point doesn't support models with decoupled transaction policy" in info.value.message()
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        grpc.infer("repeat", [tensor])
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in info.value.message()


def test_generate_stream_sends_tokens_as_server_sent_events(server):
    url = f"http://{server.http_url}/v2/models/generate/generate_stream"
    with httpx.stream("POST", url, json={"text_input": "tokens one by one", "id": "g1"}, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    assert [e["text_output"] for e in events] == ["tokens", "one", "by", "one"]
    assert events[0] == {"id": "g1", "model_name": "generate", "model_version": "1", "text_output": "tokens"}


def test_generate_wants_exactly_one_response(server):
    url = f"http://{server.http_url}/v2/models/generate/generate"
    one = httpx.post(url, json={"text_input": "single"}, timeout=30)
    assert one.status_code == 200
    assert one.json() == {"model_name": "generate", "model_version": "1", "text_output": "single"}
    many = httpx.post(url, json={"text_input": "two words"}, timeout=30)
    assert many.status_code == 400
    assert "generate expects model to produce exactly 1 response" in many.json()["error"]
    plain = httpx.post(f"http://{server.http_url}/v2/models/onnx_add_sub/generate",
                       json={"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}, timeout=30)
    assert plain.status_code == 200 and plain.json()["OUTPUT0"] == [2.0, 3.0, 4.0, 5.0]
    bad = httpx.post(url, content=b"{not json", timeout=30)
    assert bad.status_code == 400
    missing = httpx.post(url, json={"other": 1}, timeout=30)
    assert missing.status_code == 400 and "missing required input(s) ['text_input']" in missing.json()["error"]


def test_client_leaving_a_stream_cancels_the_request(server, repository):
    """The model sees is_cancelled() once the client is gone (here: an SSE client that disconnects)."""
    marker = repository / "repeat" / "cancelled"
    marker.unlink(missing_ok=True)
    url = f"http://{server.http_url}/v2/models/repeat/generate_stream"
    with httpx.stream("POST", url, json={"IN": [1, -100], "id": "to-cancel"}, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # got the first response; leave while the model waits
    deadline = time.monotonic() + 10
    while not (marker.exists() and "to-cancel" in marker.read_text()):
        assert time.monotonic() < deadline, "the model never saw the request cancelled"
        time.sleep(0.1)


def test_rescheduled_request_runs_again(grpc):
    received = _stream(grpc, "reschedule", "IN", np.array([0], dtype=np.int32))
    (result, error), = received
    assert error is None
    assert int(result.as_numpy("OUT")[0]) == 2  # executed twice: rescheduled once, then answered


# -- logger, metrics, parameters, dlpack --------------------------------------------------------------------------
def test_logger_metrics_and_response_parameters(http, grpc, server):
    tensor = httpclient.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(np.array([0.5, 5.0, 50.0], dtype=np.float32))
    result = http.infer("observed", [tensor])
    assert result.get_response()["parameters"]["note"] == "hello"
    tensor = grpcclient.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(np.array([0.5, 5.0, 50.0], dtype=np.float32))
    parameters = grpc.infer("observed", [tensor]).get_response().parameters
    assert parameters["count"].int64_param >= 2 and parameters["flag"].bool_param
    metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    assert "# TYPE observed_requests counter" in metrics
    labels = 'flavour="test",model="observed"'
    assert f"observed_requests{{{labels}}} 2" in metrics
    assert f"observed_last_size{{{labels}}} 3" in metrics
    assert f'observed_values_bucket{{{labels},le="1"}} 2' in metrics
    assert f'observed_values_bucket{{{labels},le="+Inf"}} 6' in metrics
    assert f"observed_values_sum{{{labels}}} 111" in metrics
    log = server.log()
    for line in ("observed initialized", "observed counter at 2", "observed error line"):
        assert f"model 'observed': {line}" in log


def test_custom_metric_families_go_with_their_model(http, server):
    http.unload_model("observed")
    metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    assert "observed_requests" not in metrics and "observed_values" not in metrics
    http.load_model("observed")  # and come back with it, counting afresh
    tensor = httpclient.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(np.array([0.5, 5.0, 50.0], dtype=np.float32))
    http.infer("observed", [tensor])
    metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    assert 'observed_requests{flavour="test",model="observed"} 1' in metrics


@pytest.mark.parametrize("model", ["dlpack", "dlpack_thread"])
def test_dlpack_round_trip_with_read_only_inputs(grpc, http, model):
    data = np.array([1.0, -2.0, 3.5], dtype=np.float32)
    tensor = grpcclient.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(data)  # arrives as raw bytes: a read-only buffer
    np.testing.assert_array_equal(grpc.infer(model, [tensor]).as_numpy("OUT"), data * 2)
    tensor = httpclient.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(data, binary_data=True)
    np.testing.assert_array_equal(http.infer(model, [tensor]).as_numpy("OUT"), data * 2)


def test_coroutine_never_awaited_is_a_clear_error(http):
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        http.infer("bad_code", [tensor])
    assert "model 'bad_code' execute returned a coroutine that was never awaited" in info.value.message()


# -- auto-complete and the model loading API ----------------------------------------------------------------------
def test_config_less_model_is_completed_by_auto_complete_config(http):
    config = http.get_model_config("auto_complete")
    assert config["backend"] == "python" and config["max_batch_size"] == 8
    assert [i["name"] for i in config["input"]] == ["X"] and [o["name"] for o in config["output"]] == ["Y"]
    assert config["dynamic_batching"]["preferred_batch_size"] == [8]
    tensor = httpclient.InferInput("X", [2, 3], "FP32")
    tensor.set_data_from_numpy(np.ones([2, 3], dtype=np.float32))
    np.testing.assert_array_equal(http.infer("auto_complete", [tensor]).as_numpy("Y"), np.full([2, 3], 2.0))


def test_disable_auto_complete_config(repository: Path, tmp_path: Path):
    with ServerProcess(repository, "--device", "cpu", "--model-control-mode", "explicit", "--load-model",
                       "auto_complete", "--disable-auto-complete-config", log=tmp_path / "server.log") as process:
        process.wait_loaded()
        index = httpx.post(f"http://{process.http_url}/v2/repository/index", timeout=10).json()
    row, = [r for r in index if r["name"] == "auto_complete"]
    assert row["state"] == "UNAVAILABLE" and "no config.pbtxt" in row["reason"]


def test_model_loading_api_from_a_model(http):
    def act(action: str) -> bool:
        tensor = httpclient.InferInput("ACTION", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([action.encode()], dtype=object))
        return bool(http.infer("control", [tensor]).as_numpy("READY")[0])

    assert act("check") is True
    assert act("unload") is False
    assert not http.is_model_ready("controlled")
    assert act("load") is True
    assert http.is_model_ready("controlled")


def test_model_loading_api_refused_outside_explicit_mode(repository: Path, tmp_path: Path):
    with ServerProcess(repository, "--device", "cpu", log=tmp_path / "server.log") as process:
        process.wait_loaded()
        client = httpclient.InferenceServerClient(process.http_url)
        tensor = httpclient.InferInput("ACTION", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b"unload"], dtype=object))
        with pytest.raises(InferenceServerException) as info:
            client.infer("control", [tensor])
        assert "explicit model load / unload is not allowed" in info.value.message()
        assert client.is_model_ready("controlled")
