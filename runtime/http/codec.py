"""JSON and binary-tensor (Triton extension) encoding of V2 REST infer messages."""

from __future__ import annotations

import json
from typing import Any

from runtime.datatypes import (
    DATATYPES,
    array_from_buffer,
    array_from_values,
    array_to_buffer,
    array_to_values,
    for_input,
)
from runtime.errors import InvalidArgument, Unsupported
from runtime.types import InferRequest, InferResponse, InferTensor, RequestedOutput

HEADER_LENGTH = "Inference-Header-Content-Length"
_UNSUPPORTED_PARAMETERS = ("shared_memory_region", "classification")


def parse_json(data: bytes) -> Any:
    """Parse JSON, turning every failure (syntax, encoding, nesting depth) into InvalidArgument."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    except RecursionError:
        raise InvalidArgument("failed to parse the request JSON buffer: nested too deeply") from None


def _object(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a JSON object")
    return value


def _parameters(container: dict, what: str) -> dict:
    parameters = container.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidArgument(f"{what} 'parameters' must be a JSON object")
    for key in _UNSUPPORTED_PARAMETERS:
        if key in parameters:
            raise Unsupported(f"parameter '{key}' is not supported by this server")
    return parameters


def _shape(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise InvalidArgument(f"input '{name}': 'shape' must be a list of integers")
    if any(d < 0 for d in value):
        raise InvalidArgument(f"input '{name}': shape {value} has a negative dimension")
    return tuple(value)


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """Split a request body into its JSON header and binary section."""
    if header_length is None:
        return body, memoryview(b"")
    text = header_length.strip()
    if not (text.isascii() and text.isdigit()):
        raise InvalidArgument(f"{HEADER_LENGTH} must be a non-negative integer, got '{header_length[:32]}'")
    length = int(text)
    if length > len(body):
        raise InvalidArgument(f"{HEADER_LENGTH} {length} is larger than the request body ({len(body)} bytes)")
    view = memoryview(body)
    return body[:length], view[length:]


def decode_infer_request(
    body: bytes, header_length: str | None, model_name: str, model_version: str
) -> tuple[InferRequest, bool]:
    """Decode a V2 infer request; returns it and whether outputs default to binary."""
    header, binary = split_body(body, header_length)
    message = _object(parse_json(header), "the request")
    parameters = dict(_parameters(message, "request"))
    binary_default = parameters.pop("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise InvalidArgument("parameter 'binary_data_output' must be a boolean")
    request_id = message.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("'id' must be a string")
    raw_inputs = message.get("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidArgument("the request must have an 'inputs' list")
    inputs: list[InferTensor] = []
    offset = 0
    for raw in raw_inputs:
        raw = _object(raw, "each input")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArgument("each input must have a 'name' string")
        datatype = raw.get("datatype")
        if datatype not in DATATYPES:
            raise InvalidArgument(f"input '{name}': unsupported datatype '{datatype}'")
        shape = _shape(raw.get("shape"), name)
        input_parameters = _parameters(raw, f"input '{name}'")
        size = input_parameters.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidArgument(f"input '{name}': binary_data_size must be a non-negative integer")
            if offset + size > len(binary):
                raise InvalidArgument(
                    f"input '{name}': binary_data_size {size} runs past the end of the binary data "
                    f"({len(binary) - offset} bytes left)"
                )
            data = for_input(name, array_from_buffer, datatype, shape, binary[offset : offset + size])
            offset += size
        elif "data" in raw:
            data = for_input(name, array_from_values, datatype, shape, raw["data"])
        else:
            raise InvalidArgument(f"input '{name}' has neither 'data' nor 'binary_data_size'")
        inputs.append(InferTensor(name=name, datatype=datatype, shape=shape, data=data))
    if offset != len(binary):
        raise InvalidArgument(
            f"the binary data holds {len(binary)} bytes but the inputs' binary_data_size add up to {offset}"
        )
    outputs = []
    raw_outputs = message.get("outputs", [])
    if not isinstance(raw_outputs, list):
        raise InvalidArgument("'outputs' must be a list")
    for raw in raw_outputs:
        raw = _object(raw, "each output")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArgument("each output must have a 'name' string")
        output_parameters = _parameters(raw, f"output '{name}'")
        if not isinstance(output_parameters.get("binary_data", False), bool):
            raise InvalidArgument(f"output '{name}': binary_data must be a boolean")
        outputs.append(RequestedOutput(name=name, parameters=dict(output_parameters)))
    request = InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=request_id,
        inputs=inputs,
        outputs=outputs,
        parameters=parameters,
    )
    return request, binary_default


def encode_infer_response(response: InferResponse, binary_default: bool) -> tuple[bytes, int | None]:
    """Encode a response; returns the body and the JSON header length if binary data follows."""
    outputs: list[dict] = []
    chunks: list[bytes] = []
    for tensor in response.outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        if tensor.parameters.get("binary_data", binary_default):
            chunk = array_to_buffer(tensor.data, tensor.datatype)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            entry["data"] = array_to_values(tensor.data, tensor.datatype)
        outputs.append(entry)
    message: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        message["id"] = response.id
    message["outputs"] = outputs
    header = json.dumps(message, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)
