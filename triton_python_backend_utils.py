"""Triton Python backend utilities (``import triton_python_backend_utils as pb_utils``).

The API a ``model.py`` written for Triton's Python backend uses, so such a
model runs here unmodified.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from typing import Any

import numpy as np

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType values, as numpy_to_triton_type / triton_to_numpy_type use them.
_TRITON_TYPE_BY_NUMPY: dict[Any, int] = {
    np.bool_: 1,
    np.uint8: 2,
    np.uint16: 3,
    np.uint32: 4,
    np.uint64: 5,
    np.int8: 6,
    np.int16: 7,
    np.int32: 8,
    np.int64: 9,
    np.float16: 10,
    np.float32: 11,
    np.float64: 12,
    np.object_: 13,
    np.bytes_: 13,
}
_NUMPY_BY_TRITON_TYPE = {value: key for key, value in _TRITON_TYPE_BY_NUMPY.items() if key is not np.bytes_}


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``np.float32``."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def numpy_to_triton_type(data_type: Any) -> int | None:
    """numpy type -> TRITONSERVER_DataType value (None if it has none)."""
    return _TRITON_TYPE_BY_NUMPY.get(np.dtype(data_type).type)


def triton_to_numpy_type(data_type: int) -> Any:
    """TRITONSERVER_DataType value -> numpy type."""
    return _NUMPY_BY_TRITON_TYPE.get(data_type)


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray:
    """Length-prefixed serialization of a BYTES tensor, as a uint8 array."""
    parts = []
    for item in input_tensor.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)) + data)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Inverse of :func:`serialize_byte_tensor`."""
    items = []
    offset = 0
    while offset < len(encoded_tensor):
        (length,) = struct.unpack_from("<I", encoded_tensor, offset)
        offset += 4
        items.append(bytes(encoded_tensor[offset : offset + length]))
        offset += length
    return np.array(items, dtype=np.object_)


class TritonError:
    """An error to put in an InferenceResponse (or raise via TritonModelException)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by a model (or by these utilities) to fail the current request(s)."""


class Tensor:
    """A named tensor backed by a numpy array."""

    def __init__(self, name: str, data: np.ndarray, dtype: Any = None) -> None:
        if not isinstance(data, np.ndarray):
            raise TritonModelException(f"Tensor '{name}' data must be a numpy array")
        if data.dtype.kind in ("U", "S"):
            data = np.array([x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in data.reshape(-1)],
                            dtype=np.object_).reshape(data.shape)
        self._name = name
        self._data = data

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._data

    def shape(self) -> list[int]:
        return list(self._data.shape)

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self._data.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._data.dtype == np.object_:
            raise TritonModelException("BYTES tensors cannot be exported through DLPack")
        return self._data.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """Build a Tensor from a DLPack capsule or any object with ``__dlpack__`` (e.g. a torch tensor)."""
        if hasattr(capsule, "__dlpack__"):
            return Tensor(name, np.from_dlpack(capsule))

        class _Capsule:
            def __init__(self, raw: Any) -> None:
                self._raw = raw

            def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
                return self._raw

            def __dlpack_device__(self) -> tuple[int, int]:
                return (1, 0)  # kDLCPU

        return Tensor(name, np.from_dlpack(_Capsule(capsule)))

    def __repr__(self) -> str:
        return f"Tensor(name={self._name!r}, shape={self.shape()}, dtype={self._data.dtype})"


class InferenceRequest:
    """One request as ``execute`` receives it."""

    def __init__(
        self,
        inputs: Iterable[Tensor] = (),
        request_id: str = "",
        requested_output_names: Iterable[str] = (),
        parameters: dict[str, Any] | str | None = None,
        model_name: str = "",
        model_version: int = -1,
        correlation_id: int | str = 0,
        flags: int = 0,
    ) -> None:
        self._inputs = list(inputs)
        self._request_id = request_id
        self._requested_output_names = list(requested_output_names)
        if isinstance(parameters, str):
            self._parameters = parameters
        else:
            self._parameters = json.dumps(parameters or {})
        self._model_name = model_name
        self._model_version = model_version
        self._correlation_id = correlation_id
        self._flags = flags

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def get_input_tensor_by_name(self, name: str) -> Tensor | None:
        return get_input_tensor_by_name(self, name)

    def request_id(self) -> str:
        return self._request_id

    def requested_output_names(self) -> list[str]:
        return list(self._requested_output_names)

    def parameters(self) -> str:
        return self._parameters

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def is_cancelled(self) -> bool:
        return False


class InferenceResponse:
    """The response to one request: output tensors, or an error."""

    def __init__(self, output_tensors: Iterable[Tensor] = (), error: TritonError | None = None) -> None:
        self._output_tensors = list(output_tensors)
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return list(self._output_tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    for properties in model_config.get("input", []):
        if properties["name"] == name:
            return properties
    return None


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    for properties in model_config.get("output", []):
        if properties["name"] == name:
            return properties
    return None


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
