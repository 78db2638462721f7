"""The OpenAI-compatible endpoints as OpenAI's own client calls them, against a real server: the example LLM
(decoupled Python, dynamic batching) and embedding model, an ensemble LLM, a slow model for cancellation, bad
fields, and the token."""

from __future__ import annotations

import asyncio
import base64
import shutil
import time

import httpx
import numpy as np
import openai
import pytest

from examples.build_models import EXAMPLE_REPOSITORY, build_word_tokenizer
from tests.support import ServerProcess, python_model_source, write_model

ENSEMBLE = """
    platform: "ensemble"
    max_batch_size: 0
    input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
    ensemble_scheduling { step [
      { model_name: "shout" model_version: -1 input_map { key: "IN" value: "text_input" }
        output_map { key: "OUT" value: "loud" } },
      { model_name: "reply" model_version: -1 input_map { key: "IN" value: "loud" }
        output_map { key: "OUT" value: "text_output" } }
    ] }
    parameters {
      key: "openai.chat_template" value { string_value: "{% for m in messages %}{{ m.content }}{% endfor %}" }
    }
"""
STRING_STEP = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
SHOUT = python_model_source("""
    text = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0].decode()
    return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.upper().encode()], dtype=object))])
            for _ in requests]
""")
REPLY = python_model_source("""
    text = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0].decode()
    return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([("you said " + text).encode()],
                                                                         dtype=object))]) for _ in requests]
""")
SLOW_LLM_CONFIG = """
    backend: "python"
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
    parameters { key: "marker" value { string_value: "%s" } }
"""
SLOW_LLM = '''
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        self.marker = Path(json.loads(args["model_config"])["parameters"]["marker"]["string_value"])

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for index in range(2000):
                if request.is_cancelled():
                    self.marker.write_text(f"cancelled after {index}")
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    break
                word = np.array([f" w{index}".encode()], dtype=object)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", word)]))
                time.sleep(0.01)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
# A careless chat template: it divides by zero (not a Jinja error) whatever the messages.
CARELESS_LLM_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
    parameters { key: "openai.chat_template" value { string_value: "{{ messages | length / 0 }}" } }
"""
WEATHER = {"name": "get_weather", "description": "the weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
TOOLS = [{"type": "function", "function": WEATHER}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("openai") / "models"
    for name in ("tiny_llm", "tiny_embed"):
        shutil.copytree(EXAMPLE_REPOSITORY / name, repository / name, ignore=shutil.ignore_patterns("tokenizer.json"))
    build_word_tokenizer(repository / "tiny_llm" / "corpus.txt", repository / "tiny_llm" / "tokenizer.json")
    (write_model(repository, "ens_llm", ENSEMBLE) / "1").mkdir()
    write_model(repository, "shout", STRING_STEP, {"1/model.py": SHOUT})
    write_model(repository, "reply", STRING_STEP, {"1/model.py": REPLY})
    marker = repository.parent / "cancelled.txt"
    write_model(repository, "slow_llm", SLOW_LLM_CONFIG % marker, {"1/model.py": SLOW_LLM})
    write_model(repository, "not_llm", """
        backend: "python"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    """, {"1/model.py": python_model_source("return [None for _ in requests]")})
    write_model(repository, "careless_llm", CARELESS_LLM_CONFIG,
                {"1/model.py": python_model_source("return [None for _ in requests]")})
    with ServerProcess(repository, "--auth-token", "secret-token", "--metrics-config",
                       "histogram_latencies=true") as process:
        process.marker = marker
        yield process


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="secret-token", max_retries=0)


def _async_client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://{server.http_url}/v1", api_key="secret-token", max_retries=0)


def test_models_are_listed_and_retrieved(server):
    client = _client(server)
    names = {model.id for model in client.models.list()}
    assert {"tiny_llm", "tiny_embed", "ens_llm"} <= names
    assert client.models.retrieve("tiny_llm").id == "tiny_llm"
    with pytest.raises(openai.NotFoundError, match="The model `nope` does not exist"):
        client.models.retrieve("nope")


def test_completions_whole_and_streamed_agree(server):
    client = _client(server)
    whole = client.completions.create(model="tiny_llm", prompt="The client", max_tokens=5)
    assert whole.choices[0].text == " as the model answers each"  # the corpus' most frequent successors
    assert whole.choices[0].finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (2, 5)
    chunks = list(client.completions.create(model="tiny_llm", prompt="The client", max_tokens=5, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    echoed = client.completions.create(model="tiny_llm", prompt="The client", max_tokens=2, echo=True)
    assert echoed.choices[0].text == "The client as the"
    stopped = client.completions.create(model="tiny_llm", prompt="The client", max_tokens=9, stop=["answers"])
    assert (stopped.choices[0].text, stopped.choices[0].finish_reason) == (" as the model ", "stop")


def test_chat_async_streaming_with_usage(server):
    async def main():
        client = _async_client(server)
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Tell me of the server"}]
        whole = await client.chat.completions.create(model="tiny_llm", messages=messages, max_tokens=4)
        assert whole.choices[0].message.role == "assistant" and whole.usage.completion_tokens == 4
        stream = await client.chat.completions.create(model="tiny_llm", messages=messages, max_completion_tokens=4,
                                                      stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content
        assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
        await client.close()
    asyncio.run(main())


def test_tool_calls_are_parsed_back(server):
    client = _client(server)
    answer = client.chat.completions.create(model="tiny_llm", tools=TOOLS,
                                            messages=[{"role": "user", "content": "weather in Paris?"}])
    (call,) = answer.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments, answer.choices[0].finish_reason) == (
        "get_weather", "{}", "tool_calls")
    chunks = list(client.chat.completions.create(model="tiny_llm", tools=TOOLS, stream=True,
                                                 messages=[{"role": "user", "content": "weather?"}]))
    calls = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
    assert [c.function.name for c in calls] == ["get_weather"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    plain = client.chat.completions.create(model="tiny_llm", tools=TOOLS, tool_choice="none", max_tokens=2,
                                           messages=[{"role": "user", "content": "the model"}])
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason == "length"


def test_embeddings_as_floats_and_base64(server):
    client = _client(server)
    result = client.embeddings.create(model="tiny_embed", input=["the model answers", "the server"])
    assert [item.index for item in result.data] == [0, 1]
    vector = np.array(result.data[0].embedding)
    assert vector.shape == (32,) and abs(np.linalg.norm(vector) - 1) < 1e-5
    raw = httpx.post(f"http://{server.http_url}/v1/embeddings", headers={"Authorization": "Bearer secret-token"},
                     json={"model": "tiny_embed", "input": "the model answers", "encoding_format": "base64",
                           "dimensions": 8}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, vector[:8], rtol=1e-6)


def test_a_long_list_of_inputs_is_embedded_in_order(server):
    texts = [f"the model answers {'the server ' * (index % 5)}".strip() for index in range(300)]
    result = _client(server).embeddings.create(model="tiny_embed", input=texts)
    assert [item.index for item in result.data] == list(range(300))
    for index in (0, 1, 2, 3, 4, 299):
        alone = _client(server).embeddings.create(model="tiny_embed", input=texts[index])
        np.testing.assert_allclose(result.data[index].embedding, alone.data[0].embedding, rtol=1e-6)


def test_a_template_that_fails_answers_400_with_its_error_and_one_log_line(server):
    before = server.log()
    answer = httpx.post(f"http://{server.http_url}/v1/chat/completions",
                        json={"model": "careless_llm", "messages": [{"role": "user", "content": "x"}]},
                        headers={"Authorization": "Bearer secret-token"})
    assert answer.status_code == 400, answer.text
    assert "ZeroDivisionError" in answer.json()["error"]["message"]
    time.sleep(0.2)
    added = server.log()[len(before):]
    assert "Traceback" not in added
    assert [line for line in added.splitlines() if "careless_llm" in line and "template" in line] != []
    assert len([line for line in added.splitlines() if "ZeroDivisionError" in line]) == 1, added


def test_concurrent_streams_batch_underneath(server):
    async def main():
        client = _async_client(server)

        async def one(index: int) -> str:
            stream = await client.chat.completions.create(
                model="tiny_llm", max_tokens=8, stream=True, messages=[{"role": "user", "content": "the model"}])
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        answers = await asyncio.gather(*(one(i) for i in range(32)))
        await client.close()
        return answers

    before = _stats(server)
    answers = asyncio.run(main())
    assert len(set(answers)) == 1 and len(answers[0].split()) == 8
    after = _stats(server)
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert inferences == 32 and executions < 32  # requests shared executions: the dynamic batcher gathered them


def _stats(server) -> tuple[int, int]:
    stats = httpx.get(f"http://{server.http_url}/v2/models/tiny_llm/stats",
                      headers={"Authorization": "Bearer secret-token"}).json()["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def test_a_client_leaving_mid_stream_cancels_the_model(server):
    server.marker.unlink(missing_ok=True)
    with httpx.stream("POST", f"http://{server.http_url}/v1/completions", timeout=10,
                      headers={"Authorization": "Bearer secret-token"},
                      json={"model": "slow_llm", "prompt": "go", "max_tokens": 2000, "stream": True}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    deadline = time.monotonic() + 10
    while not server.marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.marker.read_text().startswith("cancelled after")
    assert int(server.marker.read_text().split()[-1]) < 1000


def test_an_ensemble_answers_chat_and_completions(server):
    client = _client(server)
    answer = client.chat.completions.create(model="ens_llm", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "you said HI"
    assert client.completions.create(model="ens_llm", prompt="ok").choices[0].text == "you said OK"
    chunks = list(client.chat.completions.create(model="ens_llm", stream=True,
                                                 messages=[{"role": "user", "content": "hey"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "you said HEY"


@pytest.mark.parametrize("path, body, status, param", [
    ("/chat/completions", {"model": "tiny_llm", "messages": []}, 400, "messages"),
    ("/chat/completions", {"model": "tiny_llm", "messages": [{"content": "x"}]}, 400, "messages"),
    ("/chat/completions", {"model": "tiny_llm", "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
    ("/chat/completions", {"model": "tiny_llm", "messages": [{"role": "user", "content": "x"}], "tools": [{}]}, 400,
     "tools"),
    ("/chat/completions", {"model": "tiny_llm", "messages": [{"role": "user", "content": "x"}], "bogus": 1}, 400,
     "bogus"),
    ("/completions", {"model": "tiny_llm", "prompt": [1, 2]}, 400, "prompt"),
    ("/completions", {"model": "tiny_llm", "prompt": "x", "temperature": 9}, 400, "temperature"),
    ("/completions", {"model": "tiny_llm", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/completions", {"model": "tiny_llm", "prompt": "x", "stop": [""]}, 400, "stop"),
    ("/completions", {"model": "tiny_llm", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("/completions", {"model": "tiny_llm", "prompt": "x", "stop": "ab" * 200_000}, 400, "stop"),
    ("/embeddings", {"model": "tiny_embed", "input": ["x"] * 2049}, 400, "input"),
    ("/completions", {"model": "tiny_llm", "prompt": "x", "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("/completions", {"model": "tiny_llm", "prompt": "x", "logprobs": 2}, 400, "logprobs"),
    ("/completions", {"prompt": "x"}, 400, "model"),
    ("/embeddings", {"model": "tiny_embed", "input": []}, 400, "input"),
    ("/embeddings", {"model": "tiny_embed", "input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
    ("/completions", {"model": "nope", "prompt": "x"}, 404, None),
    ("/completions", {"model": "not_llm", "prompt": "x"}, 400, None),
    ("/embeddings", {"model": "tiny_llm", "input": "x"}, 400, None),
    ("/chat/completions", {"model": "slow_llm", "messages": [{"role": "user", "content": "x"}]}, 400, None),
])
def test_bad_requests_get_openai_errors(server, path, body, status, param):
    answer = httpx.post(f"http://{server.http_url}/v1{path}", json=body,
                        headers={"Authorization": "Bearer secret-token"})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["message"] and error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_bodies_are_bounded_and_the_token_is_required(server):
    unauthorised = openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        unauthorised.models.list()
    malformed = httpx.post(f"http://{server.http_url}/v1/completions", content=b"{not json",
                           headers={"Authorization": "Bearer secret-token", "content-type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"
    huge = httpx.post(f"http://{server.http_url}/v1/completions", content=b"x" * (65 << 20),
                      headers={"Authorization": "Bearer secret-token"})
    assert huge.status_code == 413


def test_decoupled_models_report_time_to_first_response_and_between_responses(server):
    _client(server).completions.create(model="tiny_llm", prompt="The client", max_tokens=3, stream=True).close()
    list(_client(server).completions.create(model="tiny_llm", prompt="The client", max_tokens=3, stream=True))
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics",
                     headers={"Authorization": "Bearer secret-token"}).text
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("nv_inference_first_response_histogram_ms", "serverless_triton_response_interval"))}
    labels = 'model="tiny_llm",version="1"'
    assert samples[f"nv_inference_first_response_histogram_ms_count{{{labels}}}"] >= 2
    assert samples[f'nv_inference_first_response_histogram_ms_bucket{{{labels},le="100"}}'] >= 1
    assert samples[f"serverless_triton_response_interval_ms_count{{{labels}}}"] >= 2
    # not decoupled: no time between responses (its time to first response is counted, as in Triton 2.65)
    assert not any("ens_llm" in key for key in samples if key.startswith("serverless_triton_response_interval"))


def test_the_servers_default_max_tokens_applies_where_request_and_model_give_none(tmp_path):
    """--default-max-tokens (Triton's OpenAI frontend, default 16): a completion without max_tokens stops there
    ("length"), unless the model's config sets its own (openai.default_max_tokens)."""
    repository = tmp_path / "models"
    shutil.copytree(EXAMPLE_REPOSITORY / "tiny_llm", repository / "tiny_llm", ignore=shutil.ignore_patterns(
        "tokenizer.json"))
    build_word_tokenizer(repository / "tiny_llm" / "corpus.txt", repository / "tiny_llm" / "tokenizer.json")
    config = repository / "tiny_llm" / "config.pbtxt"
    config.write_text("\n".join(line for line in config.read_text().splitlines()
                                if "default_max_tokens" not in line))  # the model sets none
    with ServerProcess(repository, "--default-max-tokens", "3") as server:
        client = openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model="tiny_llm", prompt="The client")
        assert answer.usage.completion_tokens == 3 and answer.choices[0].finish_reason == "length"
        asked = client.completions.create(model="tiny_llm", prompt="The client", max_tokens=5)
        assert asked.usage.completion_tokens == 5
