"""A lone infer request with binary tensors handed to a direct path (``runtime/direct_path.py``'s DirectLanes: the
native edge's lanes), which serves it past the core: its inputs copied once, from the body's chunks into the buffer
the model's worker reads them in, and its answer's body written off the event loop.

A request goes there only where the core would answer it the same and batching loses nothing: its header has
tritonclient's binary form (``binary_form.py``) with every output as binary data, its body is whole and
uncompressed, and it is the only infer request open at the route with none overlapping another for ``QUIET_NS``
(requests that come together are batched by the core). The lane checks the rest (the model's inputs, their
datatypes, shapes and sizes, the outputs' names, the model's own queue idle) and declines untouched any request it
would not serve as the core would.
"""

from __future__ import annotations

import asyncio
import time

from runtime.direct_path import SERVE_AGAIN, DirectLanes, LaneAnswer
from runtime.errors import ServingError
from runtime.http.binary_form import BinaryForms
from runtime.types import InferResponse

QUIET_NS = 10_000_000


class LaneRoute:
    """The infer route's way to ``lanes`` (event loop only)."""

    def __init__(self, lanes: DirectLanes, forms: BinaryForms) -> None:
        self.lanes = lanes
        self.forms = forms
        self.open = 0  # infer requests open at the route
        self.crowded_at = 0  # monotonic ns when one last arrived while another was open

    def arrived(self) -> None:
        self.open += 1
        if self.open > 1:
            self.crowded_at = time.monotonic_ns()

    def left(self) -> None:
        self.open -= 1

    def alone(self) -> bool:
        """Whether the request now open is the only one, and none overlapped another lately."""
        return self.open == 1 and time.monotonic_ns() - self.crowded_at > QUIET_NS

    async def serve(self, name: str, version: str, chunks: list[bytes], header_length: int,
                    size: int) -> LaneAnswer | InferResponse | None:
        """The lane's answer, the core's response to a request the lane gave back (its outputs all binary data),
        or None where the request is the core's to serve; the model's error is raised."""
        if header_length <= 0 or size <= header_length:  # a raw binary request, a body of no tensors, or a lie
            return None
        first = chunks[0]
        header = first[:header_length] if len(first) >= header_length else b"".join(chunks)[:header_length]
        form = self.forms.form(header)
        if form is None or form.binary_bytes != size - header_length or not (form.outputs or form.binary_default):
            return None
        for _, wanted in form.outputs:
            if not wanted.get("binary_data", form.binary_default):
                return None
        inputs = [(input_name, datatype, list(shape), end - start)
                  for input_name, datatype, shape, start, end in form.inputs]
        request = self.lanes.take_http(name, version, form.id, inputs, [output for output, _ in form.outputs],
                                       chunks, header_length)
        if request is None:
            return None
        try:
            outcome = await request.future
        except asyncio.CancelledError:
            self.lanes.withdraw(request)
            raise
        if isinstance(outcome, ServingError):
            raise outcome
        if outcome is SERVE_AGAIN:
            return None
        assert isinstance(outcome, (LaneAnswer, InferResponse))
        return outcome
