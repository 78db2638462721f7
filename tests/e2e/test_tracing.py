"""Triton's trace extension: settings and sampling (in process), the trace file a served request leaves (mode
triton), and spans sent over OTLP/HTTP to a receiver on loopback (mode opentelemetry), continuing the client's W3C
trace context.  The settings API's answers are compared with Triton by the conformance suite."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from runtime.errors import InvalidArgument, Unsupported
from runtime.extensions.tracing import Tracer, TraceSettings, parse_trace_config
from tests.conformance.models import ADD_SUB, ADD_SUB_CONFIG, DOUBLE, DOUBLE_CONFIG, ensemble_config
from tests.support import ServerProcess, write_model

A = [1.0, 2.0, 3.0, 4.0]
TIMESTAMPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
              "COMPUTE_END", "INFER_RESPONSE_COMPLETE", "REQUEST_END"]


def test_trace_config_flags_as_triton_takes_them():
    settings = parse_trace_config(["triton,file=/tmp/t.json", "triton,log-frequency=50", "rate=100",
                                   "level=TIMESTAMPS", "level=TENSORS", "count=10"])
    assert settings.as_json() == {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "100",
                                  "trace_count": "10", "log_frequency": "50", "trace_file": "/tmp/t.json",
                                  "trace_mode": "triton"}
    otel = parse_trace_config(["mode=opentelemetry", "opentelemetry,url=http://c:4318/v1/traces",
                               "opentelemetry,resource=service.name=fn"])
    assert otel.mode == "opentelemetry" and otel.otel_resource == (("service.name", "fn"),)
    for bad in ("rate", "level=LOUD", "triton,colour=red", "count=-2", "mode=zipkin"):
        with pytest.raises(ValueError, match="--trace-config"):
            parse_trace_config([bad])


def test_settings_update_clear_and_model_overrides():
    tracer = Tracer(TraceSettings(level=("TIMESTAMPS",), rate=1, file="/tmp/t.json"),
                    model_known=lambda name: name == "m")
    assert tracer.update({"trace_rate": "9"})["trace_rate"] == "9"
    assert tracer.update({"trace_rate": None})["trace_rate"] == "1"  # back to its value at start
    assert tracer.update({"trace_count": "4"}, "m")["trace_count"] == "4"
    assert tracer.settings()["trace_count"] == "-1" and tracer.settings("m")["trace_count"] == "4"
    assert tracer.update({"trace_count": None}, "m")["trace_count"] == "-1"  # follows the global one again
    with pytest.raises(InvalidArgument, match="Request for unknown model : x"):
        tracer.settings("x")
    with pytest.raises(Unsupported, match="can not be updated through network protocol"):
        tracer.update({"trace_file": "/elsewhere"})
    with pytest.raises(InvalidArgument, match="Unable to parse 'trace_rate', got: abc"):
        tracer.update({"trace_rate": "abc"})


def test_sampling_follows_rate_and_count():
    tracer = Tracer(TraceSettings(level=("TIMESTAMPS",), rate=3, count=2, file="/tmp/t.json"))
    sampled = [tracer.start("m") is not None for _ in range(12)]
    assert sampled == [False, False, True, False, False, True] + [False] * 6  # every 3rd, two in all
    assert tracer.settings()["trace_count"] == "0"
    assert Tracer().start("m") is None  # level OFF


def test_idle_while_nothing_can_be_sampled():
    tracer = Tracer(TraceSettings(file="/tmp/t.json"), model_known=lambda name: name == "m")
    assert tracer.idle and tracer.start("m") is None  # level OFF at start
    tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}, "m")
    assert not tracer.idle and tracer.start("m") is not None  # one model's own settings
    tracer.update({"trace_level": None, "trace_rate": None}, "m")
    assert tracer.idle
    tracer.update({"trace_level": ["TIMESTAMPS"]})
    assert not tracer.idle
    tracer.update({"trace_level": ["OFF"]})
    assert tracer.idle


def _infer(url: str, model: str, headers: dict | None = None) -> None:
    body = {"id": "req-1", "inputs": [{"name": name, "datatype": "FP32", "shape": [1, 4], "data": A}
                                      for name in ("A", "B")]}
    if model == "add_sub":
        body = {"id": "req-1", "inputs": [{"name": name, "datatype": "FP32", "shape": [4], "data": A}
                                          for name in ("INPUT0", "INPUT1")]}
    answer = httpx.post(f"http://{url}/v2/models/{model}/infer", json=body, headers=headers or {}, timeout=30)
    assert answer.status_code == 200, answer.text


def build_trace_repository(root: Path) -> Path:
    """add_sub, and the ensemble pipeline (batched, then double)."""
    write_model(root, "add_sub", ADD_SUB_CONFIG.format(name="add_sub", max_batch=0, dtype="TYPE_FP32", extra=""),
                {"1/model.py": ADD_SUB})
    write_model(root, "batched", ADD_SUB_CONFIG.format(name="batched", max_batch=8, dtype="TYPE_FP32", extra=""),
                {"1/model.py": ADD_SUB})
    write_model(root, "double", DOUBLE_CONFIG.format(dtype="TYPE_FP32"), {"1/model.py": DOUBLE})
    write_model(root, "pipeline", ensemble_config([
        ("batched", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "sum", "OUTPUT1": "DIFF"}),
        ("double", {"X": "sum"}, {"Y": "DOUBLED"})]))
    (root / "pipeline" / "1").mkdir()
    return root


@pytest.fixture
def repository(tmp_path):
    return build_trace_repository(tmp_path / "models")


TRACE_FLAGS = ("level=TIMESTAMPS", "rate=1")  # with "triton,file=<path>", each after --trace-config


def send_traced_requests(http_url: str, grpc_url: str) -> None:
    """add_sub and pipeline over HTTP (request id req-1), add_sub over gRPC (over-grpc)."""
    _infer(http_url, "add_sub")
    _infer(http_url, "pipeline")
    client = grpcclient.InferenceServerClient(grpc_url)
    inputs = [grpcclient.InferInput(name, [4], "FP32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.asarray(A, np.float32))
    client.infer("add_sub", inputs, request_id="over-grpc")
    client.close()


def read_traces(trace_file: Path) -> dict[int, dict]:
    """A trace file's records by trace id: each trace's fields, and its timestamps as ``events`` (name, ns)."""
    traces: dict[int, dict] = {}
    for record in json.loads(trace_file.read_text()):
        trace = traces.setdefault(record["id"], {"events": []})
        if "timestamps" in record:
            trace["events"] += [(t["name"], t["ns"]) for t in record["timestamps"]]
        else:
            trace.update(record)
    return traces


# The front end's timestamps Triton adds to a request's top-level trace, which ours does not record (README, "Where
# we differ from Triton": trace front-end events)
FRONT_END_EVENTS = frozenset({"HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END",
                              "GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"})


def trace_shape(traces: dict[int, dict]) -> list[dict]:
    """What two servers' trace files of the same requests must share: each trace's fields, its events (by name:
    the order Triton writes them in is the order its threads record them, not their times'; the front end's left
    out), and its parent's model (ids and times differ)."""
    shape = []
    for trace in traces.values():
        parent = traces.get(trace.get("parent_id", -1))
        shape.append({"fields": sorted(key for key in trace if key != "events"), "model": trace.get("model_name"),
                      "version": trace.get("model_version"), "request_id": trace.get("request_id"),
                      "events": sorted(name for name, _ in trace["events"] if name not in FRONT_END_EVENTS),
                      "parent": parent.get("model_name") if parent else None})
    return sorted(shape, key=lambda entry: json.dumps(entry, sort_keys=True))


