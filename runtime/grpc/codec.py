"""Conversion between GRPCInferenceService messages and the core's request/response types."""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2

from runtime.datatypes import DATATYPES, array_from_buffer, array_from_values, array_to_buffer, for_input
from runtime.errors import InvalidArgument, Unsupported
from runtime.types import InferRequest, InferResponse, InferTensor, RequestedOutput

# Typed ``contents`` field that carries each datatype (FP16 has none: raw contents only).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_UNSUPPORTED_PARAMETERS = ("shared_memory_region", "classification")


def parameters_to_dict(parameters) -> dict[str, Any]:
    """A map<string, InferParameter> as plain Python values."""
    result: dict[str, Any] = {}
    for key, parameter in parameters.items():
        which = parameter.WhichOneof("parameter_choice")
        result[key] = getattr(parameter, which) if which else None
    return result


def _check_parameters(parameters: dict[str, Any], what: str) -> None:
    for key in _UNSUPPORTED_PARAMETERS:
        if key in parameters:
            raise Unsupported(f"{what}: parameter '{key}' is not supported by this server")


def _set_parameter(target, key: str, value: Any) -> None:
    if isinstance(value, bool):
        target[key].bool_param = value
    elif isinstance(value, int):
        target[key].int64_param = value
    elif isinstance(value, float):
        target[key].double_param = value
    else:
        target[key].string_param = str(value)


def _input_array(tensor, raw: bytes | None) -> np.ndarray:
    name, datatype = tensor.name, tensor.datatype
    if datatype not in DATATYPES:
        raise InvalidArgument(f"input '{name}': unsupported datatype '{datatype}'")
    shape = tuple(tensor.shape)
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"input '{name}': shape {list(shape)} has a negative dimension")
    field = _CONTENTS_FIELD.get(datatype)
    if raw is None and field is None:
        raise InvalidArgument(f"input '{name}': datatype {datatype} must be sent in raw_input_contents")
    if raw is not None:
        return for_input(name, array_from_buffer, datatype, shape, raw)
    return for_input(name, array_from_values, datatype, shape, list(getattr(tensor.contents, field)))


def decode_infer_request(message: service_pb2.ModelInferRequest) -> InferRequest:
    """A ModelInferRequest as a core InferRequest; InvalidArgument on any inconsistency."""
    raw_contents = message.raw_input_contents
    if raw_contents and len(raw_contents) != len(message.inputs):
        raise InvalidArgument(
            f"raw_input_contents holds {len(raw_contents)} entries for {len(message.inputs)} inputs: "
            "when used it must hold one per input"
        )
    parameters = parameters_to_dict(message.parameters)
    _check_parameters(parameters, "request")
    inputs = []
    for index, tensor in enumerate(message.inputs):
        if not tensor.name:
            raise InvalidArgument("each input must have a name")
        input_parameters = parameters_to_dict(tensor.parameters)
        _check_parameters(input_parameters, f"input '{tensor.name}'")
        if raw_contents and tensor.HasField("contents"):
            raise InvalidArgument(f"input '{tensor.name}' has both contents and raw_input_contents")
        data = _input_array(tensor, raw_contents[index] if raw_contents else None)
        inputs.append(InferTensor(tensor.name, tensor.datatype, tuple(tensor.shape), data, input_parameters))
    outputs = []
    for output in message.outputs:
        output_parameters = parameters_to_dict(output.parameters)
        _check_parameters(output_parameters, f"output '{output.name}'")
        outputs.append(RequestedOutput(output.name, output_parameters))
    return InferRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        id=message.id,
        inputs=inputs,
        outputs=outputs,
        parameters=parameters,
    )


def encode_infer_response(response: InferResponse) -> service_pb2.ModelInferResponse:
    """Outputs travel in raw_output_contents, as Triton sends them."""
    message = service_pb2.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for key, value in response.parameters.items():
        _set_parameter(message.parameters, key, value)
    for tensor in response.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        message.raw_output_contents.append(array_to_buffer(tensor.data, tensor.datatype))
    return message


def from_dict(data: dict, message_type):
    """Build a protobuf message from the core's JSON-shaped dict (same field names)."""
    return json_format.ParseDict(data, message_type(), ignore_unknown_fields=True)
