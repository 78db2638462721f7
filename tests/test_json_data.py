"""JSON tensor data: a shape that claims more elements than the text holds is refused, never allocated."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.errors import InvalidArgument
from runtime.http.json_data import NotFast, array_from_json, parse_numbers

_INTEGER_TYPES = ["INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"]


@pytest.mark.parametrize("data", [b"[]", b"[1,2,3]", b"[[1],[2]]"])
def test_a_huge_claimed_shape_is_a_client_error(data):
    """Found by the HTTP fuzz test: shape [3, 2**31] with data [] made the server try to allocate 24 GiB (500)."""
    with pytest.raises(InvalidArgument, match="needs 6442450944 elements"):
        array_from_json("UINT32", (3, 2**31), data)


@pytest.mark.parametrize(("data", "shape"), [(b"[5]", (1,)), (b"[1,2,3,4]", (2, 2)), (b"[[1,2],[3,4]]", (2, 2)),
                                             (b"[]", (0,))])
def test_exact_data_still_parses(data, shape):
    array = array_from_json("INT32", shape, data)
    assert array.shape == shape and array.dtype == np.int32


def test_nesting_past_tritons_limit_is_refused_on_both_paths_and_many_rows_are_not():
    rows = np.arange(20000, dtype=np.float32).reshape(10000, 2)
    nested = json.dumps(rows.tolist()).encode()  # 10,001 brackets, two deep: the fast path still takes it
    assert np.array_equal(array_from_json("FP32", (10000, 2), nested), rows)
    for datatype, value in (("FP32", b"1.5"), ("INT64", b"7"), ("BYTES", b'"x"')):
        assert array_from_json(datatype, (1,), b"[" * 100 + value + b"]" * 100).size == 1
        with pytest.raises(InvalidArgument, match=r"JSON nesting depth exceeds maximum allowed limit \(100\)"):
            array_from_json(datatype, (1,), b"[" * 101 + value + b"]" * 101)
    wide = b"[" + b",".join([b"[1]"] * 150) + b"]"  # 151 brackets, but only two deep
    assert array_from_json("INT32", (150,), wide).tolist() == [1] * 150


@given(st.sampled_from(_INTEGER_TYPES), st.data())
def test_the_fast_path_reads_every_integer_type_in_range(datatype, data):
    """The fast path reads int64 ('i'), uint64 ('u') or double ('d'): an integer array in range is read on the
    fast path, and equals what the generic path makes of it."""
    dtype = np.dtype(datatype.lower())
    limits = np.iinfo(dtype)
    values = data.draw(st.lists(st.integers(int(limits.min), int(limits.max)), min_size=1, max_size=50))
    text = json.dumps(values).encode()
    fast = parse_numbers(text, 0, len(text), datatype, len(values))
    assert fast.dtype == dtype and fast.tolist() == values
    assert array_from_json(datatype, (len(values),), text).tolist() == values


@pytest.mark.parametrize("datatype, value", [("INT8", 128), ("INT8", -129), ("UINT8", -1), ("UINT16", 65536),
                                             ("INT32", 2**31), ("UINT64", -1)])
def test_the_fast_path_leaves_out_of_range_integers_to_the_generic_one(datatype, value):
    text = json.dumps([1, value]).encode()
    with pytest.raises((NotFast, ValueError, OverflowError)):
        parse_numbers(text, 0, len(text), datatype, 2)
    with pytest.raises(InvalidArgument):
        array_from_json(datatype, (2,), text)
