"""Every case where this server deliberately answers differently from Triton, why, and what we answer instead.

The README's table "Where we differ from Triton, and why" is this table (a test keeps them the same).
A case listed here must really differ (a test checks that too): when we come to agree, it leaves the list. And it
must give our documented answer, status and words (``our_answer_problem``): a listed case that regressed to some
other error would still differ from Triton.
"""

from __future__ import annotations

from typing import Any

from tests.conformance.cases import SHM_INPUT_KEY

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
    "explicit-index-after-unload": ("same as http-index; and a model just unloaded: Triton may list it UNLOADING "
                                    "for a while, ours is UNAVAILABLE ('unloaded') once the unload has answered"),
    "explicit-grpc-index": "same as explicit-index-after-unload",
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
    "trace front-end events": ("Triton's trace file also holds the front end's timestamps on a request's top-level "
                               "trace (HTTP_RECV_START/END, HTTP_SEND_START/END, GRPC_WAITREAD_START/END, "
                               "GRPC_SEND_START/END); ours holds the core's, REQUEST_START to REQUEST_END"),
    "client shared memory": ("follows Triton 2.69: registering and unregistering a shared-memory region (system or "
                             "CUDA) is refused (UNSUPPORTED: HTTP 501, gRPC UNIMPLEMENTED, 'Client shared memory is "
                             "disabled...') unless the server runs with --allow-client-shm=true; 2.51 allows it "
                             "always (the conformance suite runs ours with the flag)"),
    "JSON nesting depth": ("follows Triton 2.58: a tensor's JSON data nested more than 100 levels deep is refused "
                           "(400, 'JSON nesting depth exceeds maximum allowed limit (100)'); 2.51 accepts any depth"),
    "model load time metric": ("follows Triton 2.52: nv_model_load_duration_secs, each loaded version's load time in "
                               "seconds; 2.51 has no such family"),
    "ensemble outputs not produced": ("follows Triton 2.52: an ensemble output that no composing model produced is "
                                      "left out of the response; 2.51 fails the request"),
    "reserved headers forwarded": ("follows Triton 2.69: under --http/grpc-header-forward-pattern, a matching header "
                                   "named as a reserved parameter (sequence_id, priority, timeout, ...) or starting "
                                   "triton_ refuses the request ('Header ... is reserved for Triton usage and cannot "
                                   "be forwarded.'); 2.51 forwards it"),
    "model is_ready": ("follows python_backend 2.67 and Triton 2.68: a Python model's is_ready() is asked by model "
                       "readiness and, under strict readiness, by server readiness (false, or no answer within 5 s: "
                       "not ready); 2.51 never calls it"),
    "gRPC drain": ("follows Triton 2.58: once SIGTERM's drain began, a new request on an open ModelStreamInfer "
                   "stream (or a new ModelInfer call) is refused UNAVAILABLE, 'GRPC server is shutting down and has "
                   "stopped accepting new requests.', while those running finish; 2.51 took them until the model's "
                   "scheduler stopped ('Server is stopping, scheduler for model has stopped accepting new inference "
                   "requests')"),
    "HTTP chunk count": ("follows Triton 2.69: a chunked request body of more than 65,536 non-empty chunks is "
                         "refused (400, 'Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer "
                         "or larger HTTP chunks.'); 2.51 reads any number"),
    "readiness during a worker restart": ("a Python model's worker that dies is restarted: the model stays ready "
                                          "while another of its instances can serve, and is not ready (strict "
                                          "server readiness too) while none can; Triton 2.68 reports a model not "
                                          "ready while any of its stubs is dead, 2.51 reported it ready"),
    "gRPC parameters order": ("Triton's request.parameters() lists a gRPC request's parameters in an order that "
                              "changes from call to call (C++ protobuf seeds each map's hash: 30 identical calls "
                              "gave 8 orders); ours lists the same keys in one stable order (upb's map order); "
                              "the conformance case compares them as mappings"),
    "forwarded header whitespace": ("an HTTP header value forwarded as a parameter loses its trailing whitespace, "
                                    "as RFC 9110 has HTTP parsers do; Triton's evhtp keeps it (gRPC metadata keeps "
                                    "it in both)"),
}