def test_trace_file_records_each_request_and_links_ensemble_steps(repository, tmp_path):
    trace_file = tmp_path / "trace.json"
    flags = [part for flag in (f"triton,file={trace_file}", *TRACE_FLAGS) for part in ("--trace-config", flag)]
    with ServerProcess(repository, *flags) as server:
        send_traced_requests(server.http_url, server.grpc_url)
    traces = read_traces(trace_file)  # written out at shutdown (log_frequency 0)
    by_model = {}
    for trace in traces.values():
        by_model.setdefault(trace["model_name"], []).append(trace)
    assert sorted(by_model) == ["add_sub", "batched", "double", "pipeline"]
    assert sorted(t["request_id"] for t in by_model["add_sub"]) == ["over-grpc", "req-1"]
    plain = by_model["add_sub"][0]
    assert [name for name, _ in plain["events"]] == TIMESTAMPS and plain["model_version"] == 1
    times = dict(plain["events"])
    assert times["REQUEST_START"] <= times["QUEUE_START"] <= times["COMPUTE_START"] <= times["COMPUTE_END"] \
        <= times["REQUEST_END"]
    ensemble = by_model["pipeline"][0]
    assert "parent_id" not in ensemble
    assert by_model["batched"][0]["parent_id"] == ensemble["id"] == by_model["double"][0]["parent_id"]


