"""Dynamic batching, instance groups, queue policy, worker isolation and metrics, against a real server."""

from __future__ import annotations

import asyncio
import textwrap
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_models import build_add_sub_onnx, build_dense_onnx
from tests.support import ServerProcess, python_model_source, write_model

BATCHED_ONNX = """
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 5000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

# no dynamic batching: each request an execution of its own (queued ones may reach a worker thread together)
UNBATCHED_DENSE = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 512 ] } ]
"""

PY_BATCHED_CONFIG = """
backend: "python"
max_batch_size: 16
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""
PY_BATCHED = python_model_source("""
time.sleep(0.02)
return [pb_utils.InferenceResponse([
    pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 10),
    pb_utils.Tensor("REQUESTS", np.full((pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().shape[0], 1),
                                        len(requests), dtype=np.int32)),
]) for r in requests]
""")

SLOW_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching {{ }}
"""
# dynamic_batching needs max_batch_size > 0: the queue policy of an unbatched model comes from this form instead
QUEUED_CONFIG = """
backend: "python"
max_batch_size: 1
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { default_queue_policy { max_queue_size: 2 default_timeout_microseconds: %d } }
"""
SLOW_ECHO_BODY = """
time.sleep(0.4)
return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
        for r in requests]
"""
SLOW_ECHO = python_model_source(SLOW_ECHO_BODY)

FRAGILE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
parameters { key: "execute_timeout_seconds" value { string_value: "2" } }
"""
FRAGILE = python_model_source("""
value = float(pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0])
if value == -1:
    os._exit(3)
if value == -2:
    os.kill(os.getpid(), 9)
if value == -3:
    time.sleep(3600)
