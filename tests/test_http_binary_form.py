"""runtime/http/binary_form.py: a binary-form header read once, each request of it built as a fresh parse builds
it, and nothing else taken for that form."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.datatypes import DATATYPES
from runtime.http.binary_form import MAX_FORMS, MAX_HEADER_BYTES, BinaryForms, read_binary_form
from runtime.http.codec import decode_infer_request
from runtime.types import InferRequest, InferTensor, RequestedOutput

_names = st.text(st.characters(codec="utf-8", exclude_characters='"\\'), min_size=1, max_size=12)
_inputs = st.lists(st.tuples(_names, st.sampled_from(sorted(DATATYPES)),
                             st.lists(st.integers(0, 2**40), max_size=4), st.integers(0, 64)), max_size=4)
_outputs = st.lists(st.tuples(_names, st.sampled_from([None, {}, {"binary_data": True}, {"binary_data": False}])),
                    max_size=3)


def _message(inputs, outputs, request_id, binary_output) -> dict:
    message: dict = {"inputs": [{"name": name, "datatype": datatype, "shape": shape,
                                 "parameters": {"binary_data_size": size}} for name, datatype, shape, size in inputs]}
    message["outputs"] = [{"name": name, **({} if parameters is None else {"parameters": parameters})}
                          for name, parameters in outputs]
    if request_id:
        message["id"] = request_id
    if binary_output is not None:
        message["parameters"] = {"binary_data_output": binary_output}
    return message


def _expected(message: dict, binary: memoryview) -> tuple[InferRequest, bool]:
    inputs, offset = [], 0
    for entry in message["inputs"]:
        size = entry["parameters"]["binary_data_size"]
        inputs.append(InferTensor(entry["name"], entry["datatype"], tuple(entry["shape"]), None, {},
                                  binary[offset:offset + size]))
        offset += size
    outputs = [RequestedOutput(entry["name"], dict(entry.get("parameters") or {})) for entry in message["outputs"]]
    request = InferRequest("m", "2", message.get("id", ""), inputs, outputs, {})
    return request, message.get("parameters", {}).get("binary_data_output", False)


@settings(max_examples=200, deadline=None)
@given(_inputs, _outputs, st.text(max_size=8), st.sampled_from([None, True, False]))
def test_a_binary_form_header_gives_the_request_a_fresh_parse_gives_every_time(inputs, outputs, request_id,
                                                                                binary_output):
    message = _message(inputs, outputs, request_id, binary_output)
    header = json.dumps(message).encode()
    binary = memoryview(bytes(range(256)) * 2)[:sum(size for *_, size in inputs)]
    expected = _expected(message, binary)
    forms = BinaryForms()
    assert forms.request(header, binary, "m", "2") == expected
    assert forms.request(bytes(header), binary, "m", "2") == expected  # from what was kept
    assert len(forms.forms) == 1
    body = header + bytes(binary)  # the public decoder takes the same way
    assert decode_infer_request(body, str(len(header)), "m", "2") == expected


def test_each_request_gets_output_parameters_of_its_own():
    header = json.dumps({"inputs": [], "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    forms = BinaryForms()
    first, _ = forms.request(header, memoryview(b""), "m", "")
    first.outputs[0].parameters["binary_data"] = False
    second, _ = forms.request(header, memoryview(b""), "m", "")
    assert second.outputs[0].parameters == {"binary_data": True}


def test_a_kept_header_with_a_binary_part_of_another_size_is_not_taken():
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
                                     "parameters": {"binary_data_size": 8}}]}).encode()
    forms = BinaryForms()
    assert forms.request(header, memoryview(bytes(8)), "m", "") is not None
    assert forms.request(header, memoryview(bytes(7)), "m", "") is None
    assert forms.request(header, memoryview(bytes(9)), "m", "") is None


def test_headers_of_other_forms_are_left_to_the_general_path_and_not_kept():
    others = [
        {"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}]},  # JSON data
        {"inputs": [{"name": "x", "datatype": "INT32", "shape": [1],
                     "parameters": {"binary_data_size": 4, "shared_memory_region": "r"}}]},
        {"inputs": [{"name": "x", "datatype": "INT33", "shape": [1], "parameters": {"binary_data_size": 4}}]},
        {"inputs": [{"name": "x", "datatype": "INT32", "shape": [-1], "parameters": {"binary_data_size": 4}}]},
        {"inputs": [], "outputs": [{"name": "y", "parameters": {"classification": 2}}]},
        {"inputs": [], "outputs": [{"name": "y", "parameters": {"binary_data": True, "x": False}}]},
        {"inputs": [], "parameters": {"priority": 1}},
        {"inputs": [], "unknown": 1},
    ]
    forms = BinaryForms()
    for message in others:
        header = json.dumps(message).encode()
        assert read_binary_form(header) is None
        assert forms.request(header, memoryview(bytes(4)), "m", "") is None
    for header in (b"", b"{", b"[]", b'{"inputs": 1}', b"\xff\xfe", b"[" * 10000):
        assert forms.request(header, memoryview(b""), "m", "") is None
    assert not forms.forms


def test_kept_headers_are_bounded():
    forms = BinaryForms()
    for index in range(MAX_FORMS * 2 + 5):
        header = json.dumps({"inputs": [], "id": str(index)}).encode()
        request, _ = forms.request(header, memoryview(b""), "m", "")
        assert request.id == str(index)
        assert len(forms.forms) <= MAX_FORMS
    long_header = json.dumps({"inputs": [], "id": "x" * MAX_HEADER_BYTES}).encode()
    forms.forms.clear()
    assert forms.request(long_header, memoryview(b""), "m", "") is not None
    assert not forms.forms  # read, not kept
