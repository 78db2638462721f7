"""One call sent to both servers, reduced to what a client observes, and compared."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from google.protobuf import json_format
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2

Normalize = Callable[[Any], Any]
HEADER_LENGTH = "inference-header-content-length"


@dataclass(frozen=True)
class HttpCase:
    """An HTTP call: ``body`` a dict (sent as JSON) or bytes; ``port`` "http" or "metrics"."""

    name: str
    method: str
    path: str
    body: dict | bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    normalize: Normalize | None = None
    port: str = "http"


@dataclass(frozen=True)
class GrpcCase:
    """A gRPC call; ``request`` a list of messages for ModelStreamInfer."""

    name: str
    rpc: str
    request: Message | list[Message]
    normalize: Normalize | None = None
    metadata: tuple[tuple[str, str], ...] = ()


_TRACEBACK = re.compile(r"\n\nAt:\n(?:  [^\n]*\n?)*")


def without_traceback(value: Any) -> Any:
    """Triton appends the Python traceback of a model's error (``\n\nAt:\n  <path>(<line>): ...``); we never
    send tracebacks or server paths: the text before it is what both must agree on."""
    if isinstance(value, str):
        return _TRACEBACK.sub("", value)
    if isinstance(value, dict):
        return {key: without_traceback(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_traceback(item) for item in value]
    return value


ERROR_MESSAGE_KEYS = frozenset({"error", "details"})  # an HTTP error body's message, a gRPC status's details


def agree(theirs: Any, ours: Any, key: str | None = None) -> bool:
    """Equal, except that an error message of ours (the value of an ``ERROR_MESSAGE_KEYS`` key) may add
    ``: <detail>`` after Triton's exact text; every other string must be equal."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        return theirs.keys() == ours.keys() and all(agree(theirs[k], ours[k], k) for k in theirs)
    if isinstance(theirs, list) and isinstance(ours, list):
        return len(theirs) == len(ours) and all(agree(t, o) for t, o in zip(theirs, ours, strict=True))
    if (key in ERROR_MESSAGE_KEYS and isinstance(theirs, str) and isinstance(ours, str) and theirs
            and ours.startswith(theirs + ": ")):
        return True
    return theirs == ours


def observe_http(address: str, case: HttpCase, client: httpx.Client) -> dict:
    """Status, the headers that matter, and the body (JSON parsed; binary tensors split off)."""
    content = json.dumps(case.body).encode() if isinstance(case.body, dict) else case.body
    response = client.request(case.method, f"http://{address}{case.path}", content=content, headers=case.headers)
    observed: dict[str, Any] = {"status": response.status_code}
    body = response.content
    if response.status_code < 400 and body:  # Triton labels some JSON errors and empty bodies text/plain
        observed["content-type"] = (response.headers.get("content-type") or "").split(";")[0].lower()
    if HEADER_LENGTH in response.headers:
        length = int(response.headers[HEADER_LENGTH])
        observed["binary"] = body[length:].hex()
        body = body[:length]
    try:
        observed["body"] = json.loads(body) if body else None
    except ValueError:
        observed["body"] = body.decode(errors="replace")
    if case.normalize is not None:
        observed = case.normalize(observed)
    return observed


