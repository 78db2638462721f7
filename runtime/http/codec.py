"""JSON and binary-tensor (Triton extension) encoding of V2 REST infer messages.

The JSON header is scanned once by msgspec into small typed records whose ``data`` stays raw
text, parsed straight into numpy by :mod:`runtime.http.json_data`.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from runtime.datatypes import DATATYPES, array_to_buffer, for_input
from runtime.errors import InvalidArgument
from runtime.extensions.shared_memory import REGION_PARAMETER, require_no_regions
from runtime.http.binary_form import BinaryForms
from runtime.http.json_data import array_from_json, cut_out_arrays, dumps, json_fragment
from runtime.types import InferRequest, InferResponse, InferTensor, RequestedOutput

HEADER_LENGTH = "Inference-Header-Content-Length"
RAW_INPUT = "raw_input"  # the name Triton gives the one input of a raw binary request
RESERVED_PREFIX = "triton_"
_LARGE_HEADER = 1 << 20  # headers past this size have their large data arrays cut out before parsing
BINARY_FORMS = BinaryForms()  # the headers tritonclient sends, read once each
_CONTENT_FIELDS = "'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'"


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


# Where msgspec's structural complaints point, and what we say instead (Triton's words).
_STRUCTURE_ERRORS = (
    ("$.inputs[", f"Input must set only one of the following fields: {_CONTENT_FIELDS}. But no field is set"),
    ("$.inputs", "Unable to parse 'inputs': attempt to access JSON non-array as array"),
    ("$.outputs[", "Unable to parse 'name': attempt to access non-existing object member 'name'"),
    ("$.outputs", "Unable to parse 'outputs': attempt to access JSON non-array as array"),
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
    if what == "request":
        require_no_regions(parameters)
    return parameters


def _shape(value: Any, name: str) -> tuple[int, ...]:
    if type(value) is list and all(type(d) is int and d >= 0 for d in value):  # the common case, in one pass
        return tuple(value)
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise InvalidArgument(f"input '{name}': 'shape' must be a list of integers")
    if any(d < 0 for d in value):
        raise InvalidArgument(f"input '{name}': shape {value} has a negative dimension")
    return tuple(value)


def _no_elements(shape: Any) -> bool:
    """Whether a shape as sent (before it is checked) has a zero dimension: Triton reads no data for it."""
    return isinstance(shape, list) and 0 in shape


def _atoi(text: str) -> int:
    """C's atoi: optional whitespace and sign, then the leading digits; 0 when there are none."""
    if text.isascii() and text.isdigit():  # the common case: a plain number
        return int(text)
    stripped = text.lstrip(" \t\n\r\v\f")
    sign, digits = (-1, stripped[1:]) if stripped[:1] == "-" else (1, stripped[1:] if stripped[:1] == "+" else stripped)
    length = 0
    while length < len(digits) and digits[length].isascii() and digits[length].isdigit():
        length += 1
    return sign * int(digits[:length]) if length else 0


def header_size(body: bytes | memoryview, header_length: str | None) -> int:
    """How many leading bytes of the body are the JSON header (0: a raw binary request), as Triton reads it."""
    if header_length is None:
        return len(body)
    value = _atoi(header_length)
    if value < 0 or value > len(body):
        raise InvalidArgument(f"inference header size should be in range (0, {len(body)}), got: {header_length[:32]}")
    return value


def decode_infer_request(
    body: bytes | memoryview, header_length: str | None, model_name: str, model_version: str
) -> tuple[InferRequest, bool]:
    """Decode a V2 infer request; returns it and whether outputs default to binary.  A body received into a
    buffer (a memoryview) has its JSON header read as bytes and its tensors left in place.

    A header size of 0 (an empty body, or ``Inference-Header-Content-Length: 0``) makes a raw binary
    request, as in Triton: the whole body is the data of the model's one input.
    """
    size = header_size(body, header_length)
    if size == 0:
        raw = InferTensor(RAW_INPUT, "", (), None, raw=memoryview(body))
        return InferRequest(model_name=model_name, model_version=model_version, inputs=[raw], raw_input=True), True
    header = bytes(body[:size]) if isinstance(body, memoryview) else body[:size]
    binary = memoryview(body)[size:]
    if (decoded := BINARY_FORMS.request(header, binary, model_name, model_version)) is not None:
        return decoded
    if len(header) > _LARGE_HEADER:
        light, spans = cut_out_arrays(header)
        if spans:
            decoded = _decode_header(light, header, spans, binary, model_name, model_version)
            if decoded is not None:
                return decoded
    whole = _decode_header(header, header, {}, binary, model_name, model_version)
    assert whole is not None  # None only where arrays were cut out
    return whole


