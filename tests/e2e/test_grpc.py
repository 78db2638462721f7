"""gRPC end to end: tritonclient.grpc (sync and aio), a raw stub, and malformed requests."""

from __future__ import annotations

import asyncio
import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from examples.build_models import TORCH_BIAS, TORCH_WEIGHT


def _add_sub_inputs(a: np.ndarray, b: np.ndarray, module=grpcclient) -> list:
    inputs = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def test_health_and_server_metadata(grpc_client):
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()
    metadata = grpc_client.get_server_metadata(as_json=True)
    assert metadata["name"] == "triton"  # as Triton answers: tools check it
    assert "binary_tensor_data" in metadata["extensions"]


def test_model_ready_metadata_and_config(grpc_client):
    assert grpc_client.is_model_ready("simple_onnx")
    assert not grpc_client.is_model_ready("simple_onnx", "9")
    assert not grpc_client.is_model_ready("broken_syntax")
    metadata = grpc_client.get_model_metadata("simple_onnx", as_json=True)
    assert metadata["versions"] == ["1"]
    assert metadata["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]}
    config = grpc_client.get_model_config("simple_onnx").config
    assert config.name == "simple_onnx"
    assert config.max_batch_size == 8
    assert list(config.input[0].dims) == [16]


def test_infer_onnx(grpc_client):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.float32)
    result = grpc_client.infer("simple_onnx", _add_sub_inputs(a, b), request_id="g-1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response.id == "g-1"
    assert response.model_version == "1"


def test_infer_torchscript_and_requested_outputs(grpc_client):
    x = np.ones((2, 4), dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT__0", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = grpc_client.infer("simple_torch", [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT__0")])
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), x @ TORCH_WEIGHT + TORCH_BIAS, rtol=1e-6)


def test_infer_bytes(grpc_client):
    tensor = grpcclient.InferInput("TEXT", [2], "BYTES")
    tensor.set_data_from_numpy(np.array([b"grpc", "straße".encode()], dtype=np.object_))
    result = grpc_client.infer("text_python", [tensor])
    assert list(result.as_numpy("UPPER")) == [b"GRPC", b"STRASSE"]
    np.testing.assert_array_equal(result.as_numpy("LENGTH"), [4, 7])


def test_repository_index_and_statistics(grpc_client):
    index = grpc_client.get_model_repository_index(as_json=True)["models"]
    rows = {(m["name"], m.get("version", "")): m for m in index}
    assert rows[("simple_onnx", "1")]["state"] == "READY"
    assert rows[("broken_syntax", "")]["state"] == "UNAVAILABLE"
    assert "syntax error" in rows[("broken_syntax", "")]["reason"]
    before = grpc_client.get_inference_statistics("simple_torch", as_json=True)["model_stats"][0]
    tensor = grpcclient.InferInput("INPUT__0", [3, 4], "FP32")
    tensor.set_data_from_numpy(np.zeros((3, 4), dtype=np.float32))
    grpc_client.infer("simple_torch", [tensor])
    after = grpc_client.get_inference_statistics("simple_torch", as_json=True)["model_stats"][0]
    assert int(after["inference_count"]) == int(before.get("inference_count", 0)) + 3
    assert int(after["execution_count"]) == int(before.get("execution_count", 0)) + 1
    success = after["inference_stats"]["success"]
    assert int(success["count"]) >= 1 and int(success["ns"]) > 0


def test_stream_infer(grpc_client, server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        for index in range(5):
            a = np.full((1, 16), index, dtype=np.float32)
            client.async_stream_infer("simple_onnx", _add_sub_inputs(a, a), request_id=str(index))
        bad = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
        client.async_stream_infer("simple_onnx", [bad], request_id="bad")
        seen = {}
        errors = []
        for _ in range(6):
            result, error = responses.get(timeout=30)
            if error is not None:
                errors.append(error)
            else:
                seen[result.get_response().id] = result.as_numpy("OUTPUT0")
    finally:
        client.stop_stream()
        client.close()
    assert sorted(seen) == ["0", "1", "2", "3", "4"]
    for key, output in seen.items():
        np.testing.assert_array_equal(output, np.full((1, 16), 2 * int(key), dtype=np.float32))
    assert len(errors) == 1 and "expected 2 inputs but got 1" in errors[0].message()


def test_aio_client(server):
    async def main() -> None:
        client = grpcclient_aio.InferenceServerClient(server.grpc_url)
        try:
            assert await client.is_server_ready()
            a = np.arange(16, dtype=np.float32).reshape(1, 16)
            results = await asyncio.gather(
                *(client.infer("simple_onnx", _add_sub_inputs(a, a * k, grpcclient_aio)) for k in range(8))
            )
            for k, result in enumerate(results):
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a * k)

            async def requests():
                for k in range(3):
                    yield {"model_name": "simple_onnx", "inputs": _add_sub_inputs(a, a, grpcclient_aio),
                           "request_id": f"s{k}"}

            ids = []
            async for result, error in client.stream_infer(requests()):
                assert error is None
                ids.append(result.get_response().id)
                if len(ids) == 3:
                    break
            assert sorted(ids) == ["s0", "s1", "s2"]
        finally:
            await client.close()

    asyncio.run(main())


