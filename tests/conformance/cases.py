"""The calls the conformance suite sends to both servers (repository: ``models.py``)."""

from __future__ import annotations

import base64
import gzip
import json
import os
import struct

import numpy as np
from tritonclient.grpc import service_pb2

from tests.conformance.harness import (
    GrpcCase,
    HttpCase,
    drop,
    each,
    final_flag_folded,
    outputs_by_name,
    parameters_text_unordered,
    replace_at,
    server_sent_events,
    sort_list,
)

A = [1.0, 2.0, 3.0, 4.0]
B = [1.0, 1.0, 1.0, 1.0]


def tensor(name: str, data, datatype: str = "FP32", shape=None, **extra) -> dict:
    shape = shape if shape is not None else [len(data)]
    return {"name": name, "datatype": datatype, "shape": shape, "data": data, **extra}


def add_sub(a=A, b=B, datatype: str = "FP32", shape=None, **extra) -> dict:
    return {"inputs": [tensor("INPUT0", a, datatype, shape), tensor("INPUT1", b, datatype, shape)], **extra}


def binary_body(inputs: list[tuple[str, str, list[int], bytes]], outputs: list[dict] | None = None,
                parameters: dict | None = None, sizes: list[int] | None = None) -> tuple[bytes, dict]:
    header: dict = {"inputs": [{"name": n, "datatype": d, "shape": s,
                                "parameters": {"binary_data_size": len(raw) if sizes is None else sizes[i]}}
                               for i, (n, d, s, raw) in enumerate(inputs)]}
    if outputs is not None:
        header["outputs"] = outputs
    if parameters is not None:
        header["parameters"] = parameters
    text = json.dumps(header).encode()
    return text + b"".join(raw for *_, raw in inputs), {"Inference-Header-Content-Length": str(len(text))}


def fp32(values) -> bytes:
    return np.asarray(values, dtype=np.float32).tobytes()


def bytes_tensor(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def infer(name: str, model: str, body, headers: dict | None = None, normalize=None, version: str = "") -> HttpCase:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    return HttpCase(name, "POST", path, body, headers or {}, normalize)


def sequence_body(value: int, rows: int = 1, **parameters) -> dict:
    body: dict = {"inputs": [tensor("INPUT", [value] * rows, "INT32", shape=[rows, 1])]}
    if parameters:
        body["parameters"] = parameters
    return body


def ensemble_body(rows: int = 1, outputs: list[str] | None = None) -> dict:
    body = {"inputs": [tensor("A", A * rows, shape=[rows, 4]), tensor("B", B * rows, shape=[rows, 4])]}
    if outputs is not None:
        body["outputs"] = [{"name": name} for name in outputs]
    return body


# one pair per test run: two runs on one machine must not unlink each other's regions
SHM_INPUT_KEY = f"/serverless_triton_conformance_in_{os.getpid()}"
SHM_OUTPUT_KEY = f"/serverless_triton_conformance_out_{os.getpid()}"


def shm_register(case: str, region: str, key: str, byte_size: int, offset: int = 0) -> HttpCase:
    return HttpCase(case, "POST", f"/v2/systemsharedmemory/region/{region}/register",
                    {"key": key, "offset": offset, "byte_size": byte_size})


IPC_HANDLE = base64.b64encode(bytes(64)).decode()  # a cudaIpcMemHandle_t's size, all zeros


def probe(what: str, parameters: dict | None = None) -> dict:
    """A request to the 'probe' model, which answers with what a model sees as text (models.PROBE)."""
    body: dict = {"inputs": [tensor("WHAT", [what], "BYTES", shape=[1])]}
    if parameters:
        body["parameters"] = parameters
    return body


def cuda_register(b64: str) -> dict:
    return {"raw_handle": {"b64": b64}, "device_id": 0, "byte_size": 16}


def shm_input(name: str, region: str, offset: int, byte_size: int = 16) -> dict:
    return {"name": name, "datatype": "FP32", "shape": [4], "parameters": {
        "shared_memory_region": region, "shared_memory_offset": offset, "shared_memory_byte_size": byte_size}}


def shm_body(input1_offset: int = 16, output_size: int = 16, region: str = "in") -> dict:
    return {"inputs": [shm_input("INPUT0", region, 0), shm_input("INPUT1", region, input1_offset)],
            "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "out",
                                                           "shared_memory_byte_size": output_size}},
                        {"name": "OUTPUT1"}]}


SERVER_METADATA = drop("body.version")  # ours carries our own version
STATS = each(
    replace_at("body.model_stats.*.last_inference", "<ms>"),
    replace_at("body.model_stats.*.inference_stats.*.ns", "<ns>"),
    replace_at("body.model_stats.*.batch_stats.*.compute_input.ns", "<ns>"),
    replace_at("body.model_stats.*.batch_stats.*.compute_infer.ns", "<ns>"),
    replace_at("body.model_stats.*.batch_stats.*.compute_output.ns", "<ns>"),
    replace_at("body.model_stats.*.response_stats.*.*.ns", "<ns>"),
)
# Counts of models other suites' cases also call depend on the order cases run in: compare the shape only.
STATS_SHAPE = each(STATS, replace_at("body.model_stats.*.inference_count", "<n>"),
                   replace_at("body.model_stats.*.execution_count", "<n>"),
                   replace_at("body.model_stats.*.last_inference", "<ms>"),
                   replace_at("body.model_stats.*.inference_stats.*.count", "<n>"),
                   replace_at("body.model_stats.*.batch_stats", "<batches>"),
                   replace_at("body.model_stats.*.response_stats", "<responses>"))
INDEX = sort_list("body")

good_binary, good_binary_headers = binary_body([("INPUT0", "FP32", [4], fp32(A)), ("INPUT1", "FP32", [4], fp32(B))])
binary_json_out, binary_json_out_headers = binary_body(
    [("INPUT0", "FP32", [4], fp32(A)), ("INPUT1", "FP32", [4], fp32(B))],
    outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": False}}])
binary_out, binary_out_headers = binary_body(
    [("INPUT0", "FP32", [4], fp32(A)), ("INPUT1", "FP32", [4], fp32(B))],
    outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}])
short_binary, short_binary_headers = binary_body(
    [("INPUT0", "FP32", [4], fp32(A)[:12]), ("INPUT1", "FP32", [4], fp32(B))])
wrong_sizes, wrong_sizes_headers = binary_body(
    [("INPUT0", "FP32", [4], fp32(A)), ("INPUT1", "FP32", [4], fp32(B))], sizes=[16, 20])
text_binary, text_binary_headers = binary_body([("TEXT", "BYTES", [2], bytes_tensor([b"hello", b"world"]))],
                                               parameters={"binary_data_output": True})
text_truncated, text_truncated_headers = binary_body([("TEXT", "BYTES", [2], bytes_tensor([b"hello", b"world"])[:-2])])
int_binary, int_binary_headers = binary_body([("INPUT0", "INT32", [4], np.arange(4, dtype=np.int32).tobytes()),
                                             ("INPUT1", "INT32", [4], np.ones(4, dtype=np.int32).tobytes())],
                                            parameters={"binary_data_output": True})