def _decode_header(
    text: bytes, header: bytes, spans: dict[bytes, tuple[int, int]], binary: memoryview, model_name: str,
    model_version: str,
) -> tuple[InferRequest, bool] | None:
    """Decode ``text``: the header itself, or the header with large data arrays cut out (``spans``: where
    each marker's array lies in ``header``).  None if a marker ended up anywhere but an input's data."""
    spans = dict(spans)
    message = _decode_message(text)
    parameters = dict(_parameters(message.parameters, "request"))
    if parameters and any(key.startswith(RESERVED_PREFIX) for key in parameters):  # Triton checks this over HTTP only
        raise InvalidArgument(
            "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
        )
    binary_default = parameters.pop("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise InvalidArgument("Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean")
    if not isinstance(message.id, str):
        raise InvalidArgument("Unable to parse 'id': attempt to access JSON non-string as string")
    if message.inputs is None:
        raise InvalidArgument("Unable to parse 'inputs': attempt to access non-existing object member 'inputs'")
    inputs: list[InferTensor] = []
    offset = 0
    for raw in message.inputs:
        input_parameters = _parameters(raw.parameters, "input")
        fields = [present for present in (len(raw.data) > 0, "binary_data_size" in input_parameters,
                                          "shared_memory_region" in input_parameters) if present]
        if len(fields) != 1:
            raise InvalidArgument(f"Input must set only one of the following fields: {_CONTENT_FIELDS}. But "
                                  f"{'no field is' if not fields else 'more than one field is'} set")
        name = raw.name
        if not isinstance(name, str) or not name:
            raise InvalidArgument("Unable to parse 'name': attempt to access JSON non-string as string")
        datatype = raw.datatype
        if not isinstance(datatype, str):
            raise InvalidArgument(f"input '{name}': 'datatype' must be a string")
        if datatype in ("FP16", "BF16") and len(raw.data) > 0 and not _no_elements(raw.shape):
            raise InvalidArgument(f"receiving {datatype} data via JSON is not supported. Please use the binary data "
                                  f"format for input {name}")
        if datatype not in DATATYPES:
            raise InvalidArgument(f"invalid datatype for input {name}")
        shape = _shape(raw.shape, name)
        if REGION_PARAMETER in input_parameters:  # read from the region where the core resolves it
            inputs.append(InferTensor(name=name, datatype=datatype, shape=shape, data=None,
                                      parameters=dict(input_parameters)))
            continue
        size = input_parameters.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidArgument(f"input '{name}': binary_data_size must be a non-negative integer")
            if offset + size > len(binary):
                raise InvalidArgument(f"unexpected size for input '{name}', expecting {offset + size - len(binary)} "
                                      f"additional bytes for model '{model_name}'")
            inputs.append(InferTensor(name=name, datatype=datatype, shape=shape, data=None,
                                      raw=binary[offset : offset + size]))
            offset += size
            continue
        if 0 in shape:  # no elements: like Triton, read no data and let the model's shape decide
            inputs.append(InferTensor(name=name, datatype=datatype, shape=shape, data=None, raw=b""))
            continue
        if (span := spans.pop(bytes(raw.data), None)) is not None:
            data = for_input(name, array_from_json, datatype, shape, header, *span)
        else:
            data = for_input(name, array_from_json, datatype, shape, bytes(raw.data))
        inputs.append(InferTensor(name=name, datatype=datatype, shape=shape, data=data))
    if offset != len(binary):
        raise InvalidArgument(f"unexpected additional input data for model '{model_name}'")
    if spans:
        return None
    outputs = []
    for wanted in message.outputs or ():
        name = wanted.name
        if not isinstance(name, str) or not name:
            raise InvalidArgument("Unable to parse 'name': attempt to access JSON non-string as string")
        output_parameters = _parameters(wanted.parameters, f"output '{name}'")
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


def encode_infer_response(response: InferResponse,
                          binary_default: bool) -> tuple[list[bytes | memoryview], int | None]:
    """Encode a response: the body as the parts it is joined from (the JSON header, then each binary output read
    in place: sent as they are, a large answer is copied once, into its chunks), and the JSON header's length if
    binary data follows."""
    outputs: list[dict] = []
    chunks: list[bytes | memoryview] = []
    for tensor in response.outputs:
        # the shape as it is: msgspec writes a tuple as an array
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if tensor.in_shared_memory:  # written into the region the request named
            pass
        elif tensor.parameters.get("binary_data", binary_default):
            chunk = array_to_buffer(tensor.values(), tensor.datatype)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            entry["data"] = json_fragment(tensor.values(), tensor.datatype)
        outputs.append(entry)
    message: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        message["id"] = response.id
    if response.parameters:
        message["parameters"] = response.parameters
    message["outputs"] = outputs
    header = dumps(message)
    if not chunks:
        return [header], None
    return [header, *chunks], len(header)
