"""What the OpenAI-compatible endpoints are started with (function.yaml ``openai.*``, Triton's frontend's flags);
picklable, as front-end processes receive it."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.openai.llm_model import DEFAULT_MAX_TOKENS
from runtime.openai.restrictions import OpenAiRestrictions

DEFAULT_MAX_TOOL_CALL_PARSE_BYTES = 128 * 1024  # Triton's frontend's default


@dataclass(frozen=True)
class OpenAiOptions:
    default_max_tokens: int = DEFAULT_MAX_TOKENS  # max_tokens where a request and its model give none
    max_tool_call_parse_bytes: int = DEFAULT_MAX_TOOL_CALL_PARSE_BYTES  # a tool-offering stream's held text
    restrictions: OpenAiRestrictions = field(default_factory=OpenAiRestrictions)  # --openai-restricted-api