HTTP_CASES: list[HttpCase] = [
    # -- health, server metadata ---------------------------------------------------------------
    HttpCase("http-live", "GET", "/v2/health/live"),
    HttpCase("http-ready-with-failed-models", "GET", "/v2/health/ready"),
    HttpCase("http-server-metadata", "GET", "/v2", normalize=SERVER_METADATA),
    HttpCase("http-live-post", "POST", "/v2/health/live"),
    # -- model metadata -------------------------------------------------------------------------
    HttpCase("http-metadata", "GET", "/v2/models/add_sub"),
    HttpCase("http-metadata-version", "GET", "/v2/models/add_sub/versions/1"),
    HttpCase("http-metadata-batched", "GET", "/v2/models/batched"),
    HttpCase("http-metadata-bytes", "GET", "/v2/models/text"),
    HttpCase("http-metadata-all-versions", "GET", "/v2/models/versions_all"),
    HttpCase("http-metadata-one-of-several-versions", "GET", "/v2/models/versions_all/versions/2"),
    HttpCase("http-metadata-latest-two", "GET", "/v2/models/versions_latest"),
    HttpCase("http-metadata-version-not-loaded", "GET", "/v2/models/versions_latest/versions/1"),
    HttpCase("http-metadata-version-not-on-disk", "GET", "/v2/models/add_sub/versions/7"),
    HttpCase("http-metadata-version-not-a-number", "GET", "/v2/models/add_sub/versions/abc"),
    HttpCase("http-metadata-unknown-model", "GET", "/v2/models/nonexistent"),
    HttpCase("http-metadata-failed-initialize", "GET", "/v2/models/init_raises"),
    HttpCase("http-metadata-syntax-error", "GET", "/v2/models/syntax_error"),
    HttpCase("http-metadata-bad-config", "GET", "/v2/models/bad_config"),
    HttpCase("http-metadata-trailing-slash", "GET", "/v2/models/add_sub/"),
    HttpCase("http-metadata-path-traversal", "GET", "/v2/models/..%2F..%2Fetc%2Fpasswd"),
    # -- readiness --------------------------------------------------------------------------------
    HttpCase("http-model-ready", "GET", "/v2/models/add_sub/ready"),
    HttpCase("http-model-ready-version", "GET", "/v2/models/versions_all/versions/1/ready"),
    HttpCase("http-model-ready-version-not-loaded", "GET", "/v2/models/versions_specific/versions/2/ready"),
    HttpCase("http-model-ready-failed", "GET", "/v2/models/init_raises/ready"),
    HttpCase("http-model-ready-unknown", "GET", "/v2/models/nonexistent/ready"),
    HttpCase("http-model-ready-bad-config", "GET", "/v2/models/bad_config/ready"),
    # -- config -----------------------------------------------------------------------------------
    HttpCase("http-config", "GET", "/v2/models/add_sub/config"),
    HttpCase("http-config-batched", "GET", "/v2/models/batched/config"),
    HttpCase("http-config-bytes", "GET", "/v2/models/text/config"),
    HttpCase("http-config-versions", "GET", "/v2/models/versions_latest/config"),
    HttpCase("http-config-default-policy", "GET", "/v2/models/versions_default/config"),
    HttpCase("http-config-specific-version", "GET", "/v2/models/versions_specific/versions/3/config"),
    HttpCase("http-config-unknown", "GET", "/v2/models/nonexistent/config"),
    HttpCase("http-config-failed", "GET", "/v2/models/init_raises/config"),
    # -- repository index ---------------------------------------------------------------------------
    HttpCase("http-index", "POST", "/v2/repository/index", normalize=INDEX),
    HttpCase("http-index-ready", "POST", "/v2/repository/index", {"ready": True}, normalize=INDEX),
    HttpCase("http-index-not-ready", "POST", "/v2/repository/index", {"ready": False}, normalize=INDEX),
    HttpCase("http-index-bad-json", "POST", "/v2/repository/index", b"{oops"),
    HttpCase("http-index-get", "GET", "/v2/repository/index"),
    # -- infer: JSON --------------------------------------------------------------------------------
    infer("http-infer-json", "add_sub", add_sub()),
    infer("http-infer-json-int32", "add_sub_int", add_sub([1, 2, 3, 4], [1, 1, 1, 1], "INT32")),
    infer("http-infer-json-nested-data", "add_sub", add_sub([[1.0, 2.0], [3.0, 4.0]], B)),
    infer("http-infer-json-id", "add_sub", add_sub(id="request-7")),
    infer("http-infer-json-one-output", "add_sub", add_sub(outputs=[{"name": "OUTPUT1"}])),
    infer("http-infer-json-outputs-reordered", "add_sub", add_sub(outputs=[{"name": "OUTPUT1"}, {"name": "OUTPUT0"}])),
    infer("http-infer-json-custom-parameter", "add_sub", add_sub(parameters={"custom": "x", "n": 3})),
    infer("http-infer-json-binary-output", "add_sub", add_sub(parameters={"binary_data_output": True})),
    infer("http-infer-json-output-binary-flag", "add_sub",
          add_sub(outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}])),
    infer("http-infer-version", "versions_all", {"inputs": [tensor("IN", [1.0])]}, version="1"),
    infer("http-infer-default-version", "versions_latest", {"inputs": [tensor("IN", [1.0])]}),
    infer("http-infer-version-not-loaded", "versions_latest", {"inputs": [tensor("IN", [1.0])]}, version="1"),
    infer("http-infer-batched", "batched", add_sub([A, A], [B, B], shape=[2, 4])),
    infer("http-infer-batched-too-large", "batched", add_sub([A] * 9, [B] * 9, shape=[9, 4])),
    infer("http-infer-batched-missing-batch-dim", "batched", add_sub()),
    infer("http-infer-bytes-json", "text", {"inputs": [tensor("TEXT", ["hello", "world"], "BYTES")]}),
    infer("http-infer-bytes-empty-strings", "text", {"inputs": [tensor("TEXT", ["", "a"], "BYTES")]}),
    infer("http-infer-error-response", "error_response", {"inputs": [tensor("IN", [1.0])]}),
    infer("http-infer-execute-raises", "raising", {"inputs": [tensor("IN", [1.0])]}),
    infer("http-infer-failed-model", "init_raises", {"inputs": [tensor("IN", [1.0])]}),
    infer("http-infer-unknown-model", "nonexistent", {"inputs": [tensor("IN", [1.0])]}),
    infer("http-infer-unknown-model-garbage-body", "nonexistent", b"\x00garbage"),
    # -- infer: binary --------------------------------------------------------------------------------
    infer("http-infer-binary", "add_sub", good_binary, good_binary_headers),
    infer("http-infer-binary-json-output", "add_sub", binary_json_out, binary_json_out_headers),
    infer("http-infer-binary-outputs", "add_sub", binary_out, binary_out_headers),
    infer("http-infer-binary-int32", "add_sub_int", int_binary, int_binary_headers),
    infer("http-infer-binary-bytes", "text", text_binary, text_binary_headers),
    infer("http-infer-binary-short-tensor", "add_sub", short_binary, short_binary_headers),
    infer("http-infer-binary-sizes-do-not-add-up", "add_sub", wrong_sizes, wrong_sizes_headers),
    infer("http-infer-binary-bytes-truncated", "text", text_truncated, text_truncated_headers),
    infer("http-infer-header-length-too-large", "add_sub", good_binary,
          {"Inference-Header-Content-Length": "100000"}),
    infer("http-infer-header-length-negative", "add_sub", good_binary, {"Inference-Header-Content-Length": "-5"}),
    infer("http-infer-header-length-not-a-number", "add_sub", good_binary, {"Inference-Header-Content-Length": "x"}),
    infer("http-infer-gzip", "add_sub", gzip.compress(json.dumps(add_sub()).encode()), {"Content-Encoding": "gzip"}),
    infer("http-infer-gzip-accept", "add_sub", add_sub(), {"Accept-Encoding": "gzip"},
          normalize=drop("body")),
    infer("http-infer-unsupported-encoding", "add_sub", add_sub(), {"Content-Encoding": "br"}),
    # -- infer: bad input -----------------------------------------------------------------------------
    infer("http-infer-malformed-json", "add_sub", b"{not json"),
    infer("http-infer-empty-body", "add_sub", b""),
    infer("http-infer-json-array-body", "add_sub", b"[1, 2]"),
    infer("http-infer-inputs-not-a-list", "add_sub", {"inputs": 5}),
    infer("http-infer-input-not-an-object", "add_sub", {"inputs": [5]}),
    infer("http-infer-no-inputs", "add_sub", {"inputs": []}),
    infer("http-infer-missing-input", "add_sub", {"inputs": [tensor("INPUT0", A)]}),
    infer("http-infer-unexpected-input", "add_sub", {"inputs": [tensor("INPUT0", A), tensor("INPUT1", B),
                                                                tensor("EXTRA", B)]}),
    infer("http-infer-duplicate-input", "add_sub", {"inputs": [tensor("INPUT0", A), tensor("INPUT0", A)]}),
    infer("http-infer-wrong-shape", "add_sub", add_sub([1.0, 2.0, 3.0], [1.0, 1.0, 1.0])),
    infer("http-infer-wrong-rank", "add_sub", add_sub([A], [B], shape=[1, 4])),
    infer("http-infer-wrong-datatype", "add_sub", add_sub([1, 2, 3, 4], [1, 1, 1, 1], "INT32")),
    infer("http-infer-unknown-datatype", "add_sub", add_sub(datatype="FP128")),
    infer("http-infer-datatype-not-a-string", "add_sub", {"inputs": [tensor("INPUT0", A, ["FP32"]),
                                                                      tensor("INPUT1", B)]}),
    infer("http-infer-too-few-elements", "add_sub", {"inputs": [tensor("INPUT0", A[:3], shape=[4]),
                                                                 tensor("INPUT1", B)]}),
    infer("http-infer-too-many-elements", "add_sub", {"inputs": [tensor("INPUT0", A + [5.0], shape=[4]),
                                                                  tensor("INPUT1", B)]}),
    infer("http-infer-strings-for-fp32", "add_sub", add_sub(["a", "b", "c", "d"])),
    infer("http-probe-pb-utils-listing", "probe", probe("dir")),
    infer("http-probe-model-dir", "probe", probe("model_dir")),
    infer("http-probe-memory-types", "probe", probe("memory_types")),
    infer("http-probe-request-parameters", "probe", probe("parameters", {"custom": "x", "n": 3, "text": "é"})),
    infer("http-probe-no-request-parameters", "probe", probe("parameters")),
    infer("http-infer-json-fp16", "add_sub", {"inputs": [tensor("INPUT0", A, "FP16"), tensor("INPUT1", B)]}),
    infer("http-infer-json-bf16", "add_sub", {"inputs": [tensor("INPUT0", A, "BF16"), tensor("INPUT1", B)]}),
    infer("http-infer-json-fp16-no-elements", "add_sub", {"inputs": [tensor("INPUT0", [], "FP16", shape=[0]),
                                                                      tensor("INPUT1", B)]}),
    infer("http-infer-bools-for-fp32", "add_sub", add_sub([True, False, True, False])),
    infer("http-infer-int-out-of-range", "add_sub_int", add_sub([2**40, 1, 1, 1], [1, 1, 1, 1], "INT32")),
    infer("http-infer-negative-dimension", "add_sub", add_sub(shape=[-4])),
    infer("http-infer-huge-dimension", "add_sub", add_sub(shape=[0, 2**62])),
    infer("http-infer-no-name", "add_sub", {"inputs": [{"datatype": "FP32", "shape": [4], "data": A}]}),
    infer("http-infer-no-data", "add_sub", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4]},
                                                       tensor("INPUT1", B)]}),
    infer("http-infer-unknown-output", "add_sub", add_sub(outputs=[{"name": "NOPE"}])),
    infer("http-infer-output-requested-twice", "add_sub", add_sub(outputs=[{"name": "OUTPUT0"},
                                                                           {"name": "OUTPUT0"}])),
    infer("http-infer-id-not-a-string", "add_sub", add_sub(id=7)),
    infer("http-infer-parameters-not-an-object", "add_sub", add_sub(parameters=[1])),
    infer("http-infer-reserved-parameter", "add_sub", add_sub(parameters={"triton_enable_empty_final_response":
                                                                          True})),
    infer("http-infer-timeout-parameter", "add_sub", add_sub(parameters={"timeout": 1000000})),
    infer("http-infer-priority-parameter", "add_sub", add_sub(parameters={"priority": 1})),
    infer("http-infer-classification", "add_sub", add_sub(outputs=[{"name": "OUTPUT0",
                                                                    "parameters": {"classification": 2}}])),
    infer("http-infer-classification-labels-batched", "classify", add_sub(
        [0.5, 2.0, -1.0, 2.0, 9.0, 0.0, 1.0, 3.0], B * 2, shape=[2, 4],
        outputs=[{"name": "OUTPUT0", "parameters": {"classification": 3}},
                 {"name": "OUTPUT1", "parameters": {"classification": 1}}])),
    infer("http-infer-classification-more-than-classes", "classify", add_sub(
        shape=[1, 4], outputs=[{"name": "OUTPUT0", "parameters": {"classification": 9}}])),
    infer("http-infer-classification-zero", "classify", add_sub(
        shape=[1, 4], outputs=[{"name": "OUTPUT0", "parameters": {"classification": 0}}])),
    infer("http-infer-classification-binary", "classify", add_sub(
        shape=[1, 4], outputs=[{"name": "OUTPUT0", "parameters": {"classification": 2, "binary_data": True}}])),
    infer("http-infer-classification-int32", "add_sub_int", add_sub(
        [7, 1, 7, 3], [1, 1, 1, 1], "INT32", outputs=[{"name": "OUTPUT1", "parameters": {"classification": 3}}])),
    infer("http-infer-classification-negative", "classify", add_sub(
        shape=[1, 4], outputs=[{"name": "OUTPUT0", "parameters": {"classification": -1}}])),
    infer("http-infer-classification-not-a-number", "classify", add_sub(
        shape=[1, 4], outputs=[{"name": "OUTPUT0", "parameters": {"classification": "2"}}])),
    infer("http-infer-shared-memory-input", "add_sub", {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {
            "shared_memory_region": "nope", "shared_memory_byte_size": 16}}, tensor("INPUT1", B)]}),
    HttpCase("http-infer-get", "GET", "/v2/models/add_sub/infer"),
    # -- statistics --------------------------------------------------------------------------------------
    HttpCase("http-stats-model", "GET", "/v2/models/add_sub/stats", normalize=STATS_SHAPE),
    HttpCase("http-stats-version", "GET", "/v2/models/versions_all/versions/2/stats", normalize=STATS_SHAPE),
    HttpCase("http-stats-unknown-model", "GET", "/v2/models/nonexistent/stats"),
    HttpCase("http-stats-failed-model", "GET", "/v2/models/init_raises/stats"),
    HttpCase("http-stats-version-not-loaded", "GET", "/v2/models/versions_latest/versions/1/stats"),
    # -- the Python-backend API: decoupled models, generate, BLS, async execute, auto-complete -------------------
    infer("http-infer-decoupled", "repeat", {"inputs": [tensor("IN", [1, 2], "INT32")]}),
    HttpCase("http-generate-one-response", "POST", "/v2/models/words/generate", {"text_input": "hello"}),
    HttpCase("http-generate-many-responses", "POST", "/v2/models/words/generate", {"text_input": "hello big world"}),
    HttpCase("http-generate-plain-model", "POST", "/v2/models/add_sub/generate",
             {"INPUT0": A, "INPUT1": B, "id": "g", "parameters": {"x": 1}}),
    HttpCase("http-generate-scalar-input", "POST", "/v2/models/repeat/generate", {"IN": 7}),
    HttpCase("http-generate-versioned", "POST", "/v2/models/add_sub/versions/1/generate", {"INPUT0": A, "INPUT1": B}),
    HttpCase("http-generate-missing-input", "POST", "/v2/models/words/generate", {"other": "x"}),
    HttpCase("http-generate-unknown-model", "POST", "/v2/models/nonexistent/generate", {"IN": 1}),
    HttpCase("http-generate-not-json", "POST", "/v2/models/words/generate", b"{not json"),
    HttpCase("http-generate-parameters-not-an-object", "POST", "/v2/models/words/generate",
             {"text_input": "a", "parameters": 5}),
    HttpCase("http-generate-get", "GET", "/v2/models/words/generate"),
    HttpCase("http-generate-stream", "POST", "/v2/models/words/generate_stream", {"text_input": "one two three"},
             normalize=server_sent_events),
    HttpCase("http-generate-stream-plain-model", "POST", "/v2/models/add_sub/generate_stream",
             {"INPUT0": A, "INPUT1": B}, normalize=server_sent_events),
    HttpCase("http-generate-stream-execute-raises", "POST", "/v2/models/raising/generate_stream", {"IN": 1.0},
             normalize=server_sent_events),
    infer("http-bls-to-python-model", "bls", {"inputs": [tensor("TARGET", ["add_sub"], "BYTES"), tensor("A", A)]}),
    infer("http-bls-to-unknown-model", "bls", {"inputs": [tensor("TARGET", ["nonexistent"], "BYTES"),
                                                          tensor("A", A)]}),
    infer("http-bls-to-decoupled-model", "bls", {"inputs": [tensor("TARGET", ["repeat"], "BYTES"), tensor("A", A)]}),
    infer("http-bls-decoupled-without-flag", "bls", {"inputs": [tensor("TARGET", ["repeat_plain"], "BYTES"),
                                                                tensor("A", A)]}),
    infer("http-bls-to-failing-model", "bls", {"inputs": [tensor("TARGET", ["raising"], "BYTES"), tensor("A", A)]}),
    infer("http-async-execute-with-bls", "async_bls", {"inputs": [tensor("TARGET", [""], "BYTES"), tensor("A", A)]}),
    HttpCase("http-config-auto-complete", "GET", "/v2/models/auto_complete/config"),
    HttpCase("http-config-auto-complete-partial", "GET", "/v2/models/auto_complete_partial/config"),
    infer("http-infer-auto-complete", "auto_complete", {"inputs": [tensor("X", [1.0, 2.0, 3.0], shape=[1, 3])]}),
    # -- model control with control mode none ------------------------------------------------------------
    HttpCase("http-load-without-explicit-mode", "POST", "/v2/repository/models/add_sub/load"),
    HttpCase("http-unload-without-explicit-mode", "POST", "/v2/repository/models/add_sub/unload"),
    # -- ensembles ---------------------------------------------------------------------------------------------
    infer("http-ensemble-infer", "pipeline", ensemble_body(), normalize=outputs_by_name),
    infer("http-ensemble-infer-batch-of-two", "pipeline", ensemble_body(rows=2), normalize=outputs_by_name),
    infer("http-ensemble-infer-one-output", "pipeline", ensemble_body(outputs=["DIFF"])),
    infer("http-ensemble-infer-unknown-output", "pipeline", ensemble_body(outputs=["sum"])),
    infer("http-ensemble-infer-parallel-steps", "pipeline_parallel", ensemble_body(), normalize=outputs_by_name),
    infer("http-ensemble-infer-of-ensemble", "pipeline_of_pipeline", ensemble_body(), normalize=outputs_by_name),
    infer("http-ensemble-infer-missing-input", "pipeline", {"inputs": ensemble_body()["inputs"][:1]}),
    infer("http-ensemble-infer-wrong-shape", "pipeline", {"inputs": [
        tensor("A", A[:3], shape=[1, 3]), tensor("B", B, shape=[1, 4])]}),
    infer("http-ensemble-infer-failed-graph", "ensemble_cycle", ensemble_body()),
    infer("http-ensemble-infer-missing-model", "ensemble_missing_model", ensemble_body()),
    HttpCase("http-ensemble-metadata", "GET", "/v2/models/pipeline"),
    HttpCase("http-ensemble-config", "GET", "/v2/models/pipeline/config"),
    HttpCase("http-ensemble-ready", "GET", "/v2/models/pipeline/ready"),
    HttpCase("http-ensemble-ready-failed", "GET", "/v2/models/ensemble_dtype_mismatch/ready"),
    HttpCase("http-ensemble-metadata-failed", "GET", "/v2/models/ensemble_batch_too_big"),
    HttpCase("http-ensemble-config-failed", "GET", "/v2/models/ensemble_unused_tensor/config"),
    HttpCase("http-ensemble-stats", "GET", "/v2/models/pipeline/stats", normalize=STATS_SHAPE),
    infer("http-ensemble-decoupled-infer", "streaming_ensemble", {"inputs": [tensor("IN", [1, 2], "INT32")]}),
    HttpCase("http-ensemble-decoupled-config", "GET", "/v2/models/streaming_ensemble/config"),
    # -- sequence batching (the cases run in order: one sequence's requests follow one another) -----------------
    HttpCase("http-sequence-config", "GET", "/v2/models/accumulate/config"),
    HttpCase("http-sequence-metadata", "GET", "/v2/models/accumulate"),
    infer("http-sequence-without-id", "accumulate", sequence_body(1)),
    infer("http-sequence-start", "accumulate", sequence_body(1, sequence_id=5, sequence_start=True)),
    infer("http-sequence-continue", "accumulate", sequence_body(2, sequence_id=5)),
    infer("http-sequence-another-start", "accumulate", sequence_body(10, sequence_id=6, sequence_start=True)),
    infer("http-sequence-end", "accumulate", sequence_body(3, sequence_id=5, sequence_end=True)),
    infer("http-sequence-after-its-end", "accumulate", sequence_body(3, sequence_id=5)),
    infer("http-sequence-unknown", "accumulate", sequence_body(3, sequence_id=9, sequence_end=True)),
    infer("http-sequence-batch-of-two", "accumulate", sequence_body(1, rows=2, sequence_id=7, sequence_start=True)),
    infer("http-sequence-start-and-end", "accumulate", sequence_body(4, sequence_id=8, sequence_start=True,
                                                                     sequence_end=True)),
    infer("http-sequence-string-id", "accumulate", sequence_body(4, sequence_id="abc", sequence_start=True,
                                                                 sequence_end=True)),
    infer("http-sequence-id-not-a-number-or-string", "accumulate", sequence_body(1, sequence_id=1.5,
                                                                                 sequence_start=True)),
    infer("http-sequence-restart", "accumulate", sequence_body(100, sequence_id=6, sequence_start=True)),
    infer("http-sequence-zero-id", "accumulate", sequence_body(1, sequence_id=0, sequence_start=True)),
    infer("http-sequence-end-the-restarted", "accumulate", sequence_body(1, sequence_id=6, sequence_end=True)),
    # -- system shared memory ------------------------------------------------------------------------------
    shm_register("http-shm-register-input", "in", SHM_INPUT_KEY, 32),
    shm_register("http-shm-register-output", "out", SHM_OUTPUT_KEY, 64),
    shm_register("http-shm-register-again", "in", SHM_INPUT_KEY, 32),
    shm_register("http-shm-register-unknown-key", "nokey", "/serverless_triton_no_such_key", 16),
    shm_register("http-shm-register-past-the-end", "big", SHM_INPUT_KEY, 4096),
    shm_register("http-shm-register-path-trick", "trick", "../../etc/passwd", 4),
    HttpCase("http-shm-status", "GET", "/v2/systemsharedmemory/status", normalize=sort_list("body")),
    HttpCase("http-shm-status-region", "GET", "/v2/systemsharedmemory/region/in/status"),
    HttpCase("http-shm-status-unknown-region", "GET", "/v2/systemsharedmemory/region/nope/status"),
    infer("http-shm-infer", "add_sub", shm_body()),
    infer("http-shm-infer-past-the-region", "add_sub", shm_body(input1_offset=28)),
    infer("http-shm-infer-output-too-small", "add_sub", shm_body(output_size=8)),
    infer("http-shm-infer-unknown-region", "add_sub", shm_body(region="nope")),
    HttpCase("http-shm-unregister-region", "POST", "/v2/systemsharedmemory/region/in/unregister"),
    HttpCase("http-shm-unregister-unknown", "POST", "/v2/systemsharedmemory/region/in/unregister"),
    HttpCase("http-shm-unregister-all", "POST", "/v2/systemsharedmemory/unregister"),
    HttpCase("http-shm-status-after-unregister", "GET", "/v2/systemsharedmemory/status"),
    # -- routes and extensions -----------------------------------------------------------------------------
    HttpCase("http-unknown-route", "GET", "/v2/nothing/here"),
    HttpCase("http-root", "GET", "/"),
    HttpCase("http-logging", "GET", "/v2/logging"),
    HttpCase("http-logging-update", "POST", "/v2/logging", {"log_verbose_level": 1, "log_format": "ISO8601"}),
    HttpCase("http-logging-unknown-key", "POST", "/v2/logging", {"not_a_setting": 1}),
    HttpCase("http-logging-file", "POST", "/v2/logging", {"log_file": "/tmp/elsewhere.log"}),
    HttpCase("http-logging-not-a-bool", "POST", "/v2/logging", {"log_info": 1}),
    HttpCase("http-logging-bad-format", "POST", "/v2/logging", {"log_format": "fancy"}),
    HttpCase("http-logging-restore", "POST", "/v2/logging", {"log_verbose_level": 0, "log_format": "default"}),
    # -- trace settings: the pair runs with Triton's defaults (no trace file), every change is undone ---------
    HttpCase("http-trace-setting", "GET", "/v2/trace/setting"),
    HttpCase("http-trace-setting-rate", "POST", "/v2/trace/setting", {"trace_rate": "5", "trace_count": "3"}),
    HttpCase("http-trace-setting-clear", "POST", "/v2/trace/setting", {"trace_rate": None, "trace_count": None}),
    HttpCase("http-trace-setting-model", "POST", "/v2/models/add_sub/trace/setting", {"log_frequency": "2"}),
    HttpCase("http-trace-setting-model-get", "GET", "/v2/models/add_sub/trace/setting"),
    HttpCase("http-trace-setting-model-clear", "POST", "/v2/models/add_sub/trace/setting", {"log_frequency": None}),
    HttpCase("http-trace-setting-unknown-model", "GET", "/v2/models/nonexistent/trace/setting"),
    HttpCase("http-trace-setting-bad-rate", "POST", "/v2/trace/setting", {"trace_rate": "abc"}),
    HttpCase("http-trace-setting-zero-rate", "POST", "/v2/trace/setting", {"trace_rate": "0"}),
    HttpCase("http-trace-setting-bad-count", "POST", "/v2/trace/setting", {"trace_count": "-5"}),
    HttpCase("http-trace-setting-level-without-file", "POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
    HttpCase("http-trace-setting-file", "POST", "/v2/trace/setting", {"trace_file": "/tmp/elsewhere.json"}),
    HttpCase("http-trace-setting-mode-ignored", "POST", "/v2/trace/setting", {"trace_mode": "opentelemetry"}),
    HttpCase("http-trace-setting-level-not-a-list", "POST", "/v2/trace/setting", {"trace_level": "TIMESTAMPS"}),
    HttpCase("http-trace-setting-rate-not-a-string", "POST", "/v2/trace/setting", {"trace_rate": 5}),
    HttpCase("http-system-shared-memory-status", "GET", "/v2/systemsharedmemory/status"),
    # -- CUDA shared memory, as Triton built with CUDA answers on a host without a GPU -----------------------
    HttpCase("http-cuda-shared-memory-status", "GET", "/v2/cudasharedmemory/status"),
    HttpCase("http-cuda-status-unknown", "GET", "/v2/cudasharedmemory/region/x/status"),
    HttpCase("http-cuda-unregister-all", "POST", "/v2/cudasharedmemory/unregister"),
    HttpCase("http-cuda-unregister-unknown", "POST", "/v2/cudasharedmemory/region/x/unregister"),
    HttpCase("http-cuda-unregister-get", "GET", "/v2/cudasharedmemory/unregister"),
    HttpCase("http-cuda-register", "POST", "/v2/cudasharedmemory/region/x/register", cuda_register(IPC_HANDLE)),
    HttpCase("http-cuda-register-not-base64", "POST", "/v2/cudasharedmemory/region/x/register", cuda_register("!!")),
    HttpCase("http-cuda-register-short-handle", "POST", "/v2/cudasharedmemory/region/x/register",
             cuda_register("AAAA")),
    HttpCase("http-cuda-register-no-handle", "POST", "/v2/cudasharedmemory/region/x/register", {}),
    HttpCase("http-cuda-register-not-an-object", "POST", "/v2/cudasharedmemory/region/x/register",
             {"raw_handle": "abc", "device_id": 0, "byte_size": 16}),
    HttpCase("http-cuda-register-no-device", "POST", "/v2/cudasharedmemory/region/x/register",
             {"raw_handle": {"b64": IPC_HANDLE}, "byte_size": 16}),
]


