"""Header forwarding (``--http-header-forward-pattern``, ``--grpc-header-forward-pattern``) and the reserved keys it
must never set (Triton 2.69, server #8763): Triton's qa/L0_parameters cases ``test_headers``,
``test_grpc_header_forward_pattern_case_sensitive``, ``test_headers_reserved_rejected`` and
``test_params_reserved_rejected``, over tritonclient's HTTP and gRPC clients (plain, async, streaming, through an
ensemble) and raw HTTP, on two ports and on the one port."""

from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from runtime.header_forward import RESERVED_PARAMETER_KEYS
from tests.support import ServerProcess, write_model

# the model of Triton's qa/L0_parameters: a request's parameters as two string tensors, their keys and values
PARAMETER_MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            parameters = json.loads(request.parameters())
            keys = np.array([key.encode() for key in parameters], dtype=np.object_)
            values = np.array([str(value).encode() for value in parameters.values()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("key", keys), pb_utils.Tensor("value", values)]))
        return responses
"""
PARAMETER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "key" data_type: TYPE_STRING dims: [ -1 ] }, { name: "value" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "key" data_type: TYPE_STRING dims: [ -1 ] }, { name: "value" data_type: TYPE_STRING dims: [ -1 ] } ]
ensemble_scheduling { step [ {
  model_name: "parameter" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" }
  output_map [ { key: "key" value: "key" }, { key: "value" value: "value" } ]
} ] }
"""
# qa/L0_parameters' headers, and the ones its pattern MY_HEADER.* forwards (in any case)
FORWARD_HEADERS = {"header_1": "value_1", "header_2": "value_2", "my_header_1": "my_value_1",
                   "my_header_2": "my_value_2", "my_header_3": 'This is a "quoted" string with a backslash\\ '}
MY_HEADERS = {key: value for key, value in FORWARD_HEADERS.items() if key.startswith("my_")}
# the reserved keys of its test: Triton's seven, and three with the internal prefix
RESERVED_KEYS = sorted(RESERVED_PARAMETER_KEYS) + ["triton_enable_empty_final_response", "triton_final_response",
                                                   "triton_injected_via_header"]
MODES = {"two ports": (), "one port": ("--single-port",)}


def _serve(tmp_path_factory, pattern: str | None, mode: str) -> ServerProcess:
    repository = tmp_path_factory.mktemp("header-forward") / "models"
    write_model(repository, "parameter", PARAMETER_CONFIG, {"1/model.py": PARAMETER_MODEL})
    write_model(repository, "ensemble", ENSEMBLE_CONFIG)
    (repository / "ensemble" / "1").mkdir(exist_ok=True)
    flags = [] if pattern is None else ["--http-header-forward-pattern", pattern, "--grpc-header-forward-pattern",
                                        pattern]
    return ServerProcess(repository, *flags, *MODES[mode])


def _grpc_url(server: ServerProcess, mode: str) -> str:
    return server.http_url if mode == "one port" else server.grpc_url


@pytest.fixture(scope="module", params=list(MODES))
def forwarding(request, tmp_path_factory):
    """Triton's ``test_headers`` server: MY_HEADER.* forwarded over both protocols."""
    with _serve(tmp_path_factory, "MY_HEADER.*", request.param) as server:
        yield server, request.param


