"""Triton's header forwarding: request headers (HTTP) or call metadata (gRPC) whose names match a pattern become
string parameters of the inference request (``--http-header-forward-pattern``, ``--grpc-header-forward-pattern``).

As Triton (``src/command_line_parser.cc``, ``src/http_server.cc``, ``src/grpc/infer_handler.h``): the pattern is an
RE2 expression matched anywhere in the name (``PartialMatch``) and case-insensitively unless it starts ``(?-i)``;
only infer requests carry them (ModelInfer and each request of a ModelStreamInfer stream over gRPC).  A matching
name that is one of Triton's reserved parameter keys, or starts ``triton_``, refuses the request (Triton 2.69,
server #8763): a header must never set ``sequence_id``, ``priority``, ``timeout`` and the rest behind the
client's back.  Triton's own RE2 (``google-re2``) matches, so a pattern means here what it means there.
"""

from __future__ import annotations

from collections.abc import Iterable

from runtime.errors import InvalidArgument

# Triton's kReservedParameterKeys (src/common.h; tritonclient refuses them as parameters on its side)
RESERVED_PARAMETER_KEYS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                                     "headers", "binary_data_output"})
_INTERNAL_PREFIX = "triton_"
_CASE_INSENSITIVE = "(?i)"  # what Triton's parser puts before the flag's pattern


def check_forward_pattern(pattern: str) -> str:
    """``pattern`` if RE2 compiles it as Triton would, else ValueError with RE2's reason."""
    if pattern:
        import re2  # only where a pattern is given: every start imports this module

        try:
            re2.compile(_CASE_INSENSITIVE + pattern)
        except re2.error as exc:
            raise ValueError(f"not a valid RE2 pattern ({exc})") from None
    return pattern


class HeaderForward:
    """The parameters a request's headers give under one forward pattern."""

    def __init__(self, pattern: str) -> None:
        import re2  # only where a pattern is given: every start imports this module

        self.pattern = pattern
        self._regex = re2.compile(_CASE_INSENSITIVE + pattern)

    def parameters(self, headers: Iterable[tuple[str | bytes, str | bytes]]) -> dict[str, str]:
        """The matching headers as parameters (names as they came, lowercase over gRPC and ASGI; values as UTF-8 text).
        InvalidArgument, in Triton's words, for a matching name Triton reserves."""
        forwarded: dict[str, str] = {}
        search = self._regex.search
        for key, value in headers:
            name = key.decode("latin-1") if isinstance(key, bytes) else key
            if search(name) is None:
                continue
            if name in RESERVED_PARAMETER_KEYS or name.startswith(_INTERNAL_PREFIX):
                raise InvalidArgument(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
            forwarded[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return forwarded


def header_forward(pattern: str | None) -> HeaderForward | None:
    """The forwarding a flag's pattern asks for (None: none, the flag unset or empty)."""
    return HeaderForward(pattern) if pattern else None
