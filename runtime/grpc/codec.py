"""Conversion between GRPCInferenceService messages and the core's request/response types."""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import json_format

from runtime.datatypes import array_to_buffer, numpy_dtype
from runtime.errors import InvalidArgument
from runtime.extensions.classification import PARAMETER as CLASSIFICATION
from runtime.extensions.shared_memory import REGION_PARAMETER, require_no_regions
from runtime.protocol import service_pb2
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


def parameters_to_dict(parameters) -> dict[str, Any]:
    """A map<string, InferParameter> as plain Python values."""
    if not parameters:
        return {}
    result: dict[str, Any] = {}
    for key, parameter in parameters.items():
        which = parameter.WhichOneof("parameter_choice")
        result[key] = getattr(parameter, which) if which else None
    return result


def _check_classification(parameters) -> None:
    """gRPC asks for classification with a positive int64 (tritonclient's ``class_count``), as Triton reads it."""
    if CLASSIFICATION not in parameters:
        return
    parameter = parameters[CLASSIFICATION]
    if parameter.WhichOneof("parameter_choice") != "int64_param":
        raise InvalidArgument(f"invalid value type for '{CLASSIFICATION}' parameter, expected int64_param")
    if parameter.int64_param < 1:
        raise InvalidArgument(f"invalid value for '{CLASSIFICATION}' parameter, expected >= 0")  # Triton's words


def _set_parameter(target, key: str, value: Any) -> None:
    if isinstance(value, bool):
        target[key].bool_param = value
    elif isinstance(value, int):
        target[key].int64_param = value
    elif isinstance(value, float):
        target[key].double_param = value
    else:
        target[key].string_param = str(value)


# Each typed field with the datatype Triton names for it, in the message's field order (the order it checks them).
_DATATYPE_OF_CONTENTS = (("bool_contents", "BOOL"), ("int_contents", "INT32"), ("int64_contents", "INT64"),
                         ("uint_contents", "UINT32"), ("uint64_contents", "UINT64"), ("fp32_contents", "FP32"),
                         ("fp64_contents", "FP64"), ("bytes_contents", "BYTES"))


def _typed_array(tensor, model: str) -> np.ndarray | None:
    """The values of an input's typed ``contents`` (any count: validation checks it), None if it has none; values
    in another datatype's field are refused, as Triton refuses them."""
    if not tensor.HasField("contents"):
        return None
    field = _CONTENTS_FIELD.get(tensor.datatype)
    for other, datatype in _DATATYPE_OF_CONTENTS:
        if other != field and len(getattr(tensor.contents, other)):
            raise InvalidArgument(f"unexpected explicit tensor data for input tensor '{tensor.name}' for model "
                                  f"'{model}' of type '{datatype}', expected datatype '{tensor.datatype}'")
    if field is None:
        return None
    values = getattr(tensor.contents, field)
    if tensor.datatype == "BYTES":
        array = np.empty(len(values), dtype=np.object_)
        array[:] = list(values)
        return array
    try:
        return np.asarray(values, dtype=numpy_dtype(tensor.datatype))
    except (OverflowError, ValueError) as exc:
        raise InvalidArgument(f"input '{tensor.name}': contents do not fit datatype {tensor.datatype}: {exc}") from None


def decode_infer_request(message: service_pb2.ModelInferRequest | SplitInferRequest) -> InferRequest:
    """A ModelInferRequest (or the edge's SplitInferRequest) as a core InferRequest; InvalidArgument on any
    inconsistency."""
    raw_contents = message.raw_input_contents
    if type(message) is SplitInferRequest:  # the message's own fields, without a Python __getattr__ for each
        message = message.message
    model = message.model_name
    parameters = parameters_to_dict(message.parameters)
    if parameters:
        require_no_regions(parameters)
    inputs = []
    index = 0  # the next raw content: inputs read from shared memory have none
    for tensor in message.inputs:
        input_parameters = parameters_to_dict(tensor.parameters)
        shape = tuple(tensor.shape)
        if REGION_PARAMETER in input_parameters:  # read from the region where the core resolves it
            if tensor.HasField("contents"):
                raise InvalidArgument(f"contents field must not be specified when using shared memory for "
                                      f"'{tensor.name}' for model '{model}'")
            inputs.append(InferTensor(tensor.name, tensor.datatype, shape, None, input_parameters))
            continue
        if raw_contents:
            if tensor.HasField("contents"):
                raise InvalidArgument(f"contents field must not be specified when using raw_input_contents for "
                                      f"'{tensor.name}' for model '{model}'")
            if index >= len(raw_contents):
                raise InvalidArgument(f"unable to find data for input tensor '{tensor.name}' for model '{model}' "
                                      "in request.")
            inputs.append(InferTensor(tensor.name, tensor.datatype, shape, None, input_parameters,
                                      raw=raw_contents[index]))
            index += 1
            continue
        data = _typed_array(tensor, model)
        if data is None and not (shape and 0 in shape):
            raise InvalidArgument(f"unable to find data for input tensor '{tensor.name}' for model '{model}' in "
                                  "request.")
        inputs.append(InferTensor(tensor.name, tensor.datatype, shape, data, input_parameters))
    if len(raw_contents) > index:
        raise InvalidArgument(f"unexpected additional input data for model '{model}'")
    outputs = []
    for output in message.outputs:
        _check_classification(output.parameters)
        output_parameters = parameters_to_dict(output.parameters)
        outputs.append(RequestedOutput(output.name, output_parameters))
    return InferRequest(
        model_name=model,
        model_version=message.model_version,
        id=message.id,
        inputs=inputs,
        outputs=outputs,
        parameters=parameters,
    )


