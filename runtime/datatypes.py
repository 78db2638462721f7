"""Tensor datatypes of the V2 protocol and their numpy counterparts.

Also the wire encodings shared by every protocol adapter: raw little-endian
buffers and Triton's length-prefixed BYTES serialization.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from runtime.errors import InvalidArgument

# V2 datatype -> numpy dtype.  BYTES tensors are numpy object arrays of bytes.
_NUMPY_BY_DATATYPE: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
_DATATYPE_BY_NUMPY: dict[np.dtype, str] = {v: k for k, v in _NUMPY_BY_DATATYPE.items()}

DATATYPES: frozenset[str] = frozenset(_NUMPY_BY_DATATYPE)
# The little-endian (wire order) dtype of each fixed-size datatype.
WIRE_DTYPES: dict[str, np.dtype] = {k: v.newbyteorder("<") for k, v in _NUMPY_BY_DATATYPE.items() if k != "BYTES"}

# Largest number of elements we accept in one tensor (guards shape-product overflow).
MAX_ELEMENTS = 1 << 40


def config_type_to_datatype(config_type: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES``."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def datatype_to_config_type(datatype: str) -> str:
    """``FP32`` -> ``TYPE_FP32``; ``BYTES`` -> ``TYPE_STRING``."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a V2 datatype, or InvalidArgument if there is none."""
    try:
        return _NUMPY_BY_DATATYPE[datatype]
    except KeyError:
        raise InvalidArgument(f"unsupported datatype '{datatype}'") from None


def wire_dtype(datatype: str) -> np.dtype:
    """The little-endian numpy dtype of a fixed-size V2 datatype (InvalidArgument if there is none)."""
    try:
        return WIRE_DTYPES[datatype]
    except KeyError:
        raise InvalidArgument(f"unsupported datatype '{datatype}'") from None


def datatype_of(array: np.ndarray) -> str:
    """The V2 datatype of a numpy array (unicode and bytes arrays are BYTES)."""
    if array.dtype.kind in ("U", "S", "O"):
        return "BYTES"
    try:
        return _DATATYPE_BY_NUMPY[array.dtype]
    except KeyError:
        raise InvalidArgument(f"numpy dtype {array.dtype} has no V2 datatype") from None


def element_count(shape: Sequence[int]) -> int:
    """Product of a shape, refusing negative dims and absurd sizes."""
    count = 1
    for dim in shape:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
            raise InvalidArgument(f"shape {list(shape)[:16]} has an invalid dimension {dim!r}")
        if dim > MAX_ELEMENTS:  # even beside a zero: numpy cannot shape it, and no model declares it
            raise InvalidArgument(f"shape {list(shape)[:16]} has a dimension too large ({dim})")
        count *= dim
        if count > MAX_ELEMENTS:
            raise InvalidArgument(f"shape {list(shape)[:16]} has too many elements")
    return count


def for_input(name: str, convert, *args) -> np.ndarray:
    """Run a tensor conversion, naming the input in any error it raises."""
    try:
        return convert(*args)
    except InvalidArgument as exc:
        raise InvalidArgument(f"input '{name}': {exc.message}") from None


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES encoding: each element as a 4-byte little-endian length, then its bytes."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | memoryview, count: int, name: str = "") -> np.ndarray:
    """Decode ``count`` length-prefixed elements, requiring the buffer to hold exactly them."""
    view = memoryview(buffer)
    items: list[bytes] = []
    offset = 0
    for _ in range(count):
        if offset + 4 > len(view):
            raise InvalidArgument(f"incomplete string length for inference input '{name}', expecting 4 bytes but "
                                  f"only {len(view) - offset} bytes available")
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > len(view):
            raise InvalidArgument(f"incomplete string data for inference input '{name}', expecting string of length "
                                  f"{length} but only {len(view) - offset} bytes available")
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != len(view):
        raise InvalidArgument(f"expected {count} strings for inference input '{name}', got {len(view) - offset} "
                              "bytes of extra data")
    result = np.empty(count, dtype=np.object_)
    result[:] = items
    return result


