"""Triton's classification extension: an output asked for with ``classification: N`` comes back as its top N
classes, BYTES strings ``"<value>:<index>[:<label>]"``, instead of the scores themselves.

Formatted as Triton formats them: values of floating-point outputs with six decimals (C++ ``std::to_string``),
integers as integers; equal values in index order; a label when the output's ``label_filename`` has a line for
that index.  A batched output gives ``[batch, min(N, classes)]`` (each batch item's scores flattened), an
unbatched one ``[min(N, classes)]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.errors import InvalidArgument

PARAMETER = "classification"


def requested_count(parameters: dict[str, Any]) -> int:
    """The number of classes an output's parameters ask for (0: the output itself)."""
    value = parameters.get(PARAMETER)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"Unable to set '{PARAMETER}': attempt to access JSON non-unsigned-integer as "
                              "unsigned-integer")
    return value


def classify(array: np.ndarray, count: int, labels: list[str], batched: bool) -> np.ndarray:
    """The top ``count`` classes of each batch item (or of the whole tensor), as BYTES strings."""
    rows = array.reshape(array.shape[0], -1) if batched and array.ndim else array.reshape(1, -1)
    take = min(count, rows.shape[1])
    integral = rows.dtype.kind in "iub"
    result = np.empty((rows.shape[0], take), dtype=np.object_)
    for row_index, row in enumerate(rows):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:take]
        for column, index in enumerate(order.tolist()):
            value = row[index]
            text = f"{int(value)}:{index}" if integral else f"{float(value):f}:{index}"
            if index < len(labels):
                text += f":{labels[index]}"
            result[row_index, column] = text.encode("utf-8")
    return result if batched else result.reshape(take)