def typed_in_wrong_field(field: str, also_right: bool = False) -> service_pb2.ModelInferRequest:
    """add_sub's FP32 INPUT0 with its values in another datatype's typed field (and in fp32_contents too)."""
    request = grpc_add_sub(raw=False)
    contents = request.inputs[0].contents
    if not also_right:
        contents.ClearField("fp32_contents")
    getattr(contents, field).extend([b"x"] * 4 if field == "bytes_contents" else [1, 2, 3, 4])
    return request


def grpc_add_sub(model: str = "add_sub", version: str = "", raw: bool = True, a=A, b=B, datatype: str = "FP32",
                 shape=(4,), outputs: tuple[str, ...] = (), request_id: str = "",
                 parameters: dict | None = None) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    dtype = {"FP32": np.float32, "INT32": np.int32}.get(datatype, np.float32)
    for name, values in (("INPUT0", a), ("INPUT1", b)):
        tensor_message = request.inputs.add(name=name, datatype=datatype, shape=list(shape))
        if raw:
            request.raw_input_contents.append(np.asarray(values, dtype=dtype).tobytes())
        elif datatype == "FP32":
            tensor_message.contents.fp32_contents.extend(values)
        else:
            tensor_message.contents.int_contents.extend(int(v) for v in values)
    for name in outputs:
        request.outputs.add(name=name)
    set_parameters(request, parameters or {})
    return request


