"""A tiny deterministic language model, for trying the OpenAI-compatible endpoints without downloading weights.

It continues the prompt from its last word that the tokenizer knows, each next word the one that most often
follows the current one in corpus.txt, and sends every word as its own response (a decoupled model, as LLM
backends stream). Offered tools (the chat template lists them between <tools> tags), it calls the first one.
"""

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

MARKUP = re.compile(r"<\|im_start\|>\w+|<\|im_end\|>|<\|endoftext\|>")
TOOLS = re.compile(r"<tools>(.*?)</tools>", re.DOTALL)


class TritonPythonModel:
    def initialize(self, args):
        folder = Path(__file__).resolve().parent.parent
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        words = (folder / "corpus.txt").read_text(encoding="utf-8").split()
        following = defaultdict(Counter)
        for word, successor in zip(words, words[1:]):
            following[word][successor] += 1
        self.next_word = {word: min(counts, key=lambda w: (-counts[w], w)) for word, counts in following.items()}
        self.first_word = words[0]

    def _continuation(self, prompt, max_tokens):
        """The words of the answer, and the number of tokens in the prompt."""
        prompt_tokens = len(self.tokenizer.encode(prompt, add_special_tokens=False).ids)
        offered = TOOLS.search(prompt)
        if offered:
            tools = json.loads(offered.group(1))
            call = {"name": tools[0]["function"]["name"], "arguments": {}}
            return ["<tool_call>" + json.dumps(call) + "</tool_call>"], prompt_tokens
        known = [w for w in MARKUP.sub(" ", prompt).split() if w in self.next_word]
        word = known[-1] if known else self.first_word
        answer = []
        for _ in range(max_tokens):
            word = self.next_word.get(word, self.first_word)
            answer.append(word)
        return answer, prompt_tokens

    def execute(self, requests):
        streams = []
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            stream = pb_utils.get_input_tensor_by_name(request, "stream")
            max_tokens = int(limit.as_numpy().reshape(-1)[0]) if limit is not None else 16
            words, prompt_tokens = self._continuation(prompt.decode("utf-8"), max_tokens)
            streaming = stream is not None and bool(stream.as_numpy().reshape(-1)[0])
            pieces = [" " + w for w in words] if streaming else [" " + " ".join(words)]
            counts = [1] * len(words) if streaming else [len(words)]
            streams.append((request, request.get_response_sender(), pieces, counts, prompt_tokens))
        step = 0
        while streams:  # every request of the batch advances one word per step, as a batched LLM decodes
            still = []
            for request, sender, pieces, counts, prompt_tokens in streams:
                if request.is_cancelled():
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                last = step == len(pieces) - 1
                outputs = [pb_utils.Tensor("text_output", np.array([pieces[step].encode()], dtype=np.object_)),
                           pb_utils.Tensor("num_input_tokens", np.array([prompt_tokens], dtype=np.int32)),
                           pb_utils.Tensor("num_output_tokens", np.array([counts[step]], dtype=np.int32))]
                sender.send(pb_utils.InferenceResponse(outputs),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
                if not last:
                    still.append((request, sender, pieces, counts, prompt_tokens))
            streams = still
            step += 1
        return None