# Our answer to each listed error case: (HTTP status or gRPC code, the error's exact words).
ERROR_ANSWERS: dict[str, tuple[int | str, str]] = {
    "http-metadata-path-traversal": (404, "Not Found"),
    "http-index-bad-json":
        (400, "failed to parse the request JSON buffer: Expecting property name enclosed in double quotes: line 1 "
              "column 2 (char 1)"),
    "http-infer-json-nested-data": (400, "input 'INPUT0': tensor of shape [2] needs 2 elements, got 4"),
    "http-infer-malformed-json":
        (400, "failed to parse the request JSON buffer: JSON is malformed: object keys must be strings (byte 1)"),
    "http-infer-json-array-body": (400, "failed to parse the request JSON buffer: the request must be a JSON object"),
    "http-infer-inputs-not-a-list": (400, "Unable to parse 'inputs': attempt to access JSON non-array as array"),
    "http-infer-datatype-not-a-string": (400, "input 'INPUT0': 'datatype' must be a string"),
    "http-infer-too-few-elements": (400, "input 'INPUT0': tensor of shape [4] needs 4 elements, got 3"),
    "http-infer-too-many-elements": (400, "input 'INPUT0': tensor of shape [4] needs 4 elements, got 5"),
    "http-infer-strings-for-fp32": (400, "input 'INPUT0': tensor data holds values that are not of datatype FP32"),
    "http-infer-bools-for-fp32": (400, "input 'INPUT0': tensor data holds values that are not of datatype FP32"),
    "http-infer-int-out-of-range":
        (400, "input 'INPUT0': tensor data does not fit datatype INT32: Python integer 1099511627776 out of bounds "
              "for int32"),
    "http-infer-negative-dimension": (400, "input 'INPUT0': shape [-4] has a negative dimension"),
    "http-infer-no-name": (400, "Unable to parse 'name': attempt to access JSON non-string as string"),
    "http-infer-id-not-a-string": (400, "Unable to parse 'id': attempt to access JSON non-string as string"),
    "http-infer-parameters-not-an-object": (400, "request 'parameters' must be a JSON object"),
    "http-infer-classification-negative":
        (400, "Unable to set 'classification': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    "http-infer-classification-not-a-number":
        (400, "Unable to set 'classification': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    "http-generate-many-responses":
        (400, "generate expects model to produce exactly 1 response, use generate stream for model that generates "
              "various number of responses"),
    "http-generate-not-json":
        (400, "failed to parse the request JSON buffer: Expecting property name enclosed in double quotes: line 1 "
              "column 2 (char 1)"),
    "http-generate-parameters-not-an-object": (400, "Expected JSON object for keyword: 'parameters'"),
    "http-sequence-id-not-a-number-or-string":
        (400, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
    "http-shm-register-unknown-key": (400, "Unable to open shared memory region: '/serverless_triton_no_such_key'"),
    "http-shm-register-past-the-end": (400, f"Invalid shared memory region: '{SHM_INPUT_KEY}'"),
    "http-shm-register-path-trick": (400, "Unable to open shared memory region: '../../etc/passwd'"),
    "http-shm-infer-output-too-small":
        (400, "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should be at least 16 "
              "bytes to hold the results"),
    "http-logging-not-a-bool": (400, "attempt to access JSON non-boolean as boolean"),
    "http-logging-bad-format": (400, "invalid argument for --log_format, got: fancy"),
    "http-trace-setting-level-not-a-list": (400, "attempt to access JSON non-array as array"),
    "http-trace-setting-rate-not-a-string": (400, "attempt to access JSON non-string as string"),
    "http-cuda-register-not-an-object": (400, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"),
    "http-cuda-register-no-device": (400, "attempt to access non-existing object member 'device_id'"),
    "explicit-load-unknown-model": (400, "failed to load 'nonexistent', failed to poll from model repository"),
    "explicit-load-config-does-not-parse":
        (400, "failed to load 'bad_config', failed to poll from model repository: model 'bad_config': config.pbtxt "
              "syntax error: 2:17 : 'max_batch_size: {': Couldn't parse integer: {"),
    "explicit-load-config-not-json":
        (400, "failed to load 'text', failed to poll from model repository: model 'text': the 'config' parameter "
              "is not a valid model config: Failed to load JSON: Expecting property name enclosed in double "
              "quotes: line 1 column 2 (char 1)."),
    "explicit-load-config-not-a-string": (400, "parameter 'config' must be a string holding the model config as JSON"),
    "explicit-load-with-a-file":
        (400, "parameters ['file:1/model.py'] are not accepted: models load only from the configured repository"),
    "explicit-load-unknown-parameter":
        (400, "parameters ['foo'] are not accepted: models load only from the configured repository"),
    "explicit-load-bad-json":
        (400, "failed to parse the request JSON buffer: Expecting property name enclosed in double quotes: line 1 "
              "column 2 (char 1)"),
    "explicit-grpc-load-unknown-model":
        ("INVALID_ARGUMENT", "failed to load 'nonexistent', failed to poll from model repository"),
}

# The repository index: a model that failed to load, which Triton lists by name only, and the reason we give.
FAILED_MODEL_REASONS = {
    "bad_config": ("model 'bad_config': config.pbtxt syntax error: 2:17 : 'max_batch_size: {': Couldn't parse "
                   "integer: {"),
    "ensemble_batch_too_big": ("ensemble ensemble_batch_too_big allows maximum batch size 16, but it contains model "
                               "batched which only allows maximum batch size to be 8"),
    "ensemble_cycle": ("output 'DOUBLED' for ensemble 'ensemble_cycle' is not written: at least one of its depending "
                       "tensors, 't1', is not connected"),
    "ensemble_dtype_mismatch": ("in ensemble ensemble_dtype_mismatch, ensemble tensor sum: inconsistent data type: "
                                "TYPE_FP32 is inferred from model batched while TYPE_INT32 is inferred from model "
                                "double_int"),
    "ensemble_missing_model": ("ensemble ensemble_missing_model contains models that are not available or ambiguous: "
                               "nonexistent"),
    "ensemble_unused_tensor": "ensemble tensor 'spare' is unused in ensemble 'ensemble_unused_tensor'",
}
# The index cases -> the failed models they list with a reason (in explicit mode, only the one a step tried to load).
INDEX_CASES: dict[str, frozenset[str]] = {
    **dict.fromkeys(("http-index", "http-index-not-ready", "grpc-index"), frozenset(FAILED_MODEL_REASONS)),
    **dict.fromkeys(("explicit-index-after-loads", "explicit-index-after-unload", "explicit-grpc-index"),
                    frozenset({"bad_config"})),
}


def our_answer_problem(name: str, theirs: dict, ours: dict) -> str | None:
    """What is wrong with our answer to the listed case ``name`` (None when it is the documented one)."""
    if name in INDEX_CASES:
        return _index_problem(theirs, ours, INDEX_CASES[name])
    status, words = ERROR_ANSWERS[name]
    expected: dict[str, Any] = ({"code": status, "details": words} if isinstance(status, str)
                                else {"status": status, "body": {"error": words}})
    return None if ours == expected else f"{name}: expected our documented answer\n  {expected}\n  got {ours}"


def _index_problem(theirs: dict, ours: dict, failed: frozenset[str]) -> str | None:
    """Our index is Triton's, but a model of ``failed`` carries state UNAVAILABLE and its reason, and a model Triton
    still lists UNLOADING is UNAVAILABLE ('unloaded') in ours."""
    def entries(observed: dict) -> Any:
        return observed.get("body") if "status" in observed else (observed.get("response") or {}).get("models")

    expected = []
    for entry in entries(theirs) or []:
        if set(entry) == {"name"} and entry["name"] in failed:
            entry = {**entry, "state": "UNAVAILABLE", "reason": FAILED_MODEL_REASONS[entry["name"]]}
        elif entry.get("state") == "UNLOADING":
            entry = {**entry, "state": "UNAVAILABLE", "reason": "unloaded"}
        expected.append(entry)
    if entries(ours) != expected or ours.get("status", ours.get("code")) not in (200, "OK"):
        return f"the index, expected\n  {expected}\n  got {ours}"
    return None


def markdown_table() -> str:
    """The README's table of differences (``python -m tests.conformance.differences``)."""
    rows = ["| case | why |", "| --- | --- |"]
    rows += [f"| `{name}` | {reason} |" for name, reason in GLOBAL_DIFFERENCES.items()]
    rows += [f"| `{name}` | {reason} |" for name, reason in DIFFERENCES.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
