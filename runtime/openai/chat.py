"""Chat prompts rendered by a model's own chat template, and tool calls parsed back out of the text it generates.

Templates are Jinja2 as Hugging Face writes them (``apply_chat_template``'s variables: ``messages``, ``tools``,
``add_generation_prompt``, ``bos_token``, ``eos_token``; ``raise_exception``; ``tojson``), rendered in Jinja2's
immutable sandbox since a template is data from the model's folder. Tool calls are read in the forms Triton's
frontend parses: Llama 3's JSON (``<|python_tag|>`` optional, calls separated by ``;``) and Hermes'
``<tool_call>{...}</tool_call>`` blocks.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import uuid
from typing import Any

from runtime.errors import InvalidArgument
from runtime.extras import require_extra

logger = logging.getLogger(__name__)
PYTHON_TAG = "<|python_tag|>"
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@functools.lru_cache(maxsize=64)
def _compiled(template: str) -> Any:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = raise_exception
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
    return environment.from_string(template)


def render_chat(template: str | None, model: str, messages: list[dict], tools: list[dict] | None,
                bos_token: str = "", eos_token: str = "") -> str:
    """The prompt for ``messages``; InvalidArgument when the model has no template or the template refuses them."""
    if not template:
        raise InvalidArgument(f"model '{model}' has no chat template: give one in its config (parameter "
                              "openai.chat_template) or a tokenizer_config.json with 'chat_template' in its folder")
    require_extra("openai", "a chat template", "jinja2")
    from jinja2.exceptions import TemplateError

    try:
        return _compiled(template).render(messages=messages, tools=tools or None, add_generation_prompt=True,
                                          bos_token=bos_token, eos_token=eos_token)
    except TemplateError as exc:
        raise InvalidArgument(f"the chat template of model '{model}' refused the messages: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a careless template's own error (a division by zero, a bad call)
        logger.warning("the chat template of model '%s' failed: %s: %s", model, type(exc).__name__, exc)
        raise InvalidArgument(f"the chat template of model '{model}' failed on the messages: "
                              f"{type(exc).__name__}: {exc}") from None


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool calls) of a generated text; no calls found: the text itself as content."""
    hermes = _HERMES.findall(text)
    if hermes:
        calls = [_call(json.loads(block)) for block in hermes if _is_call(block)]
        if calls:
            content = _HERMES.sub("", text).strip()
            return content or None, calls
    stripped = text.strip()
    if stripped.startswith(PYTHON_TAG) or stripped.startswith("{"):
        calls = _llama_calls(stripped.removeprefix(PYTHON_TAG))
        if calls:
            return None, calls
    return text, []


def _is_call(block: str) -> bool:
    try:
        value = json.loads(block)
    except ValueError:
        return False
    return isinstance(value, dict) and isinstance(value.get("name"), str)


def _llama_calls(text: str) -> list[dict[str, Any]]:
    """JSON objects one after another, separated by ``;`` (Llama 3's form); none if any part is not a call."""
    decoder = json.JSONDecoder()
    calls, position = [], 0
    while position < len(text):
        try:
            value, end = decoder.raw_decode(text, position)
        except ValueError:
            return []
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return []
        calls.append(_call(value))
        position = end
        while position < len(text) and text[position] in "; \n\t":
            position += 1
    return calls


def _call(value: dict) -> dict[str, Any]:
    arguments = value.get("arguments", value.get("parameters", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": value["name"],
                         "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}}
