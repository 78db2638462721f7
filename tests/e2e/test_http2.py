"""HTTP/2 (h2c, prior knowledge) and HTTP/1.1 on the same port."""

from __future__ import annotations

import httpx

BODY = {
    "inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16},
    ]
}


def test_http2_prior_knowledge_client_gets_inference_results(server):
    with httpx.Client(http1=False, http2=True, base_url=f"http://{server.http_url}") as client:
        response = client.post("/v2/models/simple_onnx/infer", json=BODY)
        assert response.http_version == "HTTP/2"
        assert response.status_code == 200
        assert response.json()["outputs"][0]["data"] == [float(i + 1) for i in range(16)]
        responses = [client.get("/v2/health/ready") for _ in range(3)]
        assert all(r.http_version == "HTTP/2" and r.status_code == 200 for r in responses)


def test_http11_on_the_same_port(server):
    with httpx.Client(base_url=f"http://{server.http_url}") as client:
        response = client.post("/v2/models/simple_onnx/infer", json=BODY)
        assert response.http_version == "HTTP/1.1"
        assert response.status_code == 200


def test_http2_errors_keep_their_status(server):
    with httpx.Client(http1=False, http2=True, base_url=f"http://{server.http_url}") as client:
        response = client.post("/v2/models/simple_onnx/infer", content=b"{oops")
        assert response.http_version == "HTTP/2"
        assert response.status_code == 400
        assert "failed to parse" in response.json()["error"]