def _stub_call(channel: grpc.Channel, rpc: str):
    method = f"/inference.GRPCInferenceService/{rpc}"
    request_type = getattr(service_pb2, f"{rpc}Request", None)
    response_type = getattr(service_pb2, f"{rpc}Response", None)
    if rpc == "ModelStreamInfer":
        return channel.stream_stream(method, request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                                     response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
    assert request_type is not None and response_type is not None, rpc
    return channel.unary_unary(method, request_serializer=request_type.SerializeToString,
                               response_deserializer=response_type.FromString)


def as_dict(message: Message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def observe_grpc(address: str, case: GrpcCase) -> dict:
    """Status code, details, and the response message(s) as dicts."""
    with grpc.insecure_channel(address) as channel:
        call = _stub_call(channel, case.rpc)
        try:
            if isinstance(case.request, list):
                response: Any = [as_dict(r) for r in call(iter(case.request), timeout=30, metadata=case.metadata)]
            else:
                response = as_dict(call(case.request, timeout=30, metadata=case.metadata))
            observed: dict[str, Any] = {"code": "OK", "response": response}
        except grpc.RpcError as exc:
            observed = {"code": exc.code().name, "details": exc.details()}
    if case.normalize is not None:
        observed = case.normalize(observed)
    return observed


# -- normalizers -----------------------------------------------------------------------
def each(*normalizers: Normalize) -> Normalize:
    def apply(value):
        for normalize in normalizers:
            value = normalize(value)
        return value

    return apply


def replace_at(path: str, replacement: Any) -> Normalize:
    """Replace the value at a dotted path (``*`` walks every list item / dict value) when present."""
    parts = path.split(".")

    def walk(value, index: int):
        if index == len(parts) - 1:
            key = parts[index]
            if key == "*" and isinstance(value, list):
                return [replacement for _ in value]
            if isinstance(value, dict) and key in value:
                value[key] = replacement(value[key]) if callable(replacement) else replacement
            return value
        key = parts[index]
        if key == "*":
            children = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else []
            for child in children:
                walk(child, index + 1)
        elif isinstance(value, dict) and key in value:
            walk(value[key], index + 1)
        return value

    def apply(observed):
        return walk(observed, 0)

    return apply


def drop(*paths: str) -> Normalize:
    """Remove the keys at dotted paths."""
    marker = object()

    def apply(observed):
        for path in paths:
            replace_at(path, marker)(observed)
            _remove(observed, marker)
        return observed

    return apply


def _remove(value, marker) -> None:
    if isinstance(value, dict):
        for key in [k for k, v in value.items() if v is marker]:
            del value[key]
        for child in value.values():
            _remove(child, marker)
    elif isinstance(value, list):
        for child in value:
            _remove(child, marker)


def sort_list(path: str, key: str = "name") -> Normalize:
    return replace_at(path, lambda items: sorted(items, key=lambda item: json.dumps(item.get(key) if isinstance(
        item, dict) else item, sort_keys=True)) if isinstance(items, list) else items)


def final_flag_folded(observed: dict) -> dict:
    """A stream whose last response is an empty final one, folded into the response before it. Triton's
    ensemble sends a decoupled step's completion either on the last response or as an empty response right
    after it, whichever its threads reach first (both seen from Triton 2.51 on the same request); a client
    sees the same stream either way."""
    responses = observed.get("response")
    if not isinstance(responses, list) or len(responses) < 2:
        return observed
    last = responses[-1].get("infer_response", {})
    if set(last) <= {"model_name", "id", "parameters"} and last.get("parameters") == {
            "triton_final_response": {"bool_param": True}}:
        previous = responses[-2].get("infer_response", {})
        previous.setdefault("parameters", {})["triton_final_response"] = {"bool_param": True}
        observed["response"] = responses[:-1]
    return observed


def parameters_text_unordered(observed: dict) -> dict:
    """A probe's answer (one BYTES element holding ``request.parameters()``'s JSON) as the mapping it holds."""
    raws = observed.get("response", {}).get("raw_output_contents")
    if isinstance(raws, list) and len(raws) == 1:
        raw = base64.b64decode(raws[0])
        text = raw[4:4 + int.from_bytes(raw[:4], "little")].decode()
        observed["response"]["raw_output_contents"] = [json.loads(text)]
    return observed


def outputs_by_name(observed: dict) -> dict:
    """An ensemble's outputs in name order, raw contents alongside (Triton answers them in its hash map's order:
    neither the config's nor the request's)."""
    body = observed.get("body", observed.get("response"))
    if isinstance(body, dict) and isinstance(body.get("outputs"), list):
        raws = body.get("raw_output_contents")
        if isinstance(raws, list) and len(raws) == len(body["outputs"]):
            pairs = sorted(zip(body["outputs"], raws, strict=True), key=lambda pair: pair[0].get("name", ""))
            body["outputs"], body["raw_output_contents"] = [p[0] for p in pairs], [p[1] for p in pairs]
        else:
            body["outputs"] = sorted(body["outputs"], key=lambda output: output.get("name", ""))
    return observed


def server_sent_events(observed: dict) -> dict:
    """An event-stream body as its events' JSON (``data: {...}`` lines), and whether each event is framed as
    ``data: <json>\n\n``."""
    body = observed.get("body")
    if isinstance(body, str):
        lines = body.split("\n")
        events = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
        observed["body"] = {"events": events, "framed": body.count("data: ") == body.count("\n\n") == len(events)}
    return observed
