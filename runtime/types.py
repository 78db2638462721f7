"""Protocol-neutral request and response types of the inference core."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class InferTensor:
    """A named tensor; BYTES data is a numpy object array of ``bytes``.

    A request's input may instead arrive as ``raw`` little-endian bytes (binary tensors, gRPC
    raw contents): validation checks their size against shape and datatype, then sets ``data``.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | None
    parameters: dict[str, Any] = field(default_factory=dict)
    raw: bytes | memoryview | None = None


@dataclass
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferRequest:
    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: list[InferTensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)  # empty: all outputs
    parameters: dict[str, Any] = field(default_factory=dict)
    raw_input: bool = False  # a raw binary request: one nameless input whose shape the model's config gives

    def input_arrays(self) -> dict[str, np.ndarray]:
        return {tensor.name: tensor.data for tensor in self.inputs}


@dataclass
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: list[InferTensor]
    parameters: dict[str, Any] = field(default_factory=dict)