def test_tracing_turned_on_for_one_model_while_serving(repository, tmp_path):
    trace_file = tmp_path / "trace.json"
    with ServerProcess(repository, "--trace-config", f"triton,file={trace_file}") as server:  # level OFF
        url = f"127.0.0.1:{server.http_port}"
        _infer(url, "add_sub")
        answer = httpx.post(f"http://{url}/v2/models/add_sub/trace/setting",
                            json={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}, timeout=30)
        assert answer.status_code == 200, answer.text
        _infer(url, "add_sub")
        _infer(url, "pipeline")
    records = json.loads(trace_file.read_text())
    assert {record["model_name"] for record in records if "model_name" in record} == {"add_sub"}
    assert len({record["id"] for record in records}) == 1  # the request after the change only


class _OtlpReceiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list = []
        received = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                message = ExportTraceServiceRequest.FromString(body)
                received.extend(span for resource in message.resource_spans for scope in resource.scope_spans
                                for span in scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_opentelemetry_mode_exports_spans_continuing_the_client_context(repository):
    receiver = _OtlpReceiver()
    trace_id, parent_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    try:
        with ServerProcess(repository, "--trace-config", "mode=opentelemetry", "--trace-config",
                           f"opentelemetry,url=http://127.0.0.1:{receiver.server_port}/v1/traces",
                           "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=0") as server:
            url = f"127.0.0.1:{server.http_port}"
            _infer(url, "add_sub")  # rate 0: not traced without a context
            _infer(url, "pipeline", {"traceparent": f"00-{trace_id}-{parent_span}-01"})
        # the batch span processor sends what it holds when the server shuts down
    finally:
        receiver.shutdown()
        receiver.server_close()
    spans = {span.name: span for span in receiver.spans}
    assert sorted(spans) == ["InferRequest", "batched", "compute", "double", "pipeline"]
    assert len(receiver.spans) == 6  # one top-level span, three model spans, a compute span per composing model
    top = spans["InferRequest"]
    assert top.trace_id.hex() == trace_id and top.parent_span_id.hex() == parent_span
    assert all(span.trace_id.hex() == trace_id for span in receiver.spans)
    assert spans["pipeline"].parent_span_id == top.span_id
    assert spans["batched"].parent_span_id == spans["pipeline"].span_id
    assert [event.name for event in spans["batched"].events][:2] == ["REQUEST_START", "QUEUE_START"]
    attributes = {a.key: a.value for a in spans["batched"].attributes}
    assert attributes["model_name"].string_value == "batched" and attributes["request_id"].string_value == "req-1"
    computes = [span for span in receiver.spans if span.name == "compute"]
    assert [event.name for event in computes[0].events] == TIMESTAMPS[2:6]
