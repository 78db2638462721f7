"""JSON tensor data: a shape that claims more elements than the text holds is refused, never allocated."""

from __future__ import annotations

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