def test_seed_style_raw_stub_request(server):
    """The way the seed's users call it: a raw stub, raw_input_contents, with_call and metadata."""
    channel = grpc.insecure_channel(server.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    request = service_pb2.ModelInferRequest(model_name="simple_onnx", id="raw-1")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        assert tensor.name == name
        request.raw_input_contents.append(a.tobytes())
    request.outputs.add(name="OUTPUT1")
    response, call = stub.ModelInfer.with_call(request, metadata=[("x-request-source", "seed")])
    assert call.code() == grpc.StatusCode.OK
    assert [o.name for o in response.outputs] == ["OUTPUT1"]
    output = np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(response.outputs[0].shape)
    np.testing.assert_array_equal(output, np.zeros((1, 16), dtype=np.float32))
    channel.close()


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(
        server.grpc_url, options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    )
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _request(model: str = "simple_onnx", **inputs) -> service_pb2.ModelInferRequest:
    return service_pb2.ModelInferRequest(model_name=model, **inputs)


def _assert_status(stub, request, code: grpc.StatusCode, *fragments: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == code, info.value.details()
    for fragment in fragments:
        assert fragment in info.value.details(), info.value.details()


def _fp32(name: str, shape: list[int]) -> service_pb2.ModelInferRequest.InferInputTensor:
    return service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype="FP32", shape=shape)


def test_raw_contents_count_mismatch(stub):
    request = _request(inputs=[_fp32("INPUT0", [1, 16]), _fp32("INPUT1", [1, 16])],
                       raw_input_contents=[b"\0" * 64])
    _assert_status(stub, request, grpc.StatusCode.INVALID_ARGUMENT,
                   "unable to find data for input tensor 'INPUT1' for model 'simple_onnx' in request.")


def test_raw_contents_byte_size_mismatch(stub):
    request = _request(inputs=[_fp32("INPUT0", [1, 16]), _fp32("INPUT1", [1, 16])],
                       raw_input_contents=[b"\0" * 64, b"\0" * 63])
    _assert_status(stub, request, grpc.StatusCode.INVALID_ARGUMENT,
                   "input byte size mismatch for input 'INPUT1' for model 'simple_onnx'. Expected 64, got 63")


def test_unknown_datatype(stub):
    bad = service_pb2.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FLOAT", shape=[1, 16])
    request = _request(inputs=[bad, _fp32("INPUT1", [1, 16])], raw_input_contents=[b"\0" * 64] * 2)
    _assert_status(stub, request, grpc.StatusCode.INVALID_ARGUMENT,
                   "inference input 'INPUT0' data-type is '<invalid>', but model 'simple_onnx' expects 'FP32'")


def test_typed_contents_element_count_mismatch(stub):
    first = _fp32("INPUT0", [1, 16])
    first.contents.fp32_contents.extend([1.0] * 16)
    second = _fp32("INPUT1", [1, 16])
    second.contents.fp32_contents.extend([1.0] * 15)
    _assert_status(stub, _request(inputs=[first, second]), grpc.StatusCode.INVALID_ARGUMENT,
                   "input byte size mismatch for input 'INPUT1' for model 'simple_onnx'. Expected 64, got 60")


def test_typed_contents_work(stub):
    first = _fp32("INPUT0", [1, 16])
    first.contents.fp32_contents.extend(range(16))
    second = _fp32("INPUT1", [1, 16])
    second.contents.fp32_contents.extend([1.0] * 16)
    response = stub.ModelInfer(_request(inputs=[first, second]), timeout=30)
    out = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
    np.testing.assert_array_equal(out, np.arange(16, dtype=np.float32) + 1)


def test_shape_mismatch_and_missing_inputs(stub):
    request = _request(inputs=[_fp32("INPUT0", [1, 8]), _fp32("INPUT1", [1, 16])],
                       raw_input_contents=[b"\0" * 32, b"\0" * 64])
    _assert_status(stub, request, grpc.StatusCode.INVALID_ARGUMENT, "unexpected shape for input 'INPUT0'")
    request = _request(inputs=[_fp32("INPUT0", [1, 16])], raw_input_contents=[b"\0" * 64])
    _assert_status(stub, request, grpc.StatusCode.INVALID_ARGUMENT, "expected 2 inputs but got 1", "INPUT1")
    request = _request(inputs=[_fp32("INPUT0", [1, -1]), _fp32("INPUT1", [1, 16])],
                       raw_input_contents=[b"", b"\0" * 64])
    _assert_status(stub, request, grpc.StatusCode.INVALID_ARGUMENT,
                   "All input dimensions should be specified for input 'INPUT0' for model 'simple_onnx', got [1,-1]")
    request = _request(inputs=[_fp32("INPUT0", [-1, 16]), _fp32("INPUT1", [1, 16])],
                       raw_input_contents=[b"", b"\0" * 64])
    _assert_status(stub, request, grpc.StatusCode.INVALID_ARGUMENT,
                   "input 'INPUT0' batch size does not match other inputs for 'simple_onnx'")


def test_unknown_model_and_unsupported_parameters(stub):
    _assert_status(stub, _request("no_such_model"), grpc.StatusCode.NOT_FOUND, "unknown model", "no_such_model")
    request = _request(inputs=[_fp32("INPUT0", [1, 16]), _fp32("INPUT1", [1, 16])],
                       raw_input_contents=[b"\0" * 64] * 2)
    request.parameters["shared_memory_region"].string_param = "region0"
    _assert_status(stub, request, grpc.StatusCode.NOT_FOUND, "Unable to find shared memory region: 'region0'")
    _assert_status(stub, _request("broken_syntax"), grpc.StatusCode.NOT_FOUND,
                   "Request for unknown model: 'broken_syntax' is not found", "syntax error")


def test_server_keeps_serving_after_malformed_requests(stub, grpc_client):
    for _ in range(3):
        with pytest.raises(grpc.RpcError):
            stub.ModelInfer(_request(inputs=[_fp32("INPUT0", [1, 16])], raw_input_contents=[b"x"]), timeout=30)
    assert grpc_client.is_server_live()
    a = np.ones((1, 16), dtype=np.float32)
    np.testing.assert_array_equal(grpc_client.infer("simple_onnx", _add_sub_inputs(a, a)).as_numpy("OUTPUT0"), a * 2)


def test_64mb_tensor_round_trip(grpc_client):
    big = np.random.default_rng(1).standard_normal(16 * 1024 * 1024).astype(np.float32)  # 64 MiB
    tensor = grpcclient.InferInput("IN", [big.size], "FP32")
    tensor.set_data_from_numpy(big)
    result = grpc_client.infer("identity_python", [tensor], client_timeout=120)
    np.testing.assert_array_equal(result.as_numpy("OUT"), big)


def test_message_over_the_limit_is_resource_exhausted(stub, grpc_client):
    too_big = np.zeros(33 * 1024 * 1024, dtype=np.float32)  # 132 MiB > the 128 MiB default
    request = service_pb2.ModelInferRequest(model_name="identity_python")
    request.inputs.add(name="IN", datatype="FP32", shape=[too_big.size])
    request.raw_input_contents.append(too_big.tobytes())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert grpc_client.is_server_live()


def test_exceptions_carry_grpc_status_for_tritonclient(grpc_client):
    with pytest.raises(InferenceServerException) as info:
        grpc_client.get_model_metadata("no_such_model")
    assert info.value.status() == "StatusCode.NOT_FOUND"


def test_undecodable_messages_are_invalid_argument_and_leave_no_traceback(server):
    before = len(server.log())
    channel = grpc.insecure_channel(server.grpc_url)
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw)
    stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                   request_serializer=lambda raw: raw,
                                   response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
    for _ in range(3):
        with pytest.raises(grpc.RpcError) as info:
            infer(b"\xff" * 100_000, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "is not a valid inference.ModelInferRequest message" in info.value.details()
    (answer,) = list(stream(iter([b"\xff" * 1000]), timeout=10))
    assert "is not a valid inference.ModelInferRequest message" in answer.error_message
    channel.close()
    assert len(server.log()) - before < 200  # nothing per message, let alone its size


def test_long_names_echoed_in_errors_stay_within_the_clients_limits(grpc_client, stub):
    name = "m" * 200_000
    with pytest.raises(InferenceServerException) as info:
        grpc_client.get_model_metadata(name)
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert len(info.value.message().encode()) < 1200 and info.value.message().endswith("(truncated)")
    with pytest.raises(grpc.RpcError) as raw_info:
        stub.ModelInfer(service_pb2.ModelInferRequest(model_name="é" * 100_000), timeout=10)
    assert raw_info.value.code() == grpc.StatusCode.NOT_FOUND


def test_every_method_is_served_trace_settings_included(stub):
    settings = stub.TraceSetting(service_pb2.TraceSettingRequest(), timeout=10).settings
    assert {key: list(value.value) for key, value in settings.items()} == {
        "trace_level": ["OFF"], "trace_rate": ["1000"], "trace_count": ["-1"], "log_frequency": ["0"],
        "trace_file": [""], "trace_mode": ["triton"]}  # Triton's defaults
