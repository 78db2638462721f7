"""The inference core through its declared interface, in process (no server, no port): metadata, readiness,
inference, its errors, and the same calls through the REST app over it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from examples.build_models import build_add_sub_onnx
from runtime.errors import InvalidArgument, NotFound
from runtime.types import InferRequest, InferTensor, RequestedOutput
from tests.conftest import ONNX_ADD_SUB_CONFIG
from tests.in_process import core, rest
from tests.support import write_model


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "models"
    write_model(root, "simple", ONNX_ADD_SUB_CONFIG)
    build_add_sub_onnx(root / "simple" / "1" / "model.onnx", datatype="INT32")
    return root


def _request(rows: int = 2, datatype: str = "INT32") -> InferRequest:
    data = np.arange(rows * 16, dtype=np.int32).reshape(rows, 16)
    tensors = [InferTensor(name, datatype, (rows, 16), data) for name in ("INPUT0", "INPUT1")]
    return InferRequest("simple", inputs=tensors)


def test_metadata_readiness_and_inference(repository):
    async def main():
        async with core(repository) as service:
            assert service.live() and service.ready() and service.model_ready("simple")
            metadata = service.model_metadata("simple")
            assert metadata["platform"] == "onnxruntime_onnx"
            assert [i["shape"] for i in metadata["inputs"]] == [[-1, 16], [-1, 16]]
            response = await service.infer(_request())
            outputs = {t.name: t.data for t in response.outputs}
            np.testing.assert_array_equal(outputs["OUTPUT0"], np.arange(32, dtype=np.int32).reshape(2, 16) * 2)
            assert service.model_statistics("simple")["model_stats"][0]["inference_count"] == 2
    asyncio.run(main())


def test_errors_carry_their_status(repository):
    async def main():
        async with core(repository) as service:
            with pytest.raises(NotFound, match="unknown model"):
                await service.infer(InferRequest("nonexistent"))
            with pytest.raises(InvalidArgument, match="data-type is 'FP32', but model 'simple' expects 'INT32'"):
                await service.infer(_request(datatype="FP32"))
            with pytest.raises(InvalidArgument, match="batch-size must be <= 8"):
                await service.infer(_request(rows=9))
    asyncio.run(main())


def test_rest_routes_over_the_core(repository):
    async def main():
        async with core(repository) as service, rest(service) as client:
            assert (await client.get("/v2/health/ready")).status_code == 200
            body = {"inputs": [{"name": name, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                               for name in ("INPUT0", "INPUT1")]}
            answer = await client.post("/v2/models/simple/infer", json=body)
            assert answer.status_code == 200
            assert answer.json()["outputs"][0]["data"] == [2 * i for i in range(16)]
            missing = await client.post("/v2/models/nonexistent/infer", json=body)
            assert missing.status_code == 404 and "unknown model" in missing.json()["error"]
    asyncio.run(main())


def test_an_input_declared_with_a_reshape_reaches_the_model_reshaped(tmp_path):
    root = tmp_path / "models"
    config = ONNX_ADD_SUB_CONFIG.replace('INPUT0" data_type: TYPE_INT32 dims: [ 16 ]',
                                         'INPUT0" data_type: TYPE_INT32 dims: [ 4, 4 ] reshape: { shape: [ 16 ] }')
    assert config != ONNX_ADD_SUB_CONFIG
    write_model(root, "shaped", config)
    build_add_sub_onnx(root / "shaped" / "1" / "model.onnx", datatype="INT32")

    async def main():
        async with core(root) as service:
            data = np.arange(32, dtype=np.int32)
            request = InferRequest("shaped", inputs=[InferTensor("INPUT0", "INT32", (2, 4, 4), data.reshape(2, 4, 4)),
                                                     InferTensor("INPUT1", "INT32", (2, 16), data.reshape(2, 16))])
            response = await service.infer(request)  # the model's INPUT0 is [-1, 16]: it runs only if reshaped
            np.testing.assert_array_equal(response.outputs[0].data, data.reshape(2, 16) * 2)
    asyncio.run(main())


def test_answers_follow_the_configs_output_order_and_reshape(tmp_path):
    root = tmp_path / "models"
    config = ONNX_ADD_SUB_CONFIG.replace('OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ]',
                                         'OUTPUT1" data_type: TYPE_INT32 dims: [ 4, 4 ] reshape: { shape: [ 16 ] }')
    write_model(root, "shaped", config)
    build_add_sub_onnx(root / "shaped" / "1" / "model.onnx", datatype="INT32")

    async def main():
        async with core(root) as service:
            request = _request()
            request.model_name = "shaped"
            request.outputs = [RequestedOutput("OUTPUT1"), RequestedOutput("OUTPUT0", {"binary_data": True})]
            response = await service.infer(request)
            assert [(t.name, t.shape, t.parameters) for t in response.outputs] == [
                ("OUTPUT0", (2, 16), {"binary_data": True}), ("OUTPUT1", (2, 4, 4), {})]
            request = _request()
            request.model_name = "shaped"
            response = await service.infer(request)  # no outputs named: every one, in the config's order
            assert [(t.name, t.shape, t.parameters) for t in response.outputs] == [
                ("OUTPUT0", (2, 16), {}), ("OUTPUT1", (2, 4, 4), {})]
            np.testing.assert_array_equal(response.outputs[1].data.reshape(2, 16), np.zeros((2, 16), np.int32))
    asyncio.run(main())
