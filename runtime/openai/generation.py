"""OpenAI request bodies checked and turned into inference requests, and the model's responses into text, token
counts and a finish reason. Protocol-neutral apart from OpenAI's field names: ``routes.py`` does the HTTP."""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.datatypes import array_from_values
from runtime.errors import InvalidArgument, ServingError
from runtime.openai.llm_model import (
    FINISH_REASON_OUTPUT,
    INPUT_TOKENS_OUTPUT,
    OUTPUT_TOKENS_OUTPUT,
    LlmModel,
)
from runtime.types import InferRequest, InferTensor, StreamResponse


class FieldError(InvalidArgument):
    """A request field OpenAI's API would refuse: the message names it, ``param`` carries it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed", "user",
           "frequency_penalty", "presence_penalty", "logprobs", "logit_bias"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "suffix", "best_of"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls",
                         "response_format", "top_logprobs", "store", "metadata", "service_tier"}
EMBEDDING_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}


def check_fields(body: Any, known: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise FieldError("", "the request body must be a JSON object")
    unknown = sorted(set(body) - known)
    if unknown:
        raise FieldError(unknown[0], f"Unrecognized request argument supplied: {unknown[0]}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise FieldError("model", "'model' must be the name of a served model")
    return body


def _number(body: dict, key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise FieldError(key, f"'{key}' must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def _whole(body: dict, key: str, low: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise FieldError(key, f"'{key}' must be a whole number of at least {low}, got {value!r}")
    return value


MAX_STOPS = 4  # OpenAI's own bound
MAX_STOP_CHARACTERS = 1024  # each; a stop sequence is a few tokens, and a long one only costs the server


def _stops(body: dict) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise FieldError("stop", f"'stop' must be a string or a list of at most {MAX_STOPS} non-empty strings")
    if any(len(stop) > MAX_STOP_CHARACTERS for stop in stops):
        raise FieldError("stop", f"each 'stop' sequence may be at most {MAX_STOP_CHARACTERS} characters long")
    return stops


@dataclass
class Sampling:
    """The fields every generation request shares, checked."""

    max_tokens: int
    stream: bool
    include_usage: bool
    stops: list[str]
    values: dict[str, Any]  # OpenAI field -> value, for the model's mapped inputs


def read_sampling(body: dict, model: LlmModel, max_tokens_keys: tuple[str, ...]) -> Sampling:
    if body.get("n", 1) != 1:
        raise FieldError("n", "'n' must be 1: one choice per request is served")
    if body.get("best_of") not in (None, 1):
        raise FieldError("best_of", "'best_of' must be 1")
    if body.get("logprobs") not in (None, False, 0) or body.get("top_logprobs") not in (None, 0):
        raise FieldError("logprobs", "'logprobs' is not supported: the model's outputs carry no log probabilities")
    if body.get("logit_bias") not in (None, {}):
        raise FieldError("logit_bias", "'logit_bias' is not supported")
    if body.get("suffix") is not None:
        raise FieldError("suffix", "'suffix' is not supported")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise FieldError("stream", "'stream' must be true or false")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}
                                or not isinstance(options.get("include_usage", False), bool)):
        raise FieldError("stream_options", "'stream_options' must be {\"include_usage\": true|false}")
    if options is not None and not stream:
        raise FieldError("stream_options", "'stream_options' is only allowed when 'stream' is true")
    max_tokens = None
    for key in max_tokens_keys:
        max_tokens = _whole(body, key, 1) if max_tokens is None else max_tokens
    values: dict[str, Any] = {
        "max_tokens": max_tokens or model.default_max_tokens,
        "temperature": _number(body, "temperature", 0, 2),
        "top_p": _number(body, "top_p", 0, 1),
        "frequency_penalty": _number(body, "frequency_penalty", -2, 2),
        "presence_penalty": _number(body, "presence_penalty", -2, 2),
        "seed": _whole(body, "seed", 0),
        "stream": stream,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
    }
    stops = _stops(body)
    if stops:
        values["stop"] = stops
    return Sampling(values["max_tokens"], stream, bool(options and options.get("include_usage")), stops, values)


def _tensor(model: LlmModel, name: str, value: Any) -> InferTensor:
    spec = model.inputs[name]
    values = value if isinstance(value, list) else [value]
    dims = [len(values) if dim < 0 else dim for dim in spec.dims] or [1]
    shape = ([1] if model.batched else []) + dims
    return InferTensor(name, spec.datatype, tuple(shape), array_from_values(spec.datatype, shape, values))


def inference_request(model: LlmModel, prompt: str, sampling: Sampling | None) -> InferRequest:
    """The request for one prompt: the prompt, and each sampling field the model declares an input for."""
    inputs = [_tensor(model, model.prompt_input, prompt)]
    for openai_field, value in (sampling.values.items() if sampling else ()):
        target = model.fields.get(openai_field)
        if target is not None and value is not None:
            try:
                inputs.append(_tensor(model, target, value))
            except InvalidArgument as exc:
                raise FieldError(openai_field, f"'{openai_field}' does not fit the model's input '{target}': "
                                               f"{exc.message}") from None
    return InferRequest(model_name=model.name, id=uuid.uuid4().hex, inputs=inputs)


def _first_number(data: np.ndarray) -> int:
    return int(np.asarray(data).reshape(-1)[0])


def _text(data: np.ndarray) -> str:
    return "".join(item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
                   for item in np.asarray(data, dtype=object).reshape(-1))


@dataclass
class Piece:
    """What one response of the model adds: its text, and what it says of tokens and finishing."""

    text: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None


async def pieces(model: LlmModel, stream: AsyncIterator[StreamResponse]) -> AsyncIterator[Piece]:
    """The model's responses as text pieces (a decoupled model's: one per response); errors raised."""
    async for item in stream:
        if item.error is not None:
            raise item.error if isinstance(item.error, ServingError) else InvalidArgument(str(item.error))
        if item.response is None:
            continue
        outputs = {tensor.name: tensor.values() for tensor in item.response.outputs}
        piece = Piece(_text(outputs[model.text_output]) if model.text_output in outputs else "")
        if INPUT_TOKENS_OUTPUT in outputs:
            piece.input_tokens = _first_number(outputs[INPUT_TOKENS_OUTPUT])
        if OUTPUT_TOKENS_OUTPUT in outputs:
            piece.output_tokens = _first_number(outputs[OUTPUT_TOKENS_OUTPUT])
        if FINISH_REASON_OUTPUT in outputs:
            piece.finish_reason = _text(outputs[FINISH_REASON_OUTPUT]) or None
        yield piece


class StopScan:
    """Cuts the generated text at the first stop sequence, holding back only an end that may begin one.

    Linear in the text, whatever the stop sequences: a piece is searched once (``str.find`` over what is held and
    the piece), and for each sequence a Knuth-Morris-Pratt automaton says how long a beginning of it the text ends
    with, advanced over at most the piece or the sequence's own length, never over every prefix."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self._tables = [_prefix_table(stop) for stop in stops]
        self._states = [0] * len(stops)  # for each sequence: how much of its beginning the text so far ends with
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """What of ``text`` may be sent now."""
        if self.stopped:
            return ""
        held = self.held + text
        cuts = [at for stop in self.stops if (at := held.find(stop)) >= 0]
        if cuts:
            self.stopped = True
            self.held = ""
            return held[:min(cuts)]
        for index, stop in enumerate(self.stops):
            if len(text) < len(stop):
                self._states[index] = _advance(stop, self._tables[index], self._states[index], text)
            else:  # only the last len(stop) - 1 characters can begin it
                self._states[index] = _advance(stop, self._tables[index], 0, held[len(held) - len(stop) + 1:])
        keep = max(self._states, default=0)
        sent, self.held = held[:len(held) - keep], held[len(held) - keep:]
        return sent

    def flush(self) -> str:
        held, self.held = self.held, ""
        return "" if self.stopped else held


