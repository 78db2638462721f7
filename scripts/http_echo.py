"""The HTTP stack's floor: our listener (granian, as ``runtime/http/server.py`` configures it) answering V2 infer
requests with their own binary inputs, no model, no checks, on a bare ASGI app.

The HTTP counterpart of ``scripts.benchmark``'s gRPC echo servers: ``scripts/bench_vs_triton.py`` measures it in the
same run as Triton and us, so that an HTTP row's cost can be split into the listener's and ours.  Any GET answers
200 (the readiness probe).

usage: python -m scripts.http_echo PORT
"""

from __future__ import annotations

import asyncio
import json
import sys

import orjson
import uvloop

from runtime.http.server import HttpServer

_HEADER_LENGTH = b"inference-header-content-length"


async def echo(scope, receive, send) -> None:
    """Each binary input back as the output of the same number (INPUT0 -> OUTPUT0), in one message."""
    if scope["type"] != "http":
        return
    if scope["method"] != "POST":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)  # ours joins them too, into the tensor pool
    size = int(dict(scope["headers"])[_HEADER_LENGTH])
    request = json.loads(body[:size])
    outputs, parts, offset = [], [], size
    for tensor in request["inputs"]:
        length = tensor["parameters"]["binary_data_size"]
        outputs.append({"name": tensor["name"].replace("INPUT", "OUTPUT"), "datatype": tensor["datatype"],
                        "shape": tensor["shape"], "parameters": {"binary_data_size": length}})
        parts.append(memoryview(body)[offset:offset + length])
        offset += length
    header = orjson.dumps({"model_name": scope["path"].split("/")[3], "model_version": "1", "outputs": outputs})
    answer = b"".join([header, *parts])
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/octet-stream"), (_HEADER_LENGTH, str(len(header)).encode()),
        (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


async def serve(port: int) -> None:
    server = HttpServer(echo, "127.0.0.1", port)
    await server.start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1])))
