"""Triton Python backend utilities (``import triton_python_backend_utils as pb_utils``).

The API a ``model.py`` written for Triton's Python backend uses, so such a model runs here
unmodified: tensors (with DLPack), requests and responses, response senders for decoupled
models, BLS (``InferenceRequest.exec`` / ``async_exec``), the model loading API, the logger,
custom metrics and ``auto_complete_config``'s ModelConfig.  Calls that leave the model (BLS,
responses, logs, metrics) go to the *host* the model runs under (see ``handlers/python``).
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import numpy as np

from handlers.python import model_host

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

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 1  # Triton's MemoryType values
TRITONSERVER_MEMORY_GPU = 0
_DLPACK_CPU, _DLPACK_CUDA = 1, 2


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


# -- the host a model runs under ------------------------------------------------------------------
class Host(Protocol):
    """What pb_utils needs from the process hosting the model (a worker, or the server itself)."""

    def infer(self, request: InferenceRequest, decoupled: bool) -> Any: ...
    def send(self, key: Any, response: InferenceResponse | None, flags: int) -> None: ...
    def is_cancelled(self, key: Any) -> bool: ...
    def reschedule(self, key: Any) -> None: ...
    def log(self, level: str, message: str) -> None: ...
    def metric(self, operation: str, *arguments: Any) -> Any: ...
    def control(self, operation: str, *arguments: Any) -> Any: ...


def _host() -> Host:
    host = model_host.current()
    if host is None:
        raise TritonModelException("this call needs a running model: it is not available here")
    return host


def get_model_dir() -> str:
    """The folder of the model version this model runs from (``<repository>/<model>/<version>``), as in Triton."""
    return model_host.model_dir()


# -- errors ---------------------------------------------------------------------------------------------
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
        self._message = _text(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by a model (or by these utilities) to fail the current request(s)."""


def _text(value: Any) -> Any:
    """A string argument as Triton's pybind11 API takes it: bytes (a BYTES tensor's element, say) read as UTF-8."""
    if value.__class__ is str:  # the common case, first: a model's own names are str
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return value


def _text_map(values: dict | None) -> dict | None:
    """A mapping of strings (parameters, metric labels) with bytes keys and values read as text."""
    return None if values is None else {_text(key): _text(value) for key, value in values.items()}


# -- tensors ----------------------------------------------------------------------------------------------
class PreferredMemory:
    """Where BLS outputs should be placed (CPU here unless the output came from a GPU)."""

    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


_TEXT_KINDS = ("U", "S")  # numpy string dtypes: held as BYTES (object arrays of bytes) instead


def _readable(data: Any) -> np.ndarray:
    if data.dtype.kind in _TEXT_KINDS:
        return np.array([x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in data.reshape(-1)],
                        dtype=np.object_).reshape(data.shape)
    return data


