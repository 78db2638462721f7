"""Tensor datatype conversions and the BYTES wire encoding."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.datatypes import (
    array_from_buffer,
    array_from_values,
    array_to_buffer,
    array_to_values,
    config_type_to_datatype,
    datatype_to_config_type,
    deserialize_bytes,
    serialize_bytes,
)
from runtime.errors import InvalidArgument


def test_config_type_names():
    assert config_type_to_datatype("TYPE_FP32") == "FP32"
    assert config_type_to_datatype("TYPE_STRING") == "BYTES"
    assert datatype_to_config_type("BYTES") == "TYPE_STRING"
    assert datatype_to_config_type("INT64") == "TYPE_INT64"


@pytest.mark.parametrize("datatype, dtype", [("FP32", np.float32), ("INT64", np.int64), ("UINT8", np.uint8),
                                             ("FP16", np.float16), ("BOOL", np.bool_), ("FP64", np.float64)])
def test_buffer_round_trip(datatype, dtype):
    array = (np.arange(6) % 2 == 0) if dtype is np.bool_ else np.arange(6).astype(dtype)
    array = array.reshape(2, 3)
    back = array_from_buffer(datatype, [2, 3], array_to_buffer(array, datatype))
    np.testing.assert_array_equal(back, array)
    assert back.dtype == np.dtype(dtype)


def test_bytes_round_trip_and_exact_length():
    array = np.array([b"a", b"", "ü".encode()], dtype=np.object_)
    encoded = serialize_bytes(array)
    assert encoded == b"\x01\0\0\0a\0\0\0\0\x02\0\0\0\xc3\xbc"
    assert list(deserialize_bytes(encoded, 3)) == list(array)
    with pytest.raises(InvalidArgument, match="expected 2 strings for inference input 'T', got 6 bytes of extra data"):
        deserialize_bytes(encoded, 2, "T")
    with pytest.raises(InvalidArgument, match="incomplete string length for inference input 'T'"):
        deserialize_bytes(encoded[:2], 1, "T")
    with pytest.raises(InvalidArgument, match="expecting string of length 2 but only 1 bytes available"):
        deserialize_bytes(encoded[:-1], 3, "T")


def test_values_nested_and_flat():
    nested = array_from_values("INT32", [2, 2], [[1, 2], [3, 4]])
    flat = array_from_values("INT32", [2, 2], [1, 2, 3, 4])
    np.testing.assert_array_equal(nested, flat)
    assert array_to_values(nested, "INT32") == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "datatype, data, fragment",
    [
        ("INT32", [1.5, 2], "not of datatype INT32"),
        ("BOOL", [1, 0], "not of datatype BOOL"),
        ("UINT8", [300, 1], "does not fit datatype UINT8"),
        ("FP32", [True, 1.0], "not of datatype FP32"),
        ("BYTES", [1, 2], "must be strings"),
    ],
)
def test_values_of_the_wrong_type(datatype, data, fragment):
    with pytest.raises(InvalidArgument, match=fragment):
        array_from_values(datatype, [2], data)


def test_shape_checks():
    with pytest.raises(InvalidArgument, match="too many elements"):
        array_from_buffer("FP32", [2**31, 2**31], b"")
    with pytest.raises(InvalidArgument, match="invalid dimension"):
        array_from_buffer("FP32", [-1], b"")
    with pytest.raises(InvalidArgument, match="unsupported datatype"):
        array_from_buffer("COMPLEX", [1], b"")
