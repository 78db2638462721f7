"""Tensor data in JSON bodies, to and from numpy without a Python object per element.

Numeric ``data`` arrays are parsed straight from the request's bytes into a preallocated numpy array (in slices of
about 1 MiB), and output arrays written from theirs in one call, by ``json_numbers.h`` (through the module
``json_numbers.cc`` builds, the GIL released): memory stays near the size of the JSON text plus the tensor, and
health probes keep answering during a 64 MiB decode. Everything else is msgspec's, the one JSON library: anything
unusual in an array (strings, booleans, empty nested lists, out-of-range numbers) takes the generic path, which
gives the precise error. Where the native part was not built, msgspec reads and writes the arrays too (the same
values and text, 1.1-3.4x slower on large tensors: scripts/bench_json_numbers.py).
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Any, Literal

import msgspec
import numpy as np

from runtime.datatypes import MAX_JSON_NESTING_DEPTH, array_from_values, element_count, numpy_dtype
from runtime.errors import InvalidArgument

try:
    json_numbers: Any = importlib.import_module("runtime.http._json_numbers")
except ImportError:  # not built (setup.py): msgspec reads and writes the arrays
    json_numbers = None

_SLICE_BYTES = 1 << 20
_NATIVE_MIN = 64  # elements: a shorter array is written by msgspec (scripts/bench_json_numbers.py)
_CUT_OUT_BYTES = 1 << 16  # flat numeric arrays at least this long are cut out of the header before it is parsed
_DATA_KEY = re.compile(rb'"data"\s*:\s*\[')
_FLAT_NUMBER_BYTES = b"0123456789 \t\n\r\x0b\x0c,.eE+-"  # all a flat array of numbers may hold between its brackets
# how the fast path reads each datatype's numbers: as int64, uint64 or double, then cast (in range) to the datatype
_BUFFER_TYPE: dict[str, Literal["d", "i", "u"]] = {
    "INT8": "i", "INT16": "i", "INT32": "i", "INT64": "i",
    "UINT8": "u", "UINT16": "u", "UINT32": "u", "UINT64": "u",
    "FP16": "d", "FP32": "d", "FP64": "d",
}
_PARSED_AS = {"d": np.dtype(np.float64), "i": np.dtype(np.int64), "u": np.dtype(np.uint64)}
_decoders = {kind: msgspec.json.Decoder(list[float] if kind == "d" else list[int]) for kind in _PARSED_AS}
_encoder = msgspec.json.Encoder()


class NotFast(Exception):
    """The fast path does not apply: decode generically."""


def _parse_piece(piece: memoryview, kind: Literal["d", "i", "u"], room: int) -> np.ndarray:
    """The numbers of one slice of an array's inside, as ``kind``'s numpy type; NotFast for anything else."""
    if json_numbers is not None:
        values = np.empty(min(room, len(piece) // 2 + 1), _PARSED_AS[kind])  # n numbers take at least 2n - 1 bytes
        count = json_numbers.parse(piece, values)
        if count < 0:
            raise NotFast
        return values[:count]
    try:
        parsed = _decoders[kind].decode(b"[" + piece + b"]")
    except msgspec.MsgspecError:
        raise NotFast from None
    try:
        return np.array(parsed, _PARSED_AS[kind])
    except OverflowError:
        raise NotFast from None


def _number_slices(data: bytes, start: int, end: int):
    """``data[start:end]`` holds comma-separated numbers: yield it in slices of about 1 MiB that end at commas."""
    view = memoryview(data)
    while start < end:
        stop = min(end, start + _SLICE_BYTES)
        if stop < end:
            comma = data.find(b",", stop, end)
            stop = end if comma < 0 else comma
        yield view[start:stop]
        start = stop + 1


def parse_numbers(data: bytes, start: int, end: int, datatype: str, count: int) -> np.ndarray:
    """Fill an array of ``count`` elements from the JSON array of numbers ``data[start:end]`` (nested lists
    flatten row-major).  Raises NotFast for anything that is not plainly numbers in range.
    """
    if data[start : start + 1] != b"[" or data[end - 1 : end] != b"]":
        raise NotFast
    if data.find(b"[", start + 1, end) >= 0:  # nesting only groups: the commas still separate (memchr, not count)
        if _too_deep(data, start, end):
            raise NotFast  # the generic path refuses it in Triton's words
        data = b"[" + data[start:end].translate(None, b"[]") + b"]"
        start, end = 0, len(data)
    if count > (end - start - 1) // 2:  # n numbers take at least 2n + 1 bytes: never allocate what the shape claims
        raise NotFast
    dtype = numpy_dtype(datatype)
    out = np.empty(count, dtype=dtype)
    kind = _BUFFER_TYPE[datatype]
    limits = np.iinfo(dtype) if dtype.kind in "iu" else None
    filled = 0
    for piece in _number_slices(data, start + 1, end - 1):
        values = _parse_piece(piece, kind, count - filled + 1)  # one more than room: too many is seen
        if filled + len(values) > count:
            raise NotFast
        if limits is not None and len(values) and (values.min() < limits.min or values.max() > limits.max):
            raise NotFast
        out[filled : filled + len(values)] = values
        filled += len(values)
    if filled != count:
        raise NotFast
    return out


def _too_deep(data: bytes, start: int, end: int) -> bool:
    """Whether the arrays of numbers in ``data[start:end]`` nest deeper than Triton allows: only counted (once,
    vectorized) where there are more brackets than that depth."""
    if data.count(b"[", start, end) <= MAX_JSON_NESTING_DEPTH:
        return False
    window = np.frombuffer(data, np.uint8, end - start, start)
    depth = np.cumsum((window == ord("[")).astype(np.int32) - (window == ord("]")))
    return int(depth.max()) > MAX_JSON_NESTING_DEPTH


def _flat_array_end(data: bytes, start: int) -> int:
    """Where the flat numeric array opening at ``data[start]`` ends (after its ``]``), or -1 if it is not one.

    The first ``]`` is found with memchr, then what lies before it is checked in windows by deleting every byte a
    number list may hold (``bytes.translate``: 5x a regex's speed), so no single call holds the GIL for long."""
    closing = data.find(b"]", start + 1)
    if closing < 0:
        return -1
    for position in range(start + 1, closing, _SLICE_BYTES):
        if data[position : min(closing, position + _SLICE_BYTES)].translate(None, _FLAT_NUMBER_BYTES):
            return -1
    return closing + 1


def cut_out_arrays(header: bytes) -> tuple[bytes, dict[bytes, tuple[int, int]]]:
    """The JSON header with each large flat numeric ``data`` array replaced by a unique marker string,
    and where each array lies in ``header``: the rest then parses in a few milliseconds."""
    nonce = os.urandom(8).hex().encode()
    pieces: list[bytes] = []
    spans: dict[bytes, tuple[int, int]] = {}
    copied = 0
    for match in _DATA_KEY.finditer(header):
        if match.start() < copied:
            continue  # inside an array already cut out
        opening = match.end() - 1
        closing = _flat_array_end(header, opening)
        if closing < 0 or closing - opening < _CUT_OUT_BYTES:
            continue
        marker = b'"\\u0000' + nonce + b"." + str(len(spans)).encode() + b'"'
        pieces += [header[copied:opening], marker]
        spans[marker] = (opening, closing)
        copied = closing
    if not spans:
        return header, {}
    pieces.append(header[copied:])
    return b"".join(pieces), spans


def array_from_json(datatype: str, shape: tuple[int, ...], data: bytes, start: int = 0,
                    end: int | None = None) -> np.ndarray:
    """The tensor the JSON ``data`` value ``data[start:end]`` describes (flat or nested, row-major)."""
    count = element_count(shape)
    end = len(data) if end is None else end
    if datatype in _BUFFER_TYPE:
        try:
            return parse_numbers(data, start, end, datatype, count).reshape(shape)
        except NotFast:
            pass  # the generic path decides, with the precise error
    try:
        values = msgspec.json.decode(memoryview(data)[start:end])
    except msgspec.DecodeError as exc:
        raise InvalidArgument(f"tensor data is not valid JSON: {exc}") from None
    return array_from_values(datatype, shape, values)


def _numbers_json(array: np.ndarray) -> bytes:
    """``[v, v, ...]`` for a numeric or boolean array (floats as their doubles, as msgspec writes them): natively
    past ``_NATIVE_MIN`` elements (the GIL released meanwhile), else by msgspec, which writes a few values sooner."""
    flat = array.reshape(-1)  # a float prints as its exact double, as Triton and json do
    if json_numbers is None or len(flat) < _NATIVE_MIN:
        return _encoder.encode(flat.tolist())  # numpy's floats become Python's: their exact doubles
    if flat.dtype == np.float16:
        flat = flat.astype(np.float64)  # the writer takes float32 and float64 (no copy of those)
    return json_numbers.format(np.ascontiguousarray(flat))


def json_fragment(array: np.ndarray, datatype: str) -> msgspec.Raw:
    """An output tensor's flat ``data`` as pre-encoded JSON, ready to embed in a message."""
    if datatype == "BYTES":
        values = [item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)
                  for item in array.reshape(-1)]
        return msgspec.Raw(_encoder.encode(values))
    return msgspec.Raw(_numbers_json(array))


def dumps(message: object) -> bytes:
    """Compact JSON of a message that may embed fragments."""
    return _encoder.encode(message)
