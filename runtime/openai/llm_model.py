"""What makes a served model an LLM to the OpenAI routes, read from its config and its folder.

The mapping travels with the repository as config ``parameters``: ``openai.prompt_input`` (default ``text_input``,
BYTES), ``openai.text_output`` (default ``text_output``), ``openai.embedding_output`` (default ``embedding``) and
``openai.input.<field>`` naming the input each OpenAI sampling field goes to, with TensorRT-LLM's names as the
defaults (``max_tokens``, ``temperature``, ``top_p``, ``stop_words``, ``seed``, ``stream``, ...), so that Triton's
own convention works unchanged; a field goes to a model only if its config declares that input. A chat template
comes from ``openai.chat_template`` or from ``tokenizer_config.json`` beside ``config.pbtxt`` (as Hugging Face ships
it); usage is counted from the outputs ``num_input_tokens`` / ``num_output_tokens`` when the model gives them, else
with the ``tokenizer.json`` in the same folder.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.errors import InvalidArgument
from runtime.extras import require_extra

PREFIX = "openai."
# OpenAI's sampling fields and the input each goes to by default (TensorRT-LLM's names, as Triton's frontend sends).
DEFAULT_INPUTS = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "stop": "stop_words",
    "seed": "seed",
    "stream": "stream",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens",
}
INPUT_TOKENS_OUTPUT = "num_input_tokens"
OUTPUT_TOKENS_OUTPUT = "num_output_tokens"
FINISH_REASON_OUTPUT = "finish_reason"
DEFAULT_MAX_TOKENS = 16  # OpenAI's completions default, and Triton's frontend's


@dataclass
class LlmModel:
    """One served model seen as an LLM: where the prompt goes, where text and embeddings come from."""

    name: str
    prompt_input: str
    text_output: str | None  # None: the model gives no text (it may still give embeddings)
    embedding_output: str | None
    inputs: dict[str, Any]  # declared input name -> its TensorSpec
    fields: dict[str, str]  # OpenAI field -> the declared input it goes to
    outputs: frozenset[str]
    max_batch_size: int  # 0: the model does not batch
    decoupled: bool
    chat_template: str | None = None
    bos_token: str = ""
    eos_token: str = ""
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    tokenizer_path: Path | None = None
    _tokenizer: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    @property
    def counts_tokens(self) -> bool:
        return INPUT_TOKENS_OUTPUT in self.outputs and OUTPUT_TOKENS_OUTPUT in self.outputs

    def require_text(self) -> None:
        if self.text_output is None:
            raise InvalidArgument(f"model '{self.name}' is not a text-generation model: it has no output "
                                  f"'{self.text_output or 'text_output'}' (config parameter openai.text_output)")

    def require_embeddings(self) -> None:
        if self.embedding_output is None:
            raise InvalidArgument(f"model '{self.name}' is not an embedding model: it has no output 'embedding' "
                                  "(config parameter openai.embedding_output)")

    def count_tokens(self, text: str) -> int | None:
        """Tokens in ``text`` by the model's tokenizer (None: the model folder has none)."""
        if self.tokenizer_path is None:
            return None
        with self._lock:
            if self._tokenizer is None:
                require_extra("openai", "counting tokens with the model's tokenizer", "tokenizers")
                from tokenizers import Tokenizer

                self._tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


def read_llm_model(name: str, spec: Any, directory: str, decoupled: bool,
                   default_max_tokens: int = DEFAULT_MAX_TOKENS) -> LlmModel:
    """The model as the OpenAI routes use it; InvalidArgument when it takes no text prompt. ``default_max_tokens``:
    the server's (``--default-max-tokens``), where the model's config sets none."""
    parameters: dict[str, str] = spec.parameters
    inputs = {tensor.name: tensor for tensor in spec.inputs}
    outputs = frozenset(tensor.name for tensor in spec.outputs)
    prompt = parameters.get(PREFIX + "prompt_input", "text_input")
    if prompt not in inputs or inputs[prompt].datatype != "BYTES":
        raise InvalidArgument(f"model '{name}' does not take a text prompt: it has no BYTES input '{prompt}' "
                              "(config parameter openai.prompt_input names it)")
    text = parameters.get(PREFIX + "text_output", "text_output")
    embedding = parameters.get(PREFIX + "embedding_output", "embedding")
    fields = {}
    for openai_field, default in DEFAULT_INPUTS.items():
        target = parameters.get(f"{PREFIX}input.{openai_field}", default)
        if target and target in inputs:
            fields[openai_field] = target
    folder = Path(directory) if directory else None
    model = LlmModel(name, prompt, text if text in outputs else None, embedding if embedding in outputs else None,
                     inputs, fields, outputs, spec.max_batch_size, decoupled)
    _read_tokenizer_files(model, folder, parameters)
    max_tokens = parameters.get(PREFIX + "default_max_tokens", "")
    model.default_max_tokens = int(max_tokens) if max_tokens.isdigit() else default_max_tokens
    return model


def _read_tokenizer_files(model: LlmModel, folder: Path | None, parameters: dict[str, str]) -> None:
    """The chat template and special tokens of ``tokenizer_config.json``, and ``tokenizer.json``'s path."""
    model.chat_template = parameters.get(PREFIX + "chat_template") or None
    if folder is None:
        return
    config_path = _inside(folder, parameters.get(PREFIX + "tokenizer_config", "tokenizer_config.json"))
    if config_path is not None and config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidArgument(f"model '{model.name}': {config_path.name} cannot be read: {exc}") from None
        template = config.get("chat_template")
        if isinstance(template, list):  # Hugging Face's named templates: the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        model.chat_template = model.chat_template or (template if isinstance(template, str) else None)
        model.bos_token = _token_text(config.get("bos_token"))
        model.eos_token = _token_text(config.get("eos_token"))
    tokenizer = _inside(folder, parameters.get(PREFIX + "tokenizer", "tokenizer.json"))
    if tokenizer is not None and tokenizer.is_file():
        model.tokenizer_path = tokenizer


def _inside(folder: Path, relative: str) -> Path | None:
    """``folder / relative`` if it stays inside ``folder`` (a config cannot point the server elsewhere)."""
    path = (folder / relative).resolve()
    return path if path.is_relative_to(folder.resolve()) else None


def _token_text(value: Any) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...} as newer tokenizer configs write special tokens
        value = value.get("content")
    return value if isinstance(value, str) else ""