time.sleep(0.2)
return [pb_utils.InferenceResponse([
    pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()),
    pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
]) for r in requests]
""")


@pytest.fixture(scope="module")
def started_log(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("abandoned") / "started.txt"


@pytest.fixture(scope="module")
def batch_server(tmp_path_factory, started_log):
    repository = tmp_path_factory.mktemp("batching") / "models"
    write_model(repository, "abandoned", QUEUED_CONFIG % 0, {"1/model.py": python_model_source(
        f"open({str(started_log)!r}, 'a').write('x')\n" + textwrap.dedent(SLOW_ECHO_BODY).replace("0.4", "1.5"))})
    build_add_sub_onnx(repository / "batched_onnx" / "1" / "model.onnx", dims=-1)
    write_model(repository, "batched_onnx", BATCHED_ONNX)
    write_model(repository, "batched_python", PY_BATCHED_CONFIG, {"1/model.py": PY_BATCHED})
    write_model(repository, "bounded_queue", QUEUED_CONFIG % 0, {"1/model.py": SLOW_ECHO})
    write_model(repository, "queue_timeout", QUEUED_CONFIG.replace("max_queue_size: 2", "max_queue_size: 8") % 300_000,
                {"1/model.py": SLOW_ECHO})
    write_model(repository, "fragile", FRAGILE_CONFIG, {"1/model.py": FRAGILE})
    build_dense_onnx(repository / "unbatched_dense" / "1" / "model.onnx", width=512, layers=4)
    write_model(repository, "unbatched_dense", UNBATCHED_DENSE)
    for name, allow in (("override_timeout", "true"), ("fixed_timeout", "false")):
        config = QUEUED_CONFIG.replace("max_queue_size: 2", f"max_queue_size: 8 allow_timeout_override: {allow}")
        write_model(repository, name, config % 0, {"1/model.py": SLOW_ECHO})
    process = ServerProcess(repository).start()
    yield process
    assert process.stop() == 0, process.log()


def _stats(server, model: str) -> dict:
    return httpx.get(f"http://{server.http_url}/v2/models/{model}/stats").json()["model_stats"][0]


async def _concurrent_add_sub(url: str, count: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
    client = grpc_aio.InferenceServerClient(url)

    async def one(index: int):
        rows = 1 + index % 3
        a = np.full((rows, 4), index, dtype=np.float32) + np.arange(4, dtype=np.float32)
        b = np.full((rows, 4), 0.5 * index, dtype=np.float32)
        inputs = [grpc_aio.InferInput("INPUT0", list(a.shape), "FP32"), grpc_aio.InferInput("INPUT1", list(b.shape),
                                                                                          "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = await client.infer("batched_onnx", inputs, request_id=str(index))
        return index, result, a, b

    try:
        results = await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await client.close()
    return [(i, r.as_numpy("OUTPUT0"), r.as_numpy("OUTPUT1"), a, b, r.get_response().id) for i, r, a, b in results]


def test_200_concurrent_requests_each_get_their_own_result(batch_server):
    results = asyncio.run(_concurrent_add_sub(batch_server.grpc_url, 200))
    for index, out0, out1, a, b, response_id in results:
        assert response_id == str(index)
        np.testing.assert_array_equal(out0, a + b)
        np.testing.assert_array_equal(out1, a - b)
    stats = _stats(batch_server, "batched_onnx")
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert max(sizes) > 3, sizes  # several requests shared an execution
    assert stats["inference_count"] == sum(1 + i % 3 for i in range(200))
    assert stats["execution_count"] < 200


def test_ragged_requests_run_separately_and_correctly(batch_server):
    async def main():
        client = grpc_aio.InferenceServerClient(batch_server.grpc_url)
        try:
            calls = []
            for index in range(40):
                width = 2 + index % 5
                a = np.full((1, width), index, dtype=np.float32)
                inputs = [grpc_aio.InferInput(n, [1, width], "FP32") for n in ("INPUT0", "INPUT1")]
                for tensor in inputs:
                    tensor.set_data_from_numpy(a)
                calls.append((a, client.infer("batched_onnx", inputs)))
            for a, result in zip([c[0] for c in calls], await asyncio.gather(*(c[1] for c in calls)), strict=True):
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
        finally:
            await client.close()

    asyncio.run(main())


def test_python_backend_receives_the_list_of_requests(batch_server):
    client_count = 48

    def call(index: int, results: dict) -> None:
        client = httpclient.InferenceServerClient(batch_server.http_url)
        tensor = httpclient.InferInput("IN", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[index]], dtype=np.float32))
        try:
            result = client.infer("batched_python", [tensor])
        finally:
            client.close()  # in the thread that made it: gevent's pool cannot be joined from another thread
        results[index] = (result.as_numpy("OUT"), int(result.as_numpy("REQUESTS")[0, 0]))

    results: dict = {}
    threads = [threading.Thread(target=call, args=(i, results)) for i in range(client_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(results) == list(range(client_count))
    for index, (out, _) in results.items():
        assert out.tolist() == [[index * 10.0]]
    assert max(requests for _, requests in results.values()) > 1
    stats = _stats(batch_server, "batched_python")
    assert all(b["batch_size"] <= 16 for b in stats["batch_stats"])


def _echo(url: str, model: str, value: float, **kwargs):
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    tensor = httpclient.InferInput("IN", [1, 1] if model != "fragile" else [1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]] if model != "fragile" else [value], dtype=np.float32))
    try:
        return client.infer(model, [tensor], **kwargs)
    finally:
        client.close()  # in the thread that made it (callers run it in threads)


def _run_concurrently(count: int, target) -> list:
    outcomes: list = [None] * count

    def run(index: int) -> None:
        try:
            outcomes[index] = target(index)
        except InferenceServerException as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes


def test_overload_is_rejected_at_once_without_losing_accepted_requests(batch_server):
    outcomes = _run_concurrently(10, lambda i: _echo(batch_server.http_url, "bounded_queue", float(i)))
    rejected = [o for o in outcomes if isinstance(o, InferenceServerException)]
    accepted = [(i, o) for i, o in enumerate(outcomes) if not isinstance(o, InferenceServerException)]
    assert rejected, "a queue of 2 must refuse some of 10 concurrent requests"
    for error in rejected:
        assert error.status() == "503"
        assert "Exceeds maximum queue size" in error.message()
    assert len(accepted) >= 2
    for index, result in accepted:
        assert result.as_numpy("OUT").tolist() == [[float(index)]]
    stats = _stats(batch_server, "bounded_queue")
    assert stats["inference_stats"]["success"]["count"] == len(accepted)
    text = httpx.get(f"http://127.0.0.1:{batch_server.metrics_port}/metrics").text
    rejected_line = 'nv_inference_request_failure{model="bounded_queue",reason="REJECTED",version="1"} '
    assert int(text.split(rejected_line, 1)[1].split()[0]) >= len(rejected)


def test_queued_requests_time_out_without_running(batch_server):
    before = _stats(batch_server, "queue_timeout")["execution_count"]
    outcomes = _run_concurrently(6, lambda i: _echo(batch_server.http_url, "queue_timeout", float(i)))
    timed_out = [o for o in outcomes if isinstance(o, InferenceServerException)]
    assert timed_out
    assert all(o.status() == "503" and "Request timeout expired" in o.message() for o in timed_out)
    executed = _stats(batch_server, "queue_timeout")["execution_count"] - before
    assert executed == 6 - len(timed_out)  # a request that timed out in the queue never ran
    result = _echo(batch_server.http_url, "queue_timeout", 1.0, timeout=5_000_000)  # a per-request timeout (µs)
    assert result.as_numpy("OUT").tolist() == [[1.0]]


@pytest.mark.parametrize("model, overridable", [("override_timeout", True), ("fixed_timeout", False)])
def test_a_request_timeout_counts_only_where_the_queue_policy_allows_it(batch_server, model, overridable):
    """As Triton: the request's own timeout applies under allow_timeout_override, and is ignored otherwise."""
    outcomes = _run_concurrently(4, lambda i: _echo(batch_server.http_url, model, float(i), timeout=100_000))
    timed_out = [o for o in outcomes if isinstance(o, InferenceServerException)]
    if overridable:
        assert timed_out and all("Request timeout expired" in o.message() for o in timed_out)
    else:
        assert not timed_out, timed_out