class Tensor:
    """A named tensor: a numpy array, or a device (CUDA) tensor that came in through DLPack."""

    def __init__(self, name: str, data: np.ndarray, dtype: Any = None) -> None:
        if not isinstance(data, np.ndarray):
            raise TritonModelException(f"Tensor '{_text(name)}' data must be a numpy array")
        self._name = name if name.__class__ is str else _text(name)
        self._data: np.ndarray | None = _readable(data) if data.dtype.kind in _TEXT_KINDS else data
        self._device_tensor: Any = None

    @classmethod
    def _received(cls, name: str, data: np.ndarray) -> Tensor:
        """An input as the server hands it to ``execute``: a str name and a numeric or BYTES (object) array, taken
        as it is (``__init__``'s conversions cost more than a tiny request's model does); anything else through
        ``__init__``."""
        if data.__class__ is not np.ndarray or data.dtype.kind in _TEXT_KINDS:
            return cls(name, data)
        tensor = cls.__new__(cls)
        tensor._name, tensor._data, tensor._device_tensor = name, data, None
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._data is None:  # a GPU tensor: numpy sees it once it is copied to host memory
            self._data = self._device_tensor.detach().cpu().numpy()
        return self._data

    def shape(self) -> list[int]:
        if self._data is None:
            return list(self._device_tensor.shape)
        return list(self._data.shape)

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self.as_numpy().dtype)

    def is_cpu(self) -> bool:
        return self._device_tensor is None

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        if self._device_tensor is not None:
            return self._device_tensor.__dlpack__(stream=stream) if stream is not None \
                else self._device_tensor.__dlpack__()
        data = self._data
        assert data is not None  # no device tensor: the data is on the host
        if data.dtype == np.object_:
            raise TritonModelException("BYTES tensors cannot be exported through DLPack")
        if not data.flags.writeable:  # DLPack cannot mark memory read-only: export a private copy
            data = self._data = data.copy()
        return data.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._device_tensor is not None:
            return self._device_tensor.__dlpack_device__()
        return (_DLPACK_CPU, 0)

    def to_dlpack(self) -> Any:
        return self.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A Tensor from a DLPack capsule or any object with ``__dlpack__`` (a torch tensor, on CPU or GPU)."""
        device = capsule.__dlpack_device__()[0] if hasattr(capsule, "__dlpack_device__") else None
        if device == _DLPACK_CUDA or (device is None and not hasattr(capsule, "__dlpack__")):
            tensor = _torch_from_dlpack(capsule)
            if tensor is not None and tensor.device.type != "cpu":
                result = Tensor.__new__(Tensor)
                result._name, result._data, result._device_tensor = _text(name), None, tensor.contiguous()
                return result
            if tensor is not None:
                return Tensor(name, tensor.numpy())
        if hasattr(capsule, "__dlpack__"):
            return Tensor(name, np.from_dlpack(capsule))
        return Tensor(name, np.from_dlpack(_Capsule(capsule)))

    def __repr__(self) -> str:
        return f"Tensor(name={self._name!r}, shape={self.shape()})"


class _Capsule:
    """A bare DLPack capsule, dressed for ``np.from_dlpack``."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._raw

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DLPACK_CPU, 0)


def _torch_from_dlpack(capsule: Any) -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch.from_dlpack(capsule) if hasattr(capsule, "__dlpack__") else torch.utils.dlpack.from_dlpack(capsule)


# -- requests and responses ----------------------------------------------------------------------------
def _parameters_text(parameters: dict[str, Any] | str | bytes | None) -> str:
    if isinstance(parameters, (str, bytes, bytearray)):
        return _text(parameters)
    if not parameters:
        return "{}"
    parameters = _text_map(parameters) or {}
    for key, value in parameters.items():
        if not isinstance(key, str) or not isinstance(value, (bool, int, str)):
            raise TritonModelException("request parameters must map strings to bool, int or str values")
    return json.dumps(parameters or {})