def set_parameters(request: service_pb2.ModelInferRequest, parameters: dict) -> None:
    """``parameters`` into the request's map, each in the field of its type."""
    for key, value in parameters.items():
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        elif isinstance(value, int):
            request.parameters[key].int64_param = value
        else:
            request.parameters[key].string_param = value


def grpc_classify(count: int | str) -> service_pb2.ModelInferRequest:
    """The ``classify`` model, its OUTPUT0 asked for as the top ``count`` classes (tritonclient's class_count)."""
    request = grpc_add_sub("classify", a=[0.5, 2.0, -1.0, 2.0, 9.0, 0.0, 1.0, 3.0], b=B * 2, shape=(2, 4))
    parameter = request.outputs.add(name="OUTPUT0").parameters["classification"]
    if isinstance(count, str):
        parameter.string_param = count
    else:
        parameter.int64_param = count
    return request


def grpc_ensemble(model: str = "pipeline", outputs: tuple[str, ...] = ()) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, values in (("A", A), ("B", B)):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(np.asarray(values, dtype=np.float32).tobytes())
    for name in outputs:
        request.outputs.add(name=name)
    return request


def trace_settings(model: str = "", **settings: list[str]) -> service_pb2.TraceSettingRequest:
    """A TraceSetting request: each setting's values (an empty list clears it)."""
    request = service_pb2.TraceSettingRequest(model_name=model)
    for key, values in settings.items():
        request.settings[key].SetInParent()
        request.settings[key].value.extend(values)
    return request


