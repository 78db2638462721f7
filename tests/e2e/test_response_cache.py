"""The response cache: hits skip the model and show in statistics and metrics, errors and sequences are never
cached, a reload invalidates, and the byte budget holds under many distinct inputs."""

from __future__ import annotations

import queue
import re
import tracemalloc

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from runtime.extensions.response_cache import ARRAY_OVERHEAD_BYTES, ENTRY_OVERHEAD_BYTES, ResponseCache
from runtime.types import InferRequest, InferTensor, ModelOutputs, RequestedOutput
from tests.support import ServerProcess, write_model

# OUT = IN * 2 + the number of times execute ran before (so a cached answer is recognisable); IN < 0: an error.
COUNTING = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executions = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if (data < 0).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("IN must not be negative")))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data * 2 + self.executions)]))
            self.executions += 1
        return responses
"""
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
CACHE_BYTES = 64 * 1024


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "models"
    write_model(root, "cached", CONFIG + "response_cache { enable: true }\n", {"1/model.py": COUNTING})
    write_model(root, "uncached", CONFIG, {"1/model.py": COUNTING})
    process = ServerProcess(root, "--cache-config", f"local,size={CACHE_BYTES}", "--model-control-mode", "explicit",
                            "--load-model", "*")
    with process:
        yield process, root


def _infer(client, model: str, values, **kwargs) -> np.ndarray:
    tensor = httpclient.InferInput("IN", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.asarray(values, dtype=np.float32))
    return client.infer(model, [tensor], **kwargs).as_numpy("OUT")


def _stats(client, model: str) -> dict:
    return client.get_inference_statistics(model)["model_stats"][0]


def _metric(process, name: str, labels: str = "") -> float:
    text = httpx.get(f"http://127.0.0.1:{process.metrics_port}/metrics").text
    match = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name}{labels} not in /metrics"
    return float(match.group(1))


def test_hits_skip_the_model_and_show_in_statistics_and_metrics(served):
    process, _ = served
    client = httpclient.InferenceServerClient(process.http_url)
    first = _infer(client, "cached", [1, 2, 3])
    for _ in range(3):  # the same request: the stored answer (execute would have added 1, 2, 3)
        np.testing.assert_array_equal(_infer(client, "cached", [1, 2, 3]), first)
    binary = _infer(client, "cached", [1, 2, 3], outputs=[httpclient.InferRequestedOutput("OUT", binary_data=True)])
    np.testing.assert_array_equal(binary, first)  # how an output travels is not part of the key
    grpc = grpcclient.InferenceServerClient(process.grpc_url)
    tensor = grpcclient.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(grpc.infer("cached", [tensor]).as_numpy("OUT"), first)
    assert _infer(client, "cached", [1, 2, 4]).tolist() == [3, 5, 9]  # new input: executes (once before)

    stats = _stats(client, "cached")
    assert stats["inference_stats"]["cache_hit"]["count"] == 5
    assert stats["inference_stats"]["cache_miss"]["count"] == 2
    assert stats["inference_stats"]["success"]["count"] == 7
    assert stats["inference_count"] == 2 and stats["execution_count"] == 2  # hits are not inferences
    labels = '{model="cached",version="1"}'
    assert _metric(process, "nv_cache_num_hits_per_model", labels) == 5
    assert _metric(process, "nv_cache_num_misses_per_model", labels) == 2
    assert _metric(process, "nv_cache_num_entries") == 2
    assert _metric(process, "nv_inference_count", labels) == 2

    _infer(client, "uncached", [1, 2, 3])
    assert _infer(client, "uncached", [1, 2, 3]).tolist() == [3, 5, 7]  # no cache for this model
    assert _stats(client, "uncached")["inference_stats"]["cache_miss"]["count"] == 0


def test_requests_on_a_grpc_stream_use_the_cache_too(served):
    process, _ = served
    client = grpcclient.InferenceServerClient(process.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    outputs = []
    for _ in range(3):  # one after the other: requests in flight together would each miss
        tensor = grpcclient.InferInput("IN", [2], "FP32")
        tensor.set_data_from_numpy(np.array([4, 5], np.float32))
        client.async_stream_infer("cached", [tensor])
        result, error = answers.get(timeout=30)
        assert error is None, error
        outputs.append(result.as_numpy("OUT").tolist())
    client.stop_stream()
    assert outputs == [[8.0, 10.0]] * 3  # executed once: a second execution would have added 1
    stats = _stats(httpclient.InferenceServerClient(process.http_url), "cached")
    assert stats["inference_stats"]["cache_hit"]["count"] == 2 and stats["execution_count"] == 1


def test_errors_and_sequences_are_never_cached_and_a_reload_invalidates(served):
    process, root = served
    client = httpclient.InferenceServerClient(process.http_url)
    for _ in range(2):
        with pytest.raises(InferenceServerException, match="must not be negative"):
            _infer(client, "cached", [-1])
    assert _stats(client, "cached")["inference_stats"]["cache_hit"]["count"] == 0
    assert _stats(client, "cached")["inference_stats"]["fail"]["count"] == 2

    answers = {_infer(client, "cached", [5], sequence_id=7).item() for _ in range(2)}
    assert answers == {10.0, 11.0}  # a request of a sequence always runs

    cached = _infer(client, "cached", [8])
    np.testing.assert_array_equal(_infer(client, "cached", [8]), cached)
    model_file = root / "cached" / "1" / "model.py"
    model_file.write_text(COUNTING.replace("data * 2", "data * 3"))
    client.load_model("cached")  # the new version's answers, not the old one's stored ones
    assert _infer(client, "cached", [8]).tolist() == [24.0]
    assert _metric(process, "nv_cache_num_entries") == 1


def test_the_byte_budget_holds_under_many_distinct_inputs(served):
    process, _ = served
    client = httpclient.InferenceServerClient(process.http_url)
    for start in range(400):  # 400 distinct answers of 1 KiB each: several times the budget
        _infer(client, "cached", np.arange(start, start + 256))
    assert _metric(process, "nv_cache_util") <= 1.0
    entries = _metric(process, "nv_cache_num_entries")
    assert 0 < entries * 1024 <= CACHE_BYTES
    assert _metric(process, "nv_cache_num_evictions") >= 400 - entries
    np.testing.assert_array_equal(_infer(client, "cached", np.arange(399, 655)),  # the newest is still there
                                  _infer(client, "cached", np.arange(399, 655)))


def test_the_cache_keeps_private_copies_and_evicts_least_recently_used():
    class Version:
        name, version = "m", 1

    model = Version()
    cache = ResponseCache(capacity_bytes=3 * (ENTRY_OVERHEAD_BYTES + ARRAY_OVERHEAD_BYTES + 400))

    def request(value: float) -> InferRequest:
        data = np.full(100, value, np.float32)
        return InferRequest("m", inputs=[InferTensor("IN", "FP32", (100,), data)], outputs=[RequestedOutput("OUT")])

    produced = np.full(100, 1.0, np.float32)
    key = cache.key(model, request(1))
    cache.insert(key, model, ModelOutputs({"OUT": produced}))
    produced[:] = -1  # the producer reuses its buffer (a worker's shared memory): the stored answer must not change
    assert cache.lookup(key)["OUT"][0] == 1.0
    assert cache.key(model, request(1)) == key and cache.key(model, request(2)) != key
    for value in (2, 3):
        cache.insert(cache.key(model, request(value)), model, ModelOutputs({"OUT": np.zeros(100, np.float32)}))
    cache.lookup(key)  # 1 is now the most recently used: 2 goes first
    cache.insert(cache.key(model, request(4)), model, ModelOutputs({"OUT": np.zeros(100, np.float32)}))
    assert cache.lookup(cache.key(model, request(2))) is None and cache.lookup(key) is not None
    cache.evict_model(model)
    assert cache.counters().entries == 0 and cache.counters().used_bytes == 0


def test_tiny_entries_are_counted_at_their_real_size():
    """The budget is memory: 20,000 one-float answers must count what they take (once counted at a third)."""
    class Version:
        name, version = "m", 1

    cache = ResponseCache(capacity_bytes=1 << 30)
    answers = [ModelOutputs({"OUT": np.array([float(i)], np.float32)}) for i in range(20_000)]
    keys = [cache.key(Version, InferRequest("m", inputs=[InferTensor("IN", "FP32", (1,), np.array([i], np.float32))],
                                            outputs=[RequestedOutput("OUT")]))
            for i in range(20_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for key, answer in zip(keys, answers, strict=True):
            cache.insert(key, Version, answer)
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = cache.counters().used_bytes
    assert 0.8 * taken <= counted <= 1.5 * taken, (counted, taken)
