"""runtime.header_forward: which headers become parameters under a pattern, and the reserved keys refused."""

from __future__ import annotations

import pytest

from bootstrap.settings import SettingsError, parse_settings
from runtime.errors import InvalidArgument
from runtime.header_forward import RESERVED_PARAMETER_KEYS, HeaderForward, check_forward_pattern, header_forward


def test_a_pattern_matches_anywhere_in_any_case_as_triton_s_parser_makes_it():
    forward = HeaderForward("MY_HEADER")
    headers = [(b"x-my_header-1", b"a"), ("My_Header_2", "b"), (b"other", b"c")]
    assert forward.parameters(headers) == {"x-my_header-1": "a", "My_Header_2": "b"}


def test_a_case_sensitive_pattern():
    assert HeaderForward("(?-i)MY_HEADER.*").parameters([(b"my_header_1", b"a"), (b"MY_HEADER_2", b"b")]) == {
        "MY_HEADER_2": "b"}


@pytest.mark.parametrize("name", sorted(RESERVED_PARAMETER_KEYS) + ["triton_anything"])
def test_a_reserved_name_refuses_the_request(name):
    with pytest.raises(InvalidArgument) as refused:
        HeaderForward(".*").parameters([(b"fine", b"1"), (name.encode(), b"1")])
    assert refused.value.message == f"Header '{name}' is reserved for Triton usage and cannot be forwarded."


def test_a_reserved_name_the_pattern_does_not_match_is_no_concern():
    assert HeaderForward("^my_").parameters([(b"priority", b"1"), (b"my_a", b"x")]) == {"my_a": "x"}


def test_values_are_utf8_text_and_binary_metadata_does_not_fail():
    assert HeaderForward("^x").parameters([(b"x-name", "é".encode()), (b"x-bin", b"\xff\x00")]) == {
        "x-name": "é", "x-bin": "\ufffd\x00"}


def test_no_pattern_no_forwarding():
    assert header_forward("") is None and header_forward(None) is None


def test_an_invalid_pattern_is_a_settings_error(tmp_path):
    with pytest.raises(ValueError, match="not a valid RE2 pattern"):
        check_forward_pattern("(unclosed")
    with pytest.raises(SettingsError, match="server.grpc_header_forward_pattern: not a valid RE2 pattern"):
        parse_settings({"server": {"grpc_header_forward_pattern": "(unclosed"}}, tmp_path)
    assert parse_settings({"server": {"http_header_forward_pattern": "^x-"}}, tmp_path).http_header_forward_pattern \
        == "^x-"
