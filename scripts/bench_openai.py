"""Time to first token and tokens per second of the example LLM (``tiny_llm``) through the OpenAI-compatible
chat endpoint, against the same model through Triton's V2 ``generate_stream``, from one run.

    .venv/bin/python -m scripts.bench_openai [--requests 200] [--tokens 64] [--concurrency 1 32]

The server runs pinned to CPU 0 (with its Python worker), the load on CPU 1: an asyncio httpx client streaming
each answer and timing its first content chunk. Both paths run the same prompt and ``max_tokens``, so the
difference is the OpenAI adapter's (template, mapping, chunk format) over the generate extension's. Printed as
ratios, OpenAI / generate_stream, with the server's CPU per output token beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from examples.build_models import EXAMPLE_REPOSITORY
from scripts.bench_servers import start_ours, stop_tree, tree_cpu_seconds, wait_ready

PROMPT = "Tell me how the server answers a request"


async def _one(client: httpx.AsyncClient, path: str, body: dict, chat: bool) -> tuple[float, int]:
    """(seconds to the first content, content chunks) of one streamed answer."""
    start, first, chunks = time.perf_counter(), None, 0
    async with client.stream("POST", path, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            text = (event["choices"][0]["delta"].get("content") if chat and event["choices"]
                    else event.get("text_output"))
            if text:
                chunks += 1
                first = first if first is not None else time.perf_counter() - start
    return first or 0.0, chunks


async def _load(port: int, path: str, body: dict, chat: bool, requests: int, concurrency: int) -> dict:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=60) as client:
        await _one(client, path, body, chat)  # warm
        queue = list(range(requests))
        results: list[tuple[float, int]] = []

        async def worker() -> None:
            while queue:
                queue.pop()
                results.append(await _one(client, path, body, chat))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    tokens = sum(chunks for _, chunks in results)
    return {"ttft_p50_ms": statistics.median(first for first, _ in results) * 1000, "tokens_per_s": tokens / elapsed,
            "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    workdir = Path(tempfile.mkdtemp(prefix="bench-openai-"))
    process, port, _ = start_ours(EXAMPLE_REPOSITORY, workdir)
    paths = {
        "openai chat": ("/v1/chat/completions", {"model": "tiny_llm", "stream": True, "max_tokens": args.tokens,
                                                 "messages": [{"role": "user", "content": PROMPT}]}, True),
        "v2 generate_stream": ("/v2/models/tiny_llm/generate_stream",
                               {"text_input": PROMPT, "max_tokens": args.tokens, "stream": True}, False),
    }
    try:
        wait_ready(process, port)
        print(f"tiny_llm, {args.tokens} tokens per answer, server on CPU 0, load on CPU 1")
        print("| concurrency | path | TTFT p50 | tokens/s | server CPU per token |")
        print("| --- | --- | --- | --- | --- |")
        for concurrency in args.concurrency:
            rows = {}
            for name, (path, body, chat) in paths.items():
                before = tree_cpu_seconds(process.pid)
                result = asyncio.run(_load(port, path, body, chat, args.requests, concurrency))
                result["cpu_per_token_us"] = (tree_cpu_seconds(process.pid) - before) / result["tokens"] * 1e6
                rows[name] = result
                print(f"| {concurrency} | {name} | {result['ttft_p50_ms']:.2f} ms | {result['tokens_per_s']:.0f} | "
                      f"{result['cpu_per_token_us']:.0f} µs |")
            ours, base = rows["openai chat"], rows["v2 generate_stream"]
            print(f"| {concurrency} | openai / generate_stream | {ours['ttft_p50_ms'] / base['ttft_p50_ms']:.2f}x | "
                  f"{ours['tokens_per_s'] / base['tokens_per_s']:.2f}x | "
                  f"{ours['cpu_per_token_us'] / base['cpu_per_token_us']:.2f}x |")
    finally:
        stop_tree(process)


if __name__ == "__main__":
    main()