def log_settings(**settings) -> service_pb2.LogSettingsRequest:
    request = service_pb2.LogSettingsRequest()
    for key, value in settings.items():
        if isinstance(value, bool):
            request.settings[key].bool_param = value
        elif isinstance(value, int):
            request.settings[key].uint32_param = value
        else:
            request.settings[key].string_param = value
    return request


def grpc_shm_infer() -> service_pb2.ModelInferRequest:
    """INPUT0 from the region 'grpc_in', INPUT1 as raw contents (the raw contents skip shared-memory inputs)."""
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    first = request.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
    first.parameters["shared_memory_region"].string_param = "grpc_in"
    first.parameters["shared_memory_byte_size"].int64_param = 16
    request.inputs.add(name="INPUT1", datatype="FP32", shape=[4])
    request.raw_input_contents.append(np.asarray(B, dtype=np.float32).tobytes())
    return request


def grpc_sequence(value: int, sequence_id: int | str, start: bool = False,
                  end: bool = False) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="accumulate", id=f"{sequence_id}-{value}")
    request.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
    request.raw_input_contents.append(np.asarray([[value]], dtype=np.int32).tobytes())
    if isinstance(sequence_id, str):
        request.parameters["sequence_id"].string_param = sequence_id
    else:
        request.parameters["sequence_id"].int64_param = sequence_id
    request.parameters["sequence_start"].bool_param = start
    request.parameters["sequence_end"].bool_param = end
    return request


