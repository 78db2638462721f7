"""JSON tensor data: a shape that claims more elements than the text holds is refused, never allocated."""

from __future__ import annotations

import json

import numpy as np
import pytest

from runtime.errors import InvalidArgument
from runtime.http.json_data import array_from_json


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