@pytest.mark.parametrize("value, fragment", [(-1, "exited with code 3"), (-2, "killed by signal 9"),
                                             (-3, "did not finish within 2s")],
                         ids=["os._exit", "SIGKILL", "hang"])
def test_worker_crash_or_hang_fails_only_its_request_and_recovers(batch_server, value, fragment):
    def call(index: int):
        return _echo(batch_server.http_url, "fragile", value if index == 0 else float(index))

    outcomes = _run_concurrently(4, call)
    assert isinstance(outcomes[0], InferenceServerException)
    assert outcomes[0].status() == "500"
    assert fragment in outcomes[0].message() and "restarted" in outcomes[0].message()
    for index in (1, 2, 3):  # the other instance kept serving (or the restarted one did)
        assert not isinstance(outcomes[index], InferenceServerException), outcomes[index]
        assert outcomes[index].as_numpy("OUT").tolist() == [float(index)]
    after = _echo(batch_server.http_url, "fragile", 7.0)
    assert after.as_numpy("OUT").tolist() == [7.0]


def test_instance_group_count_runs_separate_workers(batch_server):
    outcomes = _run_concurrently(6, lambda i: _echo(batch_server.http_url, "fragile", float(i + 1)))
    pids = {int(o.as_numpy("PID")[0]) for o in outcomes}
    assert len(pids) == 2