def array_from_buffer(datatype: str, shape: Sequence[int], buffer: bytes | memoryview) -> np.ndarray:
    """Build an array from raw tensor bytes, checking that the size matches the shape."""
    count = element_count(shape)
    dtype = numpy_dtype(datatype)
    if datatype == "BYTES":
        return deserialize_bytes(buffer, count).reshape(shape)
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidArgument(
            f"unexpected byte size {len(buffer)} for tensor of datatype {datatype} and shape "
            f"{list(shape)}: expected {expected}"
        )
    return np.frombuffer(buffer, dtype=wire_dtype(datatype)).reshape(shape)


MAX_JSON_NESTING_DEPTH = 100  # Triton 2.58 (server #8172): a tensor's data nested deeper is refused
JSON_TOO_DEEP = f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_NESTING_DEPTH})"


def _flatten(data: object) -> list:
    """Flatten nested JSON lists iteratively (no recursion on attacker-controlled depth); lists nested more than
    ``MAX_JSON_NESTING_DEPTH`` deep below the outermost are refused in Triton's words."""
    if not isinstance(data, list):
        return [data]
    flat: list = []
    stack: list = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                if len(stack) > MAX_JSON_NESTING_DEPTH:
                    raise InvalidArgument(JSON_TOO_DEEP)
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def array_from_values(datatype: str, shape: Sequence[int], data: object) -> np.ndarray:
    """Build an array from JSON values (flat or nested, row-major)."""
    count = element_count(shape)
    dtype = numpy_dtype(datatype)
    values = _flatten(data)
    if len(values) != count:
        raise InvalidArgument(
            f"tensor of shape {list(shape)} needs {count} elements, got {len(values)}"
        )
    if datatype == "BYTES":
        result = np.empty(count, dtype=np.object_)
        for index, value in enumerate(values):
            if isinstance(value, str):
                result[index] = value.encode("utf-8")
            elif isinstance(value, bytes):
                result[index] = value
            else:
                raise InvalidArgument("BYTES tensor data must be strings")
        return result.reshape(shape)
    _check_json_values(datatype, values)
    try:
        return np.asarray(values, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError, TypeError) as exc:
        raise InvalidArgument(f"tensor data does not fit datatype {datatype}: {exc}") from None


def _check_json_values(datatype: str, values: list) -> None:
    if datatype == "BOOL":
        ok = all(isinstance(v, bool) for v in values)
    elif datatype.startswith(("INT", "UINT")):
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    else:
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if not ok:
        raise InvalidArgument(f"tensor data holds values that are not of datatype {datatype}")


def array_to_buffer(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """Raw little-endian bytes of a tensor (BYTES: length-prefixed elements), as a view of the array's own
    memory where it already is contiguous little-endian (no copy: join or write it where it goes)."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    dtype = wire_dtype(datatype)
    if array.dtype == dtype and array.flags.c_contiguous and array.size:  # the common case: one view, 0.26 us
        # where the general conversion below takes 0.73
        return array.data.cast("B")
    contiguous = np.ascontiguousarray(array, dtype=dtype)
    return contiguous.reshape(-1).view(np.uint8).data


def array_to_values(array: np.ndarray, datatype: str) -> list:
    """Flat JSON values of a tensor (BYTES as UTF-8 strings)."""
    flat = array.reshape(-1)
    if datatype == "BYTES":
        return [
            item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)
            for item in flat
        ]
    return flat.tolist()


def as_bytes_array(array: np.ndarray) -> np.ndarray:
    """Normalise a str/bytes/object array to an object array of bytes."""
    if array.dtype == np.object_ and all(isinstance(x, bytes) for x in array.reshape(-1)):
        return array
    result = np.empty(array.shape, dtype=np.object_)
    flat = result.reshape(-1)
    for index, item in enumerate(array.reshape(-1)):
        flat[index] = item if isinstance(item, bytes) else str(item).encode("utf-8")
    return result