class InferenceResponse:
    """The response to one request: output tensors, or an error (and optional parameters)."""

    def __init__(self, output_tensors: Iterable[Tensor] = (), error: TritonError | None = None,
                 parameters: dict[str, Any] | str | None = None) -> None:
        self._output_tensors = list(output_tensors)
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._error = error
        self._parameters = _parameters_text(parameters)

    def output_tensors(self) -> list[Tensor]:
        return list(self._output_tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class InferenceResponseSender:
    """Sends the responses of one request of a decoupled model (from ``execute`` or any thread)."""

    def __init__(self, key: Any, host: Host | None = None) -> None:
        self._key = key
        self._host = host or _host()
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        with self._lock:
            if self._closed:
                raise TritonModelException("Unable to send response: the final response was already sent "
                                           "(TRITONSERVER_RESPONSE_COMPLETE_FINAL)")
            if response is None and not flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                raise TritonModelException("Inference Response object must be provided when the response flags "
                                           "is not equal to TRITONSERVER_RESPONSE_COMPLETE_FINAL")
            if response is not None and not isinstance(response, InferenceResponse):
                raise TritonModelException(f"send() takes an InferenceResponse, not a {type(response).__name__}")
            if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._closed = True
        self._host.send(self._key, response, flags)

    def is_cancelled(self) -> bool:
        return self._host.is_cancelled(self._key)


class InferenceRequest:
    """A request as ``execute`` receives it, or one a model builds to call another model (BLS)."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Iterable[Tensor] = (),
        requested_output_names: Iterable[str] = (),
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._inputs = list(inputs)
        self._request_id = _text(request_id)
        self._requested_output_names = [_text(name) for name in requested_output_names]
        self._parameters = _parameters_text(parameters)
        self._model_name = _text(model_name)
        self._model_version = model_version
        self._correlation_id = _text(correlation_id)
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory or PreferredMemory()
        self._trace = trace
        self._key: Any = None  # set for requests the server hands to execute
        self._host: Host | None = None
        self._sender: InferenceResponseSender | None = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _received(cls, key: Any, host: Host, inputs: list[tuple[str, np.ndarray]], request_id: str,
                  outputs: list[str], parameters: str, model_name: str, model_version: int,
                  correlation_id: int | str = 0, flags: int = 0, timeout: int = 0) -> InferenceRequest:
        """A request the server hands to ``execute``: its inputs as (name, array) pairs, its strings already
        text and its parameters already JSON, so nothing of ``__init__``'s conversions is needed."""
        request = cls.__new__(cls)
        received_tensor = Tensor._received
        request._inputs = [received_tensor(name, data) for name, data in inputs]
        request._request_id, request._requested_output_names = request_id, list(outputs)
        request._parameters, request._model_name, request._model_version = parameters, model_name, model_version
        request._correlation_id, request._flags, request._timeout = correlation_id, flags, timeout
        request._preferred_memory, request._trace = PreferredMemory(), None
        request._key, request._host, request._sender = key, host, None
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

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

    def timeout(self) -> int:
        return self._timeout

    def is_cancelled(self) -> bool:
        return self._host is not None and self._host.is_cancelled(self._key)

    def get_response_sender(self) -> InferenceResponseSender:
        if self._key is None:
            raise TritonModelException("only requests given to execute have a response sender")
        if self._sender is None:
            self._sender = InferenceResponseSender(self._key, self._host)
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        self._release_flags = flags
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            (self._host or _host()).reschedule(self._key)

    def exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """Run this request on the model it names and wait (BLS); decoupled: an iterator of responses."""
        return _host().infer(self, decoupled)

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """``exec`` for ``async def execute``: other coroutines run while this waits."""
        import asyncio

        return await asyncio.to_thread(_infer_on, _host(), self, decoupled)  # to_thread keeps the context


class ResponseIterator:
    """The responses of a decoupled BLS call, as they come (``exec(decoupled=True)``); ``cancel()`` asks the model
    called to stop (it sees ``request.is_cancelled()``; the responses it still sends, its final one included, are
    still given here), as python_backend 2.57 does. A cancel after the last response does nothing."""

    def __init__(self, responses: Iterator[InferenceResponse], cancel: Callable[[], None] | None = None) -> None:
        self._responses = responses
        self._cancel = cancel
        self._done = False

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        try:
            return next(self._responses)
        except StopIteration:
            self._done = True
            raise

    def cancel(self) -> None:
        if not self._done and self._cancel is not None:
            self._cancel()


def _infer_on(host: Host, request: InferenceRequest, decoupled: bool) -> Any:
    model_host.set_thread_host(host)
    return host.infer(request, decoupled)


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    name = _text(name)
    for tensor in inference_request._inputs:  # not inputs(): that copies the list
        if tensor._name == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    name = _text(name)
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    name = _text(name)
    for properties in model_config.get("input", []):
        if properties["name"] == name:
            return properties
    return None


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    name = _text(name)
    for properties in model_config.get("output", []):
        if properties["name"] == name:
            return properties
    return None


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


# -- model loading API ---------------------------------------------------------------------------------------
def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model of the repository; explicit model control mode only, as in Triton."""
    _host().control("load", _text(model_name), _text(config), files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _host().control("unload", _text(model_name), unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return bool(_host().control("ready", _text(model_name), str(_text(model_version))))


# -- logging ------------------------------------------------------------------------------------------------------
class Logger:
    """Writes into the server's log, with the model's name."""

    INFO, WARNING, ERROR, VERBOSE = "INFO", "WARNING", "ERROR", "VERBOSE"

    @staticmethod
    def log(message: str, level: str = "INFO") -> None:
        _host().log(_text(level), str(_text(message)))

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, Logger.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, Logger.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, Logger.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, Logger.VERBOSE)


# -- custom metrics -------------------------------------------------------------------------------------------------
class MetricFamily:
    """A family of custom metrics, exported on the server's ``/metrics`` with its labels."""

    COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"

    def __init__(self, name: str, description: str, kind: str) -> None:
        name, description, kind = _text(name), _text(description), _text(kind)
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise TritonModelException("MetricFamily kind must be COUNTER, GAUGE or HISTOGRAM")
        self.name, self.description, self.kind = name, description, kind
        _host().metric("family", name, description, kind)

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        return Metric(self, dict(labels or {}), buckets)


class Metric:
    """One labelled series of a MetricFamily."""

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None = None) -> None:
        if family.kind == MetricFamily.HISTOGRAM and not buckets:
            raise TritonModelException("a histogram metric needs buckets")
        self.family, self.labels = family, _text_map(labels)
        _host().metric("series", family.name, labels, buckets)

    def increment(self, value: float) -> None:
        if self.family.kind != MetricFamily.COUNTER and self.family.kind != MetricFamily.GAUGE:
            raise TritonModelException("increment() is for counters and gauges")
        if self.family.kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("a counter cannot be decreased")
        _host().metric("increment", self.family.name, self.labels, value)

    def set(self, value: float) -> None:
        if self.family.kind != MetricFamily.GAUGE:
            raise TritonModelException("set() is for gauges")
        _host().metric("set", self.family.name, self.labels, value)

    def observe(self, value: float) -> None:
        if self.family.kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("observe() is for histograms")
        _host().metric("observe", self.family.name, self.labels, value)

    def value(self) -> float:
        return _host().metric("value", self.family.name, self.labels)