def test_metrics_endpoint(batch_server):
    asyncio.run(_concurrent_add_sub(batch_server.grpc_url, 50))
    text = httpx.get(f"http://127.0.0.1:{batch_server.metrics_port}/metrics").text
    lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line and not line.startswith("#")}
    labels = '{model="batched_onnx",version="1"}'
    assert lines[f"nv_inference_request_success{labels}"] >= 50
    assert lines[f"nv_inference_count{labels}"] >= lines[f"nv_inference_exec_count{labels}"]
    assert lines[f"nv_inference_request_duration_us{labels}"] > 0
    assert "# TYPE nv_inference_queue_duration_us counter" in text
    # Triton 2.52 (core #397): how long each loaded model version took to load
    assert "# TYPE nv_model_load_duration_secs gauge" in text and 0 < lines[f"nv_model_load_duration_secs{labels}"] < 60
    bucket_one = lines['serverless_triton_batch_size_bucket{model="batched_onnx",version="1",le="1"}']
    total = lines['serverless_triton_batch_size_count{model="batched_onnx",version="1"}']
    assert total > bucket_one  # some executions had batches larger than 1
    failures = [lines[f'nv_inference_request_failure{{model="bounded_queue",reason="{reason}",version="1"}}']
                for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")]  # Triton's reasons, each its own series
    assert sum(failures) == _stats(batch_server, "bounded_queue")["inference_stats"]["fail"]["count"]
    assert "# TYPE nv_inference_request_failure counter" in text
    assert 0.0 <= lines["nv_cpu_utilization"] <= 1.0 and lines["nv_cpu_memory_total_bytes"] > 0


def test_a_request_whose_client_went_away_is_never_run(batch_server, started_log):
    """One slow request holds the single instance; two more queue, their clients give up, and they never run."""
    failed_before = _stats(batch_server, "abandoned")["inference_stats"]["fail"]["count"]
    holder = threading.Thread(target=lambda: _echo(batch_server.http_url, "abandoned", 1.0))
    holder.start()
    deadline = time.monotonic() + 30
    while not (started_log.exists() and started_log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert started_log.read_text() == "x"  # the holder is executing: what comes next must queue
    http_client = httpclient.InferenceServerClient(batch_server.http_url, network_timeout=0.2)
    tensor = httpclient.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[2.0]], dtype=np.float32))
    with pytest.raises(Exception):  # noqa: B017 - the client's own timeout, whatever its type
        http_client.infer("abandoned", [tensor])
    grpc_client = grpcclient.InferenceServerClient(batch_server.grpc_url)
    grpc_tensor = grpcclient.InferInput("IN", [1, 1], "FP32")
    grpc_tensor.set_data_from_numpy(np.array([[3.0]], dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("abandoned", [grpc_tensor], client_timeout=0.2)
    assert "Deadline" in info.value.message() or "DEADLINE" in str(info.value.status())
    holder.join(30)
    deadline = time.monotonic() + 30
    while _stats(batch_server, "abandoned")["inference_stats"]["fail"]["count"] < failed_before + 2:
        assert time.monotonic() < deadline, "the abandoned requests were never dropped"
        time.sleep(0.02)
    metrics = httpx.get(f"http://127.0.0.1:{batch_server.metrics_port}/metrics").text
    assert 'nv_inference_request_failure{model="abandoned",reason="CANCELED",version="1"} 2' in metrics
    assert started_log.read_text() == "x"
    assert _stats(batch_server, "abandoned")["execution_count"] == 1


def test_an_unbatched_onnx_model_under_load_answers_each_request_from_its_own_run(batch_server):
    """Queued requests of a model without dynamic batching may reach its worker thread together: each still runs
    alone (its answer that of bare onnxruntime on its input) and counts as one execution."""
    import onnxruntime

    before = int(_stats(batch_server, "unbatched_dense")["execution_count"])
    session = onnxruntime.InferenceSession(str(batch_server.repository / "unbatched_dense" / "1" / "model.onnx"))
    client = grpcclient.InferenceServerClient(batch_server.grpc_url)

    def call(index: int) -> bool:
        data = np.random.default_rng(index).standard_normal((1, 512)).astype(np.float32)
        tensor = grpcclient.InferInput("INPUT0", [1, 512], "FP32")
        tensor.set_data_from_numpy(data)
        answer = client.infer("unbatched_dense", [tensor]).as_numpy("OUTPUT0")
        return np.allclose(answer, session.run(None, {"INPUT0": data})[0], rtol=1e-5, atol=1e-5)

    outcomes = _run_concurrently(96, call)
    assert all(outcome is True for outcome in outcomes), outcomes
    assert int(_stats(batch_server, "unbatched_dense")["execution_count"]) - before == 96
