"""Inference requests and responses (streamed ones too) as plain tuples for the front-end link.

Pickling the dataclasses and numpy arrays themselves costs about 15 µs a message; tuples of strings, bytes and
shapes cost about 1. Tensor bytes of at least ``OUT_OF_BAND_BYTES`` go as buffers beside the pickle (no copy
into it); smaller ones are copied in.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.errors import ServingError
from runtime.frontends.wire import OUT_OF_BAND_BYTES
from runtime.types import InferRequest, InferResponse, InferTensor, RequestedOutput, StreamResponse


def _bytes(buffer: bytes | memoryview | None) -> Any:
    if buffer is None or (type(buffer) is bytes and len(buffer) < OUT_OF_BAND_BYTES):
        return buffer
    view = memoryview(buffer)
    return view.tobytes() if view.nbytes < OUT_OF_BAND_BYTES else pickle.PickleBuffer(view)


def _pack_array(array: np.ndarray | None) -> Any:
    if array is None or array.dtype.hasobject:
        return array  # BYTES tensors: numpy's own pickling
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.nbytes < OUT_OF_BAND_BYTES:
        return array.tobytes(), array.dtype.str, array.shape
    return pickle.PickleBuffer(array.reshape(-1).view(np.uint8).data), array.dtype.str, array.shape


def _unpack_array(packed: Any) -> np.ndarray | None:
    if packed is None or isinstance(packed, np.ndarray):
        return packed
    data, dtype, shape = packed
    return np.frombuffer(data, dtype).reshape(shape)


def _pack_tensor(t: InferTensor) -> tuple:
    return t.name, t.datatype, t.shape, _pack_array(t.data), t.parameters, _bytes(t.raw), t.in_shared_memory


def _unpack_tensor(packed: tuple) -> InferTensor:
    name, datatype, shape, data, parameters, raw, in_shared_memory = packed
    return InferTensor(name, datatype, shape, _unpack_array(data), parameters, raw, in_shared_memory)


def pack_request(r: InferRequest) -> tuple:
    """A decoded request (not yet validated: ``raw`` tensor contents travel as they are)."""
    return (r.model_name, r.model_version, r.id, [_pack_tensor(t) for t in r.inputs],
            [(o.name, o.parameters) for o in r.outputs], r.parameters, r.raw_input, r.correlation_id, r.flags,
            r.trace_context)


def unpack_request(packed: tuple) -> InferRequest:
    name, version, request_id, inputs, outputs, parameters, raw_input, correlation_id, flags, context = packed
    return InferRequest(name, version, request_id, [_unpack_tensor(t) for t in inputs],
                        [RequestedOutput(n, p) for n, p in outputs], parameters, raw_input,
                        correlation_id=correlation_id, flags=flags, trace_context=context)


def pack_response(r: InferResponse) -> tuple:
    return r.model_name, r.model_version, r.id, [_pack_tensor(t) for t in r.outputs], r.parameters


def unpack_response(packed: tuple) -> InferResponse:
    name, version, response_id, outputs, parameters = packed
    return InferResponse(name, version, response_id, [_unpack_tensor(t) for t in outputs], parameters)


def pack_stream_response(item: StreamResponse, as_error: Callable[[BaseException], ServingError]) -> tuple:
    """One response of a stream; its error (if any) made a :class:`ServingError` by ``as_error``."""
    response = pack_response(item.response) if item.response is not None else None
    return response, as_error(item.error) if item.error is not None else None, item.final


def unpack_stream_response(packed: tuple) -> StreamResponse:
    response, error, final = packed
    return StreamResponse(unpack_response(response) if response is not None else None, error, final)