def with_id(request: service_pb2.ModelInferRequest, request_id: str) -> service_pb2.ModelInferRequest:
    request.id = request_id
    return request


def grpc_one(model: str, version: str = "", value: float = 1.0) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    request.inputs.add(name="IN", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.asarray([value], dtype=np.float32).tobytes())
    return request


def grpc_text(items: list[bytes], typed: bool = False) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="text")
    tensor_message = request.inputs.add(name="TEXT", datatype="BYTES", shape=[len(items)])
    if typed:
        tensor_message.contents.bytes_contents.extend(items)
    else:
        request.raw_input_contents.append(bytes_tensor(items))
    return request


def grpc_probe(what: str, parameters: dict) -> service_pb2.ModelInferRequest:
    """The 'probe' model over gRPC (its answer: what the model sees as text), with ``parameters``."""
    request = service_pb2.ModelInferRequest(model_name="probe")
    request.inputs.add(name="WHAT", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(bytes_tensor([what.encode()]))
    set_parameters(request, parameters)
    return request


def grpc_ints(model: str, values: list[int], request_id: str = "",
              parameters: dict | None = None) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="IN", datatype="INT32", shape=[len(values)])
    request.raw_input_contents.append(np.asarray(values, dtype=np.int32).tobytes())
    for key, value in (parameters or {}).items():
        request.parameters[key].bool_param = value
    return request


GRPC_STATS = each(
    replace_at("response.model_stats.*.last_inference", "<ms>"),
    replace_at("response.model_stats.*.inference_stats.*.ns", "<ns>"),
    replace_at("response.model_stats.*.inference_count", "<n>"),
    replace_at("response.model_stats.*.execution_count", "<n>"),
    replace_at("response.model_stats.*.inference_stats.*.count", "<n>"),
    replace_at("response.model_stats.*.batch_stats", "<batches>"),
    replace_at("response.model_stats.*.response_stats", "<responses>"),
)
GRPC_INDEX = sort_list("response.models")
wrong_raw_count = grpc_add_sub()
del wrong_raw_count.raw_input_contents[1]
both_contents = grpc_add_sub()
both_contents.inputs[0].contents.fp32_contents.extend(A)
bad_raw_size = grpc_add_sub()
bad_raw_size.raw_input_contents[0] = b"\x00" * 3
no_contents = service_pb2.ModelInferRequest(model_name="add_sub")
no_contents.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
no_contents.inputs.add(name="INPUT1", datatype="FP32", shape=[4])

