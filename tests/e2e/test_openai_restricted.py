"""Triton's OpenAI frontend's flags: ``--openai-restricted-api`` (its test_openai_restricted_apis cases: each API
group behind its header, 401 in OpenAI's error object, the values never in the log, bad specs refused in its
words) and ``--max-tool-call-parse-bytes`` (a streamed chat offering tools cut with finish_reason "length", the
model cancelled), over OpenAI's own client, on two ports and on the one port."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import httpx
import openai
import pytest

from examples.build_models import EXAMPLE_REPOSITORY, build_word_tokenizer
from tests.e2e.test_openai import SLOW_LLM, SLOW_LLM_CONFIG, TOOLS
from tests.support import ServerProcess

INFERENCE_SECRET = "infer-secret-value"
ADMIN_SECRET = "admin-secret-value"
CHAT_TEMPLATE = ('parameters { key: "openai.chat_template" value { string_value: '
                 '"{% for m in messages %}{{ m.content }}{% endfor %}" } }\n')
MODES = {"two ports": (), "one port": ("--single-port",)}


@pytest.fixture(scope="module", params=list(MODES))
def server(request, tmp_path_factory):
    repository = tmp_path_factory.mktemp("openai-restricted") / "models"
    shutil.copytree(EXAMPLE_REPOSITORY / "tiny_llm", repository / "tiny_llm",
                    ignore=shutil.ignore_patterns("tokenizer.json"))
    build_word_tokenizer(repository / "tiny_llm" / "corpus.txt", repository / "tiny_llm" / "tokenizer.json")
    marker = repository.parent / "cancelled.txt"
    (repository / "slow_llm" / "1").mkdir(parents=True)
    (repository / "slow_llm" / "config.pbtxt").write_text(SLOW_LLM_CONFIG % marker + CHAT_TEMPLATE)
    (repository / "slow_llm" / "1" / "model.py").write_text(SLOW_LLM)
    with ServerProcess(repository, "--openai-restricted-api", "inference", "api-key", INFERENCE_SECRET,
                       "--openai-restricted-api", f"model-repository,health,metrics admin-key {ADMIN_SECRET}",
                       "--max-tool-call-parse-bytes", "64", *MODES[request.param]) as process:
        process.marker = marker
        process.clients = []
        yield process
        for client in process.clients:
            client.close()


def _client(server, **headers: str) -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0,
                           default_headers=headers)
    server.clients.append(client)  # closed with the server
    return client


def test_each_group_answers_only_with_its_header(server):
    messages = [{"role": "user", "content": "Tell me of the server"}]
    with pytest.raises(openai.AuthenticationError) as refused:
        _client(server).chat.completions.create(model="tiny_llm", messages=messages, max_tokens=2)
    assert refused.value.body == {"message": "This API is restricted, expecting header 'api-key' with valid value",
                                  "type": "authentication_error", "code": "invalid_auth"}
    with pytest.raises(openai.AuthenticationError):
        _client(server, **{"api-key": "wrong"}).completions.create(model="tiny_llm", prompt="The", max_tokens=2)
    allowed = _client(server, **{"api-key": INFERENCE_SECRET})
    assert allowed.chat.completions.create(model="tiny_llm", messages=messages, max_tokens=2).choices
    with pytest.raises(openai.AuthenticationError):
        allowed.models.list()  # another group, another header
    admin = _client(server, **{"admin-key": ADMIN_SECRET})
    assert "tiny_llm" in {model.id for model in admin.models.list()}
    base = f"http://{server.http_url}"
    assert httpx.get(f"{base}/health/ready").status_code == 401
    assert httpx.get(f"{base}/health/ready", headers={"admin-key": ADMIN_SECRET}).status_code == 200
    metrics = f"http://127.0.0.1:{server.metrics_port}/metrics"
    assert httpx.get(metrics).status_code == 401
    assert httpx.get(metrics, headers={"admin-key": ADMIN_SECRET}).status_code == 200
    assert httpx.get(f"{base}/v2/health/ready").status_code == 200  # Triton's own groups are not these
    log = server.log()
    assert "OpenAI API restrictions enabled" in log and "admin-key" in log
    assert INFERENCE_SECRET not in log and ADMIN_SECRET not in log


def test_a_tool_offering_stream_past_the_parse_bound_is_cut_and_the_model_cancelled(server):
    server.marker.unlink(missing_ok=True)
    client = _client(server, **{"api-key": INFERENCE_SECRET})
    started = time.monotonic()
    chunks = list(client.chat.completions.create(model="slow_llm", tools=TOOLS, stream=True, max_tokens=2000,
                                                 messages=[{"role": "user", "content": "go"}]))
    assert time.monotonic() - started < 10  # not the 2000 words' 20 s
    assert chunks[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith(" w0 w1") and len(text.encode()) <= 64
    deadline = time.monotonic() + 10
    while not server.marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.marker.read_text().startswith("cancelled after")
    plain = list(client.chat.completions.create(model="slow_llm", stream=True, max_tokens=30,
                                                messages=[{"role": "user", "content": "go"}]))  # no tools: no bound
    assert len("".join(c.choices[0].delta.content or "" for c in plain if c.choices).encode()) > 64


@pytest.mark.parametrize("spec, words", [
    (["bogus", "k", "v"], "Unknown API 'bogus'. Available APIs: ['inference', 'model-repository', 'metrics', "
                          "'health']"),
    (["inference,inference", "k", "v"], "restricted api 'inference' can not be specified in multiple config groups"),
    (["inference", "k"], "expected '<API>[,<API>...] <restricted-key> <restricted-value>'"),
])
def test_a_bad_restriction_is_refused_at_start(tmp_path, spec, words):
    (tmp_path / "models").mkdir()
    result = subprocess.run([sys.executable, "-m", "bootstrap.cli", "run", "--model-repository",
                             str(tmp_path / "models"), "--openai-restricted-api", *spec], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and words in result.stderr, result.stderr
