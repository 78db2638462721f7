"""JSON and binary-tensor (Triton extension) encoding of V2 REST infer messages.

The JSON header is scanned once by msgspec into small typed records whose ``data`` stays raw
text, parsed straight into numpy by :mod:`runtime.http.json_data`.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from runtime.datatypes import DATATYPES, array_from_buffer, array_to_buffer, for_input
from runtime.errors import InvalidArgument, Unsupported
from runtime.http.json_data import array_from_json, cut_out_arrays, dumps, json_fragment
from runtime.types import InferRequest, InferResponse, InferTensor, RequestedOutput

HEADER_LENGTH = "Inference-Header-Content-Length"
_LARGE_HEADER = 1 << 20  # headers past this size have their large data arrays cut out before parsing
_UNSUPPORTED_PARAMETERS = ("shared_memory_region", "classification")


class _Input(msgspec.Struct):
    name: Any = None
    datatype: Any = None
    shape: Any = None
    data: msgspec.Raw = msgspec.Raw()  # empty: absent
    parameters: Any = None


class _Output(msgspec.Struct):
    name: Any = None
    parameters: Any = None


class _Message(msgspec.Struct):
    inputs: list[_Input] | None = None
    outputs: list[_Output] | None = None
    id: Any = ""
    parameters: Any = None


# Where msgspec's structural complaints point, and what we say instead.
_STRUCTURE_ERRORS = (
    ("$.inputs[", "each input must be a JSON object"),
    ("$.inputs", "the request must have an 'inputs' list"),
    ("$.outputs[", "each output must be a JSON object"),
    ("$.outputs", "'outputs' must be a list"),
)


def _decode_message(header: bytes) -> _Message:
    try:
        return msgspec.json.decode(header, type=_Message)
    except msgspec.ValidationError as exc:
        text = str(exc)
        where = text.rpartition(" - at `")[2].rstrip("`")
        for prefix, message in _STRUCTURE_ERRORS:
            if where.startswith(prefix):
                raise InvalidArgument(message) from None
        raise InvalidArgument("failed to parse the request JSON buffer: the request must be a JSON object") from None
    except msgspec.DecodeError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    except RecursionError:
        raise InvalidArgument("failed to parse the request JSON buffer: nested too deeply") from None


def parse_json(data: bytes) -> Any:
    """Parse JSON, turning every failure (syntax, encoding, nesting depth) into InvalidArgument."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    except RecursionError:
        raise InvalidArgument("failed to parse the request JSON buffer: nested too deeply") from None


def _parameters(parameters: Any, what: str) -> dict:
    if parameters is None:
        return {}
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
    if len(header) > _LARGE_HEADER:
        light, spans = cut_out_arrays(header)
        if spans:
            decoded = _decode_header(light, header, spans, binary, model_name, model_version)
            if decoded is not None:
                return decoded
    return _decode_header(header, header, {}, binary, model_name, model_version)


def _decode_header(
    text: bytes, header: bytes, spans: dict[bytes, tuple[int, int]], binary: memoryview, model_name: str,
    model_version: str,
) -> tuple[InferRequest, bool] | None:
    """Decode ``text``: the header itself, or the header with large data arrays cut out (``spans``: where
    each marker's array lies in ``header``).  None if a marker ended up anywhere but an input's data."""
    spans = dict(spans)
    message = _decode_message(text)
    parameters = dict(_parameters(message.parameters, "request"))
    binary_default = parameters.pop("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise InvalidArgument("parameter 'binary_data_output' must be a boolean")
    if not isinstance(message.id, str):
        raise InvalidArgument("'id' must be a string")
    if message.inputs is None:
        raise InvalidArgument("the request must have an 'inputs' list")
    inputs: list[InferTensor] = []
    offset = 0
    for raw in message.inputs:
        name = raw.name
        if not isinstance(name, str) or not name:
            raise InvalidArgument("each input must have a 'name' string")
        datatype = raw.datatype
        if not isinstance(datatype, str):
            raise InvalidArgument(f"input '{name}': 'datatype' must be a string")
        if datatype not in DATATYPES:
            raise InvalidArgument(f"input '{name}': unsupported datatype '{datatype[:32]}'")
        shape = _shape(raw.shape, name)
        input_parameters = _parameters(raw.parameters, f"input '{name}'")
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
        elif (span := spans.pop(bytes(raw.data), None)) is not None:
            data = for_input(name, array_from_json, datatype, shape, header, *span)
        elif len(raw.data):
            data = for_input(name, array_from_json, datatype, shape, bytes(raw.data))
        else:
            raise InvalidArgument(f"input '{name}' has neither 'data' nor 'binary_data_size'")
        inputs.append(InferTensor(name=name, datatype=datatype, shape=shape, data=data))
    if offset != len(binary):
        raise InvalidArgument(
            f"the binary data holds {len(binary)} bytes but the inputs' binary_data_size add up to {offset}"
        )
    if spans:
        return None
    outputs = []
    for raw in message.outputs or ():
        name = raw.name
        if not isinstance(name, str) or not name:
            raise InvalidArgument("each output must have a 'name' string")
        output_parameters = _parameters(raw.parameters, f"output '{name}'")
        if not isinstance(output_parameters.get("binary_data", False), bool):
            raise InvalidArgument(f"output '{name}': binary_data must be a boolean")
        outputs.append(RequestedOutput(name=name, parameters=dict(output_parameters)))
    request = InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=message.id,
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
            entry["data"] = json_fragment(tensor.data, tensor.datatype)
        outputs.append(entry)
    message: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        message["id"] = response.id
    message["outputs"] = outputs
    header = dumps(message)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)
