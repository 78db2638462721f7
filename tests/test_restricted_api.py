"""Endpoint restrictions: the option's syntax, and which group a REST path or gRPC method belongs to (the answers
themselves are compared with Triton in tests/conformance/test_restricted.py)."""

from __future__ import annotations

import pytest

from bootstrap.settings import SettingsError, parse_settings
from runtime.grpc.call_refusal import GROUP_BY_METHOD
from runtime.http.restricted import http_api_group
from runtime.protocol import service_pb2
from runtime.restricted_api import API_GROUPS, RestrictedApis, Restriction


def test_parse_names_each_group_with_its_header():
    apis = RestrictedApis.parse(["model-repository,shared-memory:admin-key=secret", "logging:log-key=x=y"], "flag")
    assert apis.restriction("model-repository") == Restriction("admin-key", "secret")
    assert apis.restriction("shared-memory") == Restriction("admin-key", "secret")
    assert apis.restriction("logging") == Restriction("log-key", "x=y")
    assert apis.restriction("inference") is None and apis.restriction(None) is None
    assert not RestrictedApis.parse([], "flag")


@pytest.mark.parametrize(("spec", "words"), [
    ("inference", "expected <API>"), ("inference:key", "expected <API>"), (":k=v", "expected <API>"),
    ("everything:k=v", "unknown API 'everything'"), ("inference:k y=v", "printable ASCII"),
])
def test_parse_refuses_what_triton_cannot_read(spec, words):
    with pytest.raises(ValueError, match=words):
        RestrictedApis.parse([spec], "--http-restricted-api")


def test_a_group_restricted_twice_is_refused():
    with pytest.raises(ValueError, match="more than once"):
        RestrictedApis.parse(["inference:a=1", "inference,logging:b=2"], "flag")


def test_function_yaml_settings_are_checked_at_start(tmp_path):
    settings = parse_settings({"server": {"http_restricted_api": ["inference:k=v"]}}, tmp_path)
    assert settings.http_restricted_api == ("inference:k=v",)
    with pytest.raises(SettingsError, match="server.grpc_restricted_protocol 'bogus'"):
        parse_settings({"server": {"grpc_restricted_protocol": ["bogus"]}}, tmp_path)
    with pytest.raises(SettingsError, match="must be a list"):
        parse_settings({"server": {"http_restricted_api": "inference:k=v"}}, tmp_path)


@pytest.mark.parametrize(("path", "group"), [
    ("/v2", "metadata"), ("/v2/models/m", "metadata"), ("/v2/models/m/versions/2", "metadata"),
    ("/v2/health/live", "health"), ("/v2/models/m/ready", "health"), ("/v2/models/m/versions/1/ready", "health"),
    ("/v2/models/m/infer", "inference"), ("/v2/models/m/generate_stream", "inference"),
    ("/v2/models/m/config", "model-config"), ("/v2/repository/models/m/load", "model-repository"),
    ("/v2/models/stats", "statistics"), ("/v2/models/m/versions/1/stats", "statistics"),
    ("/v2/trace/setting", "trace"), ("/v2/models/m/trace/setting", "trace"), ("/v2/logging", "logging"),
    ("/v2/systemsharedmemory/region/r/register", "shared-memory"), ("/v2/cudasharedmemory/status", "shared-memory"),
    ("/v2/models", None), ("/v3", None), ("/", None), ("/v2/other", None), ("/metrics", None),
])
def test_each_rest_path_has_triton_group(path, group):
    assert http_api_group(path) == group


def test_every_grpc_method_has_a_group():
    methods = {m.name for m in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
    assert set(GROUP_BY_METHOD) == methods
    assert set(GROUP_BY_METHOD.values()) == set(API_GROUPS)