GRPC_CASES: list[GrpcCase] = [
    GrpcCase("grpc-live", "ServerLive", service_pb2.ServerLiveRequest()),
    GrpcCase("grpc-ready-with-failed-models", "ServerReady", service_pb2.ServerReadyRequest()),
    GrpcCase("grpc-server-metadata", "ServerMetadata", service_pb2.ServerMetadataRequest(),
             normalize=drop("response.version")),
    GrpcCase("grpc-model-ready", "ModelReady", service_pb2.ModelReadyRequest(name="add_sub")),
    GrpcCase("grpc-model-ready-version", "ModelReady", service_pb2.ModelReadyRequest(name="versions_all",
                                                                                     version="2")),
    GrpcCase("grpc-model-ready-not-loaded", "ModelReady", service_pb2.ModelReadyRequest(name="versions_latest",
                                                                                        version="1")),
    GrpcCase("grpc-model-ready-failed", "ModelReady", service_pb2.ModelReadyRequest(name="init_raises")),
    GrpcCase("grpc-model-ready-unknown", "ModelReady", service_pb2.ModelReadyRequest(name="nonexistent")),
    GrpcCase("grpc-model-ready-version-not-a-number", "ModelReady",
             service_pb2.ModelReadyRequest(name="add_sub", version="abc")),
    GrpcCase("grpc-metadata", "ModelMetadata", service_pb2.ModelMetadataRequest(name="add_sub")),
    GrpcCase("grpc-metadata-batched", "ModelMetadata", service_pb2.ModelMetadataRequest(name="batched")),
    GrpcCase("grpc-metadata-versions", "ModelMetadata", service_pb2.ModelMetadataRequest(name="versions_all")),
    GrpcCase("grpc-metadata-one-version", "ModelMetadata",
             service_pb2.ModelMetadataRequest(name="versions_all", version="1")),
    GrpcCase("grpc-metadata-unknown", "ModelMetadata", service_pb2.ModelMetadataRequest(name="nonexistent")),
    GrpcCase("grpc-metadata-failed", "ModelMetadata", service_pb2.ModelMetadataRequest(name="init_raises")),
    GrpcCase("grpc-metadata-version-not-a-number", "ModelMetadata",
             service_pb2.ModelMetadataRequest(name="add_sub", version="abc")),
    GrpcCase("grpc-metadata-version-not-loaded", "ModelMetadata",
             service_pb2.ModelMetadataRequest(name="versions_latest", version="1")),
    GrpcCase("grpc-config", "ModelConfig", service_pb2.ModelConfigRequest(name="add_sub")),
    GrpcCase("grpc-config-batched", "ModelConfig", service_pb2.ModelConfigRequest(name="batched")),
    GrpcCase("grpc-config-bytes", "ModelConfig", service_pb2.ModelConfigRequest(name="text")),
    GrpcCase("grpc-config-unknown", "ModelConfig", service_pb2.ModelConfigRequest(name="nonexistent")),
    GrpcCase("grpc-config-failed", "ModelConfig", service_pb2.ModelConfigRequest(name="init_raises")),
    GrpcCase("grpc-index", "RepositoryIndex", service_pb2.RepositoryIndexRequest(), normalize=GRPC_INDEX),
    GrpcCase("grpc-index-ready", "RepositoryIndex", service_pb2.RepositoryIndexRequest(ready=True),
             normalize=GRPC_INDEX),
    GrpcCase("grpc-index-other-repository", "RepositoryIndex",
             service_pb2.RepositoryIndexRequest(repository_name="elsewhere")),
    GrpcCase("grpc-infer-raw", "ModelInfer", grpc_add_sub()),
    GrpcCase("grpc-infer-typed", "ModelInfer", grpc_add_sub(raw=False)),
    GrpcCase("grpc-infer-classification", "ModelInfer", grpc_classify(3)),
    GrpcCase("grpc-infer-classification-zero", "ModelInfer", grpc_classify(0)),
    GrpcCase("grpc-infer-classification-negative", "ModelInfer", grpc_classify(-2)),
    GrpcCase("grpc-infer-classification-not-int64", "ModelInfer", grpc_classify("3")),
    GrpcCase("grpc-infer-typed-int32", "ModelInfer", grpc_add_sub("add_sub_int", raw=False, a=[1, 2, 3, 4],
                                                                  b=[1, 1, 1, 1], datatype="INT32")),
    GrpcCase("grpc-infer-id", "ModelInfer", grpc_add_sub(request_id="req-1")),
    GrpcCase("grpc-infer-one-output", "ModelInfer", grpc_add_sub(outputs=("OUTPUT1",))),
    GrpcCase("grpc-infer-custom-parameter", "ModelInfer", grpc_add_sub(parameters={"custom": "x"})),
    # Triton lists a gRPC request's parameters in no fixed order (C++ protobuf seeds each map's hash: 30 identical
    # calls gave 8 orders), so the text is compared as the mapping it is
    GrpcCase("grpc-probe-request-parameters", "ModelInfer",
             grpc_probe("parameters", {"n": 3, "custom": "x", "flag": True, "text": "é"}),
             normalize=parameters_text_unordered),
    GrpcCase("grpc-infer-version", "ModelInfer", grpc_one("versions_all", "1")),
    GrpcCase("grpc-infer-default-version", "ModelInfer", grpc_one("versions_latest")),
    GrpcCase("grpc-infer-version-not-loaded", "ModelInfer", grpc_one("versions_latest", "1")),
    GrpcCase("grpc-infer-version-not-a-number", "ModelInfer", grpc_one("add_sub", "abc")),
    GrpcCase("grpc-infer-batched", "ModelInfer", grpc_add_sub("batched", a=A + A, b=B + B, shape=(2, 4))),
    GrpcCase("grpc-infer-batched-too-large", "ModelInfer", grpc_add_sub("batched", a=A * 9, b=B * 9,
                                                                        shape=(9, 4))),
    GrpcCase("grpc-infer-bytes-raw", "ModelInfer", grpc_text([b"hello", b"world"])),
    GrpcCase("grpc-infer-bytes-typed", "ModelInfer", grpc_text([b"hello", b"world"], typed=True)),
    GrpcCase("grpc-infer-error-response", "ModelInfer", grpc_one("error_response")),
    GrpcCase("grpc-infer-execute-raises", "ModelInfer", grpc_one("raising")),
    GrpcCase("grpc-infer-failed-model", "ModelInfer", grpc_one("init_raises")),
    GrpcCase("grpc-infer-unknown-model", "ModelInfer", grpc_one("nonexistent")),
    GrpcCase("grpc-infer-wrong-shape", "ModelInfer", grpc_add_sub(a=A[:3], b=B[:3], shape=(3,))),
    GrpcCase("grpc-infer-wrong-datatype", "ModelInfer", grpc_add_sub(datatype="INT32", a=[1, 2, 3, 4],
                                                                     b=[1, 1, 1, 1])),
    GrpcCase("grpc-infer-unknown-datatype", "ModelInfer", grpc_add_sub(datatype="FP128")),
    GrpcCase("grpc-infer-raw-count-mismatch", "ModelInfer", wrong_raw_count),
    GrpcCase("grpc-infer-raw-and-typed", "ModelInfer", both_contents),
    GrpcCase("grpc-infer-raw-size-mismatch", "ModelInfer", bad_raw_size),
    GrpcCase("grpc-infer-no-contents", "ModelInfer", no_contents),
    GrpcCase("grpc-infer-typed-count-mismatch", "ModelInfer", grpc_add_sub(raw=False, a=A[:3])),
    GrpcCase("grpc-infer-typed-wrong-field", "ModelInfer", typed_in_wrong_field("int_contents")),
    GrpcCase("grpc-infer-typed-wrong-field-bytes", "ModelInfer", typed_in_wrong_field("bytes_contents")),
    GrpcCase("grpc-infer-typed-two-fields", "ModelInfer", typed_in_wrong_field("int64_contents", also_right=True)),
    GrpcCase("grpc-infer-negative-dimension", "ModelInfer", grpc_add_sub(shape=(-4,))),
    GrpcCase("grpc-infer-huge-dimension", "ModelInfer", grpc_add_sub(shape=(0, 2**62))),
    GrpcCase("grpc-infer-missing-input", "ModelInfer", grpc_one("add_sub")),
    GrpcCase("grpc-infer-unknown-output", "ModelInfer", grpc_add_sub(outputs=("NOPE",))),
    GrpcCase("grpc-infer-reserved-parameter", "ModelInfer",
             grpc_add_sub(parameters={"triton_enable_empty_final_response": True})),
    GrpcCase("grpc-infer-sequence-id-on-plain-model", "ModelInfer", grpc_add_sub(parameters={"sequence_id": 5})),
    GrpcCase("grpc-stats-model", "ModelStatistics", service_pb2.ModelStatisticsRequest(name="add_sub"),
             normalize=GRPC_STATS),
    GrpcCase("grpc-stats-unknown", "ModelStatistics", service_pb2.ModelStatisticsRequest(name="nonexistent")),
    GrpcCase("grpc-stats-version-not-a-number", "ModelStatistics",
             service_pb2.ModelStatisticsRequest(name="add_sub", version="abc")),
    GrpcCase("grpc-load-without-explicit-mode", "RepositoryModelLoad",
             service_pb2.RepositoryModelLoadRequest(model_name="add_sub")),
    GrpcCase("grpc-unload-without-explicit-mode", "RepositoryModelUnload",
             service_pb2.RepositoryModelUnloadRequest(model_name="add_sub")),
    GrpcCase("grpc-stream-two-requests", "ModelStreamInfer", [grpc_add_sub(request_id="a"),
                                                              grpc_add_sub(request_id="b", a=B, b=A)]),
    GrpcCase("grpc-stream-error-then-success", "ModelStreamInfer", [grpc_one("nonexistent"),
                                                                    grpc_add_sub(request_id="ok")]),
    GrpcCase("grpc-stream-bad-request", "ModelStreamInfer", [grpc_add_sub(a=A[:3], b=B[:3], shape=(3,))]),
    # a request that fails before it runs is answered with its own id, so that the client knows which one failed
    GrpcCase("grpc-stream-unknown-model-keeps-its-id", "ModelStreamInfer",
             [with_id(grpc_one("nonexistent"), "s2"), grpc_add_sub(request_id="ok")]),
    GrpcCase("grpc-stream-bad-request-keeps-its-id", "ModelStreamInfer",
             [grpc_add_sub(a=A[:3], b=B[:3], shape=(3,), request_id="s3")]),
    GrpcCase("grpc-stream-execute-raises-keeps-its-id", "ModelStreamInfer", [with_id(grpc_one("raising"), "s4")]),
    GrpcCase("grpc-stream-execute-raises", "ModelStreamInfer", [grpc_one("raising")]),
    GrpcCase("grpc-infer-decoupled", "ModelInfer", grpc_ints("repeat", [1, 2])),
    GrpcCase("grpc-stream-decoupled", "ModelStreamInfer", [grpc_ints("repeat", [4, 5, 6], "r1")]),
    # a slow request's answer comes before a later fast one's (default mode: in request order)
    GrpcCase("grpc-stream-answers-in-request-order", "ModelStreamInfer",
             [with_id(grpc_one("sleepy", value=0.5), "slow"), grpc_add_sub(request_id="fast"),
              with_id(grpc_one("sleepy", value=0.0), "after-slow")]),
    # a decoupled request's responses do not hold back a later default-mode request's
    GrpcCase("grpc-stream-decoupled-not-waited-for", "ModelStreamInfer",
             [grpc_ints("repeat", [-1, 5], "r1"), grpc_add_sub(request_id="fast")]),
    GrpcCase("grpc-stream-decoupled-empty-final", "ModelStreamInfer",
             [grpc_ints("repeat", [4, 5], "r1", {"triton_enable_empty_final_response": True})]),
    GrpcCase("grpc-stream-decoupled-zero-responses", "ModelStreamInfer",
             [grpc_ints("repeat", [], "r1", {"triton_enable_empty_final_response": True})]),
    GrpcCase("grpc-stream-empty-final-on-plain-model", "ModelStreamInfer",
             [grpc_add_sub(request_id="p", parameters={"triton_enable_empty_final_response": True})]),
    GrpcCase("grpc-ensemble-infer", "ModelInfer", grpc_ensemble(), normalize=outputs_by_name),
    GrpcCase("grpc-ensemble-infer-one-output", "ModelInfer", grpc_ensemble(outputs=("DOUBLED",))),
    GrpcCase("grpc-ensemble-infer-of-ensemble", "ModelInfer", grpc_ensemble("pipeline_of_pipeline"),
             normalize=outputs_by_name),
    GrpcCase("grpc-ensemble-infer-failed-graph", "ModelInfer", grpc_ensemble("ensemble_cycle")),
    GrpcCase("grpc-ensemble-config", "ModelConfig", service_pb2.ModelConfigRequest(name="pipeline")),
    GrpcCase("grpc-ensemble-decoupled-stream", "ModelStreamInfer", [grpc_ints("streaming_ensemble", [1, 2, 3], "s1")]),
    GrpcCase("grpc-ensemble-decoupled-stream-empty-final", "ModelStreamInfer", [grpc_ints(
        "streaming_ensemble", [4, 5], "s2", {"triton_enable_empty_final_response": True})],
        normalize=final_flag_folded),
    GrpcCase("grpc-ensemble-decoupled-stream-no-responses", "ModelStreamInfer", [grpc_ints(
        "streaming_ensemble", [], "s3", {"triton_enable_empty_final_response": True})]),
    GrpcCase("grpc-ensemble-decoupled-unary", "ModelInfer", grpc_ints("streaming_ensemble", [1])),
    GrpcCase("grpc-ensemble-decoupled-config", "ModelConfig",
             service_pb2.ModelConfigRequest(name="streaming_ensemble")),
    GrpcCase("grpc-ensemble-metadata", "ModelMetadata", service_pb2.ModelMetadataRequest(name="pipeline")),
    GrpcCase("grpc-shm-register", "SystemSharedMemoryRegister", service_pb2.SystemSharedMemoryRegisterRequest(
        name="grpc_in", key=SHM_INPUT_KEY, byte_size=32)),
    GrpcCase("grpc-shm-register-again", "SystemSharedMemoryRegister", service_pb2.SystemSharedMemoryRegisterRequest(
        name="grpc_in", key=SHM_INPUT_KEY, byte_size=32)),
    GrpcCase("grpc-shm-status", "SystemSharedMemoryStatus", service_pb2.SystemSharedMemoryStatusRequest()),
    GrpcCase("grpc-shm-infer", "ModelInfer", grpc_shm_infer()),
    GrpcCase("grpc-shm-unregister", "SystemSharedMemoryUnregister",
             service_pb2.SystemSharedMemoryUnregisterRequest(name="grpc_in")),
    GrpcCase("grpc-shm-status-unknown", "SystemSharedMemoryStatus",
             service_pb2.SystemSharedMemoryStatusRequest(name="grpc_in")),
    GrpcCase("grpc-sequence-stream", "ModelStreamInfer", [grpc_sequence(5, 31, start=True), grpc_sequence(6, 31),
                                                         grpc_sequence(7, 31, end=True)]),
    GrpcCase("grpc-sequence-string-id", "ModelInfer", grpc_sequence(9, "key-1", start=True, end=True)),
    GrpcCase("grpc-sequence-without-start", "ModelInfer", grpc_sequence(9, 33)),
    GrpcCase("grpc-log-settings", "LogSettings", service_pb2.LogSettingsRequest()),
    GrpcCase("grpc-log-settings-update", "LogSettings", log_settings(log_warning=False)),
    GrpcCase("grpc-log-settings-wrong-type", "LogSettings", log_settings(log_verbose_level=True)),
    GrpcCase("grpc-log-settings-file", "LogSettings", log_settings(log_file="/tmp/elsewhere.log")),
    GrpcCase("grpc-log-settings-restore", "LogSettings", log_settings(log_warning=True)),
    GrpcCase("grpc-trace-setting", "TraceSetting", service_pb2.TraceSettingRequest()),
    GrpcCase("grpc-trace-setting-model", "TraceSetting", trace_settings("add_sub", trace_rate=["4"])),
    GrpcCase("grpc-trace-setting-model-clear", "TraceSetting", trace_settings("add_sub", trace_rate=[])),
    GrpcCase("grpc-trace-setting-bad-rate", "TraceSetting", trace_settings(trace_rate=["x"])),
    GrpcCase("grpc-trace-setting-unknown-model", "TraceSetting", trace_settings("nonexistent")),
    GrpcCase("grpc-system-shared-memory-status", "SystemSharedMemoryStatus",
             service_pb2.SystemSharedMemoryStatusRequest()),
    GrpcCase("grpc-cuda-shared-memory-status", "CudaSharedMemoryStatus",
             service_pb2.CudaSharedMemoryStatusRequest()),
    GrpcCase("grpc-cuda-status-unknown", "CudaSharedMemoryStatus", service_pb2.CudaSharedMemoryStatusRequest(name="x")),
    GrpcCase("grpc-cuda-unregister-all", "CudaSharedMemoryUnregister", service_pb2.CudaSharedMemoryUnregisterRequest()),
    GrpcCase("grpc-cuda-unregister-unknown", "CudaSharedMemoryUnregister",
             service_pb2.CudaSharedMemoryUnregisterRequest(name="x")),
    GrpcCase("grpc-cuda-register", "CudaSharedMemoryRegister", service_pb2.CudaSharedMemoryRegisterRequest(
        name="x", raw_handle=bytes(64), device_id=0, byte_size=16)),
    GrpcCase("grpc-cuda-register-empty-handle", "CudaSharedMemoryRegister",
             service_pb2.CudaSharedMemoryRegisterRequest(name="x", byte_size=16)),
]
