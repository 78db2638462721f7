"""A direct batch's answer read as the core takes a model's (``runtime/direct_path.py``'s DirectChannel carries
this reader): the worker's ``results`` message, in the Python backend's own format (``transport.py``, ``worker.py``),
read where that format lives."""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np

from handlers.python.transport import INLINE
from runtime.datatypes import deserialize_bytes, wire_dtype
from runtime.errors import ServingError, Status
from runtime.types import ModelOutputs


def answer_outputs(frame: bytes, inputs: list[bytes]) -> ModelOutputs | ServingError | None:
    """A direct batch's answer (the worker's ``results`` message) as the core takes a model's: its outputs, the
    model's error, or None where the model asked to see the request again.  ``inputs``: the request's inputs as
    the front end sent them (an output may be one of them)."""
    _, _, (encoded,) = pickle.loads(frame)  # noqa: S301 - our own worker's message, on a socket only we hold
    if encoded is None:
        return None
    if encoded[0] != "ok":
        _, message, status = encoded
        return ServingError(message, Status(status))
    arrays: dict[str, Any] = {}
    for name, datatype, shape, segment, index, _, inline in encoded[1]:
        data = memoryview(inline if segment == INLINE else inputs[index])
        if datatype == "BYTES":
            arrays[name] = deserialize_bytes(data, int(np.prod(shape, dtype=np.int64)), name).reshape(shape)
        else:
            arrays[name] = np.frombuffer(data, dtype=wire_dtype(datatype)).reshape(shape)
    parameters = encoded[2]
    return ModelOutputs(arrays, json.loads(parameters) if parameters and parameters != "{}" else None)
