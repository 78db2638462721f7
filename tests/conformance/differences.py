"""Every case where this server deliberately answers differently from Triton, and why.

The README's table "Where we differ from Triton, and why" is this table (a test keeps them the same).
A case listed here must really differ (a test checks that too): when we come to agree, it leaves the list.
"""

from __future__ import annotations

TRITON_500 = ("Triton answers 500 (INTERNAL) to a request body it cannot read as a request; it is the client's "
              "error, so we answer 400 (INVALID_ARG), with our parser's words")
TRITON_500_LOAD = ("Triton answers 500 (INTERNAL) when a load names a model, config or parameter it cannot use; it "
                   "is the client's error, so we answer 400 (INVALID_ARG) with Triton's words and the reason after "
                   "them")

DIFFERENCES: dict[str, str] = {
    # -- Triton's answer is a defect a client would not want -------------------------------------------------
    "http-index-bad-json": TRITON_500,
    "http-infer-malformed-json": TRITON_500,
    "http-infer-classification-negative": TRITON_500,
    "http-logging-not-a-bool": TRITON_500,
    "http-sequence-id-not-a-number-or-string": TRITON_500,
    "http-shm-register-unknown-key": TRITON_500,
    "http-shm-register-past-the-end": TRITON_500,
    "http-shm-register-path-trick": TRITON_500,
    "http-shm-infer-output-too-small": TRITON_500,
    "http-logging-bad-format": ("Triton answers 503 (UNAVAILABLE: retry later) to a log format it does not know; it "
                                "is the client's error, so we answer 400 with Triton's words"),
    "http-infer-classification-not-a-number": TRITON_500,
    "http-infer-json-array-body": TRITON_500,
    "http-infer-inputs-not-a-list": TRITON_500,
    "http-infer-datatype-not-a-string": TRITON_500,
    "http-infer-json-nested-data": TRITON_500,
    "http-infer-too-few-elements": TRITON_500,
    "http-infer-too-many-elements": TRITON_500,
    "http-infer-strings-for-fp32": TRITON_500,
    "http-infer-bools-for-fp32": TRITON_500,
    "http-infer-negative-dimension": TRITON_500,
    "http-infer-no-name": TRITON_500,
    "http-infer-id-not-a-string": TRITON_500,
    "http-infer-parameters-not-an-object": TRITON_500,
    "http-infer-int-out-of-range": ("Triton wraps an integer that does not fit the input's datatype (2**40 becomes "
                                    "0 in INT32) and runs the model on it; we refuse it (400)"),
    "http-index": ("a model whose config.pbtxt does not parse: Triton lists only its name; we add state UNAVAILABLE "
                   "and the parse error as its reason"),
    "http-index-not-ready": "same as http-index",
    "grpc-index": "same as http-index",
    "explicit-index-after-loads": "same as http-index",
    "explicit-index-after-unload": "same as http-index",
    "explicit-grpc-index": "same as http-index",
    "explicit-load-unknown-model": TRITON_500_LOAD,
    "explicit-grpc-load-unknown-model": TRITON_500_LOAD,
    "explicit-load-config-does-not-parse": TRITON_500_LOAD,
    "explicit-load-config-not-json": TRITON_500_LOAD,
    "explicit-load-config-not-a-string": TRITON_500_LOAD,
    "explicit-load-unknown-parameter": TRITON_500_LOAD,
    "explicit-load-bad-json": TRITON_500,
    "explicit-load-with-a-file": ("Triton accepts model files in a load request ('file:<path>' parameters); loading "
                                  "a model runs its code, so we take models only from the configured repository "
                                  "and refuse such a request (400)"),
    "http-generate-not-json": TRITON_500,
    "http-generate-parameters-not-an-object": TRITON_500,
    "http-generate-many-responses": ("Triton answers 200 with an error body when a generate request gets more than "
                                     "one response; a client checking the status would take it for a success, so "
                                     "we answer 400 with Triton's words"),
    "http-metadata-path-traversal": ("Triton matches routes on the undecoded path and echoes '..%2F..' as a model "
                                     "name; we decode %-escapes first, so such a path never reaches a model lookup "
                                     "(404 'Not Found' from the router)"),
    "http-trace-setting-level-not-a-list": TRITON_500,
    "http-trace-setting-rate-not-a-string": TRITON_500,
    "http-cuda-register-not-an-object": TRITON_500,
    "http-cuda-register-no-device": TRITON_500,
}

# Differences in how every answer is compared, not tied to one case.
GLOBAL_DIFFERENCES: dict[str, str] = {
    "content type of errors and empty bodies": ("Triton labels some JSON error bodies and empty health answers "
                                                "text/plain; ours are application/json (errors) and unlabelled "
                                                "(empty)"),
    "model tracebacks": ("Triton appends the Python traceback, with server file paths, to a model's error "
                         "('\\n\\nAt:\\n  /path/model.py(9): initialize'); we send the text before it, never "
                         "tracebacks or paths"),
    "error detail": ("where we know more than Triton says (why a model failed to load), our message is Triton's "
                     "text followed by ': <reason>'"),
    "input order": ("Triton checks a request's inputs in its hash map's order; we check them in reverse request "
                    "order, which is that order for the few inputs a request has"),
}


def markdown_table() -> str:
    """The README's table of differences (``python -m tests.conformance.differences``)."""
    rows = ["| case | why |", "| --- | --- |"]
    rows += [f"| `{name}` | {reason} |" for name, reason in GLOBAL_DIFFERENCES.items()]
    rows += [f"| `{name}` | {reason} |" for name, reason in DIFFERENCES.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