PLAIN_FORM_FIELDS = 6


def plain_infer_request(form: tuple) -> InferRequest:
    """The request of a ModelInferRequest the native edge read in its plain form (``native_wire.h``): (model name,
    version, id, [(input name, datatype, shape)], [output name], [raw contents, one for each input]); no parameters,
    no typed contents.  As :func:`decode_infer_request` decodes the same message."""
    model, version, request_id, inputs, outputs, raws = form
    return InferRequest(
        model_name=model,
        model_version=version,
        id=request_id,
        inputs=[InferTensor(name, datatype, shape, None, {}, raw=raw)
                for (name, datatype, shape), raw in zip(inputs, raws, strict=True)],
        outputs=[RequestedOutput(name, {}) for name in outputs],
        parameters={},
    )


RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents


class SplitInferRequest:
    """A ModelInferRequest received with its ``raw_input_contents`` cut out by the native edge: the rest parsed by
    protobuf, each raw content a view of the received bytes (protobuf would copy each tensor twice: once parsing,
    once reading the field). Reads as the message does."""

    __slots__ = ("message", "raw_input_contents")

    def __init__(self, message: service_pb2.ModelInferRequest, raw_input_contents: list[memoryview]) -> None:
        self.message = message
        self.raw_input_contents = raw_input_contents

    def __getattr__(self, name: str) -> Any:
        return getattr(self.message, name)

    def ByteSize(self) -> int:  # noqa: N802 - the protobuf method's name
        return self.message.ByteSize() + sum(len(raw) + 6 for raw in self.raw_input_contents)


_RAW_OUTPUT_TAG = bytes([6 << 3 | 2])  # ModelInferResponse.raw_output_contents: field 6, length-delimited


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class RawResponse:
    """A ModelInferResponse whose raw output contents are written straight from the output arrays when it
    is serialized (one copy, where building the message would copy each tensor twice more).  Made from the core's
    answer (:func:`encode_infer_response`), its protobuf message is built only when a sender asks for it: the
    native edge writes the message from :meth:`wire_form` instead."""

    __slots__ = ("_message", "raws", "_answer")

    def __init__(self, message: service_pb2.ModelInferResponse | None, raws: list[bytes | memoryview],
                 answer: InferResponse | None = None) -> None:
        self._message = message  # None: built from ``answer`` when first asked for
        self.raws = raws
        self._answer = answer

    @property
    def message(self) -> service_pb2.ModelInferResponse:
        """The message without its raw output contents."""
        if self._message is None:
            assert self._answer is not None  # one of the two is given
            self._message = _response_message(self._answer)
        return self._message

    def wire_form(self) -> tuple | None:
        """(model name, version, id, [(output name, datatype, shape, raw contents)]): what the native edge writes
        the message from without protobuf; None where only protobuf writes it (response parameters)."""
        answer = self._answer
        if answer is None or answer.parameters:
            return None
        return (answer.model_name, answer.model_version, answer.id,
                [(tensor.name, tensor.datatype, tensor.shape, raw)
                 for tensor, raw in zip(answer.outputs, self.raws, strict=True)])

    def SerializeToString(self) -> bytes:  # noqa: N802 - the protobuf method name grpc calls
        return b"".join(self.serialized_parts())

    def serialized_parts(self) -> list[bytes | memoryview]:
        """The serialized message in pieces, each tensor read in place (for a sender that copies them once)."""
        parts: list[bytes | memoryview] = [self.message.SerializeToString()]
        for raw in self.raws:
            parts += (_RAW_OUTPUT_TAG, _varint(len(raw)), raw)
        return parts

    def to_message(self) -> service_pb2.ModelInferResponse:
        """The whole message (to nest in another one)."""
        message = service_pb2.ModelInferResponse()
        message.CopyFrom(self.message)
        message.raw_output_contents.extend(bytes(raw) for raw in self.raws)
        return message


def _response_message(response: InferResponse) -> service_pb2.ModelInferResponse:
    """A response's message without its raw output contents."""
    message = service_pb2.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for key, value in response.parameters.items():
        _set_parameter(message.parameters, key, value)
    for tensor in response.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
    return message


def encode_infer_response(response: InferResponse) -> RawResponse:
    """Outputs travel in raw_output_contents, as Triton sends them."""
    return RawResponse(None, [b"" if tensor.in_shared_memory else array_to_buffer(tensor.values(), tensor.datatype)
                              for tensor in response.outputs], response)


def from_dict(data: dict, message_type):
    """Build a protobuf message from the core's JSON-shaped dict (same field names)."""
    return json_format.ParseDict(data, message_type(), ignore_unknown_fields=True)