def _prefix_table(pattern: str) -> list[int]:
    """Knuth-Morris-Pratt's failure function: for each prefix, its longest proper border's length."""
    table = [0] * len(pattern)
    border = 0
    for at in range(1, len(pattern)):
        while border and pattern[at] != pattern[border]:
            border = table[border - 1]
        if pattern[at] == pattern[border]:
            border += 1
        table[at] = border
    return table


def _advance(pattern: str, table: list[int], state: int, text: str) -> int:
    """The longest beginning of ``pattern``, shorter than it, that the text ends with once ``text`` follows a text
    that ended with ``state`` characters of it."""
    for character in text:
        if state == len(pattern):
            state = table[state - 1]
        while state and pattern[state] != character:
            state = table[state - 1]
        if pattern[state] == character:
            state += 1
    return table[state - 1] if state == len(pattern) else state


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    counted: bool = False  # the model gave counts (else the tokenizer's, if there is one)

    def add(self, piece: Piece) -> None:
        if piece.input_tokens is not None and not self.counted:
            self.prompt_tokens, self.counted = piece.input_tokens, True
        if piece.output_tokens is not None:
            self.completion_tokens += piece.output_tokens

    def finish(self, model: LlmModel, prompt: str, text: str) -> dict[str, int] | None:
        """OpenAI's usage object; None when neither the model nor a tokenizer counts."""
        if not self.counted:
            prompt_tokens, completion_tokens = model.count_tokens(prompt), model.count_tokens(text)
            if prompt_tokens is None or completion_tokens is None:
                return None
            self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def finish_reason(given: str | None, usage: Usage, sampling: Sampling, stopped: bool) -> str:
    if stopped:
        return "stop"
    if given in ("stop", "length", "tool_calls", "content_filter"):
        return given
    return "length" if usage.completion_tokens >= sampling.max_tokens else "stop"