def _inputs(module):
    inputs = [module.InferInput("INPUT0", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.asarray([1], dtype=np.float32))
    return inputs


def _forwarded(result) -> dict[str, str]:
    keys = result.as_numpy("key").astype(str).tolist()
    values = result.as_numpy("value").astype(str).tolist()
    return dict(zip(keys, values, strict=True))


def _every_client(server: ServerProcess, mode: str, headers: dict[str, str], model: str = "parameter") -> list:
    """The results of one request through each of tritonclient's ways, as Triton's suite sends it."""
    http = httpclient.InferenceServerClient(server.http_url)
    grpc_client = grpcclient.InferenceServerClient(_grpc_url(server, mode))
    results = [
        http.infer(model, _inputs(httpclient), headers=dict(headers)),
        http.async_infer(model, _inputs(httpclient), headers=dict(headers)).get_result(),
        grpc_client.infer(model, _inputs(grpcclient), headers=dict(headers)),
    ]
    answers: queue.Queue = queue.Queue()
    grpc_client.async_infer(model, _inputs(grpcclient), lambda result, error: answers.put(error or result),
                            headers=dict(headers))
    results.append(answers.get(timeout=30))
    grpc_client.start_stream(lambda result, error: answers.put(error or result), headers=dict(headers))
    grpc_client.async_stream_infer(model, _inputs(grpcclient))
    results.append(answers.get(timeout=30))
    grpc_client.stop_stream()
    http.close()
    grpc_client.close()
    return results


def test_matching_headers_become_parameters(forwarding):
    server, mode = forwarding
    for model in ("parameter", "ensemble"):
        for way, result in enumerate(_every_client(server, mode, FORWARD_HEADERS, model)):
            assert not isinstance(result, InferenceServerException), result
            # the two HTTP ways first: their parser drops a value's trailing whitespace (RFC 9110 5.5; Triton's
            # evhtp keeps it, a difference in the README); gRPC metadata keeps it
            expected = {key: value.rstrip() for key, value in MY_HEADERS.items()} if way < 2 else MY_HEADERS
            assert _forwarded(result) == expected, (model, way)


def test_forwarded_beside_the_request_s_own_parameters(forwarding):
    server, _ = forwarding
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("parameter", _inputs(httpclient), parameters={"key1": "value1"},
                          headers={"My_Header_1": "x"})
    assert _forwarded(result) == {"key1": "value1", "my_header_1": "x"}


def test_under_concurrent_load(forwarding):
    """Each request gets its own headers, never another's."""
    server, mode = forwarding

    def one(index: int) -> bool:
        if index % 2:
            client = grpcclient.InferenceServerClient(_grpc_url(server, mode))
            module = grpcclient
        else:
            client = httpclient.InferenceServerClient(server.http_url)
            module = httpclient
        try:
            return all(_forwarded(client.infer("parameter", _inputs(module), headers={"my_header": str(index)}))
                       == {"my_header": str(index)} for _ in range(10))
        finally:
            client.close()

    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(one, range(32)))


def test_reserved_headers_refused(tmp_path_factory):
    """Triton's ``test_headers_reserved_rejected``: with pattern .*, each reserved key sent as a header refuses
    the request, in Triton's words, over raw HTTP (400) and both clients."""
    with _serve(tmp_path_factory, ".*", "two ports") as server:
        http = httpclient.InferenceServerClient(server.http_url)
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
        for key in RESERVED_KEYS:
            answer = httpx.post(f"http://{server.http_url}/v2/models/parameter/infer", json=body,
                                headers={key: "dummy-value"})
            assert answer.status_code == 400
            assert answer.json() == {"error": f"Header '{key}' is reserved for Triton usage and cannot be forwarded."}
            for client, module in ((http, httpclient), (grpc_client, grpcclient)):
                with pytest.raises(InferenceServerException, match="reserved for Triton usage") as refused:
                    client.infer("parameter", _inputs(module), headers={key: "dummy-value"})
                if module is grpcclient:
                    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        answers: queue.Queue = queue.Queue()
        grpc_client.start_stream(lambda result, error: answers.put(error or result), headers={"priority": "1"})
        grpc_client.async_stream_infer("parameter", _inputs(grpcclient), request_id="s1")
        refused = answers.get(timeout=30)
        assert isinstance(refused, InferenceServerException)
        assert "Header 'priority' is reserved for Triton usage" in refused.message()
        grpc_client.stop_stream()
        # a plain header is still forwarded under the same pattern
        assert _forwarded(http.infer("parameter", _inputs(httpclient), headers={"x-plain": "1"}))["x-plain"] == "1"


def test_case_sensitive_pattern(tmp_path_factory):
    """Triton's ``test_grpc_header_forward_pattern_case_sensitive``: (?-i)MY_HEADER.* forwards none of the
    lowercase headers (gRPC metadata keys are lowercase)."""
    with _serve(tmp_path_factory, "(?-i)MY_HEADER.*", "two ports") as server:
        for result in _every_client(server, "two ports", FORWARD_HEADERS):
            assert _forwarded(result) == {}


def test_reserved_parameters_refused_by_the_client_and_server(tmp_path_factory):
    """Triton's ``test_params_reserved_rejected``: tritonclient refuses the reserved keys itself; a raw HTTP body
    with a ``triton_`` key is refused by the server (forwarding off)."""
    with _serve(tmp_path_factory, None, "two ports") as server:
        http = httpclient.InferenceServerClient(server.http_url)
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        for key in RESERVED_KEYS:
            if key.startswith("triton_"):
                body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}],
                        "parameters": {key: "dummy-value"}}
                answer = httpx.post(f"http://{server.http_url}/v2/models/parameter/infer", json=body)
                assert answer.status_code == 400 and "reserved for Triton usage" in answer.text
            for client, module in ((http, httpclient), (grpc_client, grpcclient)):
                with pytest.raises(InferenceServerException, match="is a reserved parameter and cannot be specified"):
                    client.infer("parameter", _inputs(module), parameters={key: "dummy-value"})
        # headers are not forwarded without the flags
        assert _forwarded(http.infer("parameter", _inputs(httpclient), headers={"my_header_1": "x"})) == {}
