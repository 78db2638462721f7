"""The HTTP stack's floor: our listener (granian, as ``runtime/http/server.py`` configures it) answering V2 infer
requests with their own binary inputs, no model, no checks, on a bare ASGI app that reads bodies (into a tensor
pool) and sends answers as the infer route does (``runtime/http/body.py``, ``runtime/http/sending.py``).

The HTTP counterpart of ``scripts.benchmark``'s gRPC echo servers: ``scripts/bench_vs_triton.py`` measures it in the
same run as Triton and us, so that an HTTP row's cost can be split into the listener's and ours.  Any GET answers
200 (the readiness probe).

usage: python -m scripts.http_echo PORT
"""

from __future__ import annotations

import asyncio
import json
import sys
from functools import partial

import msgspec
import uvloop
from starlette.types import Receive, Scope, Send

from runtime.http.body import assemble_body, receive_asgi_body
from runtime.http.sending import UnsentBytes, send_answer
from runtime.http.server import HttpServer
from runtime.tensor_pool import TensorPool

_HEADER_LENGTH = b"inference-header-content-length"
_UNSENT = UnsentBytes()
_POOL = TensorPool()


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Each binary input back as the output of the same number (INPUT0 -> OUTPUT0), sent as ours sends answers
    (``runtime/http/sending.py``: the tensors cut straight into the chunks of a large one)."""
    if scope["type"] != "http":
        return
    if scope["method"] != "POST":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    headers = dict(scope["headers"])
    size = int(headers[_HEADER_LENGTH])
    chunks = await receive_asgi_body(receive, headers[b"content-length"].decode(), timeout=None)  # as ours reads
    body = assemble_body(chunks, "identity", into=partial(_POOL.buffer, aligned_at=size))  # into a tensor pool
    request = json.loads(bytes(body[:size]))
    outputs, parts, offset = [], [], size
    for tensor in request["inputs"]:
        length = tensor["parameters"]["binary_data_size"]
        outputs.append({"name": tensor["name"].replace("INPUT", "OUTPUT"), "datatype": tensor["datatype"],
                        "shape": tensor["shape"], "parameters": {"binary_data_size": length}})
        parts.append(memoryview(body)[offset:offset + length])
        offset += length
    header = msgspec.json.encode({"model_name": scope["path"].split("/")[3], "model_version": "1", "outputs": outputs})
    answer_headers = [(b"content-type", b"application/octet-stream"), (_HEADER_LENGTH, str(len(header)).encode())]
    await send_answer(send, 200, answer_headers, [header, *parts], _UNSENT)  # as ours answers: a large one in chunks


async def serve(port: int) -> None:
    server = HttpServer(echo, "127.0.0.1", port)
    await server.start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1])))