# -- the module's listing -----------------------------------------------------------------------------------------
# What ``dir(triton_python_backend_utils)`` shows in Triton 2.51 (checked against it): its public API and the three
# modules it imports, none of the helpers and typing names this implementation needs.
_TRITON_LISTING = (
    "InferenceRequest", "InferenceResponse", "Logger", "MetricFamily", "ModelConfig", "PreferredMemory",
    "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_GPU", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START", "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE", "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITON_STRING_TO_NUMPY",
    "Tensor", "TritonError", "TritonModelException", "deserialize_bytes_tensor", "get_input_config_by_name",
    "get_input_tensor_by_name", "get_model_dir", "get_output_config_by_name", "get_output_tensor_by_name",
    "is_model_ready", "json", "load_model", "np", "numpy_to_triton_type", "serialize_byte_tensor", "struct",
    "triton_string_to_numpy", "triton_to_numpy_type", "unload_model", "using_decoupled_model_transaction_policy",
)


def __dir__() -> list[str]:
    return sorted(_TRITON_LISTING)


# -- auto_complete_config -----------------------------------------------------------------------------------------
class ModelConfig:
    """The model configuration as ``auto_complete_config`` sees and extends it."""

    def __init__(self, model_config: dict | str) -> None:
        self._config = json.loads(model_config) if isinstance(model_config, str) else dict(model_config)

    def as_dict(self) -> dict:
        return json.loads(json.dumps(self._config))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._config.get("max_batch_size", 0)
        if current and current != max_batch_size:
            raise TritonModelException(f"configuration specified max_batch_size {current}, but in auto-complete-"
                                       f"config function for model '{self._config.get('name', '')}' tries to set "
                                       f"max_batch_size to {max_batch_size}")
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)

    def add_input(self, input: dict) -> None:  # noqa: A002 - Triton's parameter name
        self._add("input", input)

    def add_output(self, output: dict) -> None:
        self._add("output", output)

    def _add(self, kind: str, tensor: dict) -> None:
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise TritonModelException(f"model {kind} must have '{key}' set")
        entries = self._config.setdefault(kind, [])
        for existing in entries:
            if existing.get("name") == tensor["name"]:
                for key in ("data_type", "dims"):
                    if key in existing and existing[key] != tensor[key]:
                        raise TritonModelException(f"model {kind} '{tensor['name']}' already exists with a different "
                                                   f"{key}")
                existing.update(tensor)
                return
        entries.append(dict(tensor))


model_host.register_requests(InferenceRequest._received, lambda request: request._release_flags)
