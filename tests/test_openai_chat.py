"""runtime/openai in process: chat templates, tool-call parsing, stop sequences and the config mapping."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.config.pbtxt import parse_model_config
from runtime.errors import InvalidArgument
from runtime.openai.chat import parse_tool_calls, render_chat
from runtime.openai.generation import StopScan
from runtime.openai.llm_model import read_llm_model

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_template_renders_messages_and_refuses_what_it_raises():
    prompt = render_chat(CHATML, "m", [{"role": "user", "content": "hi"}], None)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    strict = "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}ok"
    with pytest.raises(InvalidArgument, match="refused the messages: user first"):
        render_chat(strict, "m", [{"role": "system", "content": "x"}], None)
    with pytest.raises(InvalidArgument, match="has no chat template"):
        render_chat(None, "m", [{"role": "user", "content": "x"}], None)


def test_the_template_sandbox_keeps_python_out():
    with pytest.raises(InvalidArgument):
        render_chat("{{ ''.__class__.__mro__[1].__subclasses__() }}", "m", [], None)


@pytest.mark.parametrize("text, content, names", [
    ('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', None, ["f"]),
    ('sure <tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g"}</tool_call>', "sure",
     ["f", "g"]),
    ('<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}', None, ["f", "g"]),
    ('{"name": "f", "arguments": {"a": 1}}', None, ["f"]),
    ('{"not": "a call"}', '{"not": "a call"}', []),
    ("just words", "just words", []),
    ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
])
def test_tool_calls_in_the_forms_tritons_frontend_parses(text, content, names):
    parsed_content, calls = parse_tool_calls(text)
    assert parsed_content == content
    assert [call["function"]["name"] for call in calls] == names
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        json.loads(call["function"]["arguments"])  # always a JSON string


def test_stop_sequences_hold_back_only_what_may_begin_one():
    scan = StopScan(["END!"])
    assert scan.feed("hello E") == "hello "  # "E" may begin END!
    assert scan.feed("xit E") == "Exit "
    assert scan.feed("ND! more") == "" and scan.stopped
    assert scan.flush() == ""
    free = StopScan([])
    assert free.feed("anything") == "anything" and free.flush() == ""


class _NaiveStopScan:
    """The reference: every prefix of every stop tried against the held text (quadratic, obviously right)."""

    def __init__(self, stops: list[str]) -> None:
        self.stops, self.held, self.stopped = stops, "", False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        self.held += text
        cuts = [self.held.find(stop) for stop in self.stops if stop in self.held]
        if cuts:
            self.stopped = True
            sent, self.held = self.held[:min(cuts)], ""
            return sent
        keep = max((size for stop in self.stops for size in range(1, len(stop))
                    if self.held.endswith(stop[:size])), default=0)
        sent, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return sent


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text("ab", min_size=1, max_size=7), max_size=4),
       st.lists(st.text("abc", max_size=9), max_size=12))
def test_stop_sequences_are_found_as_a_scan_of_every_prefix_finds_them(stops, pieces):
    scan, reference = StopScan(stops), _NaiveStopScan(stops)
    for piece in pieces:
        assert scan.feed(piece) == reference.feed(piece)
        assert (scan.held, scan.stopped) == (reference.held, reference.stopped)


def test_the_mapping_defaults_to_tensorrt_llms_names_and_follows_the_config(tmp_path):
    config = parse_model_config("""
        backend: "python"
        max_batch_size: 4
        input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
                { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
                { name: "prompt" data_type: TYPE_STRING dims: [ 1 ] },
                { name: "sampling_temperature" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
    """, "llm")
    model = read_llm_model("llm", config, str(tmp_path), decoupled=True)
    assert (model.prompt_input, model.text_output, model.fields) == ("text_input", "text_output",
                                                                     {"max_tokens": "max_tokens"})
    config.parameters.update({"openai.prompt_input": "prompt", "openai.input.temperature": "sampling_temperature",
                              "openai.input.max_tokens": ""})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": {
        "content": "</s>"}}))
    model = read_llm_model("llm", config, str(tmp_path), decoupled=True)
    assert (model.prompt_input, model.fields) == ("prompt", {"temperature": "sampling_temperature"})
    assert (model.chat_template, model.eos_token) == (CHATML, "</s>")
    config.parameters["openai.prompt_input"] = "max_tokens"
    with pytest.raises(InvalidArgument, match="no BYTES input 'max_tokens'"):
        read_llm_model("llm", config, str(tmp_path), decoupled=True)
