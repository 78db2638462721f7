"""bootstrap/hand_off.py: the runtime's option records are built from the settings declared into their fields.
Every declared target exists, every field of every record is either declared into by a setting, given by the
composition root (bootstrap/cli.py), or kept at its default on purpose, and a setting's value arrives where it is
declared to go."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bootstrap.hand_off import RECORDS, hand_off, handed_into
from bootstrap.settings import FunctionSettings, parse_settings
from bootstrap.settings_schema import declared
from runtime.adapter_settings import AdapterSettings
from runtime.grpc.limits import GrpcLimits
from runtime.http.limits import HttpLimits
from runtime.models.on_demand import OnDemandSettings
from runtime.server import ServerOptions

CLASSES = {"server": ServerOptions, "adapters": AdapterSettings, "http": HttpLimits, "grpc": GrpcLimits,
           "on_demand": OnDemandSettings}
# what bootstrap/cli.py gives, made from several settings or from elsewhere
GIVEN = {
    "server": {"model_repository", "source", "on_demand", "adapters", "metrics_histograms", "use_gpu", "trace",
               "rate_limit_resources", "handlers", "completer", "environments_dir"},
    "adapters": {"grpc_port", "single_port", "openai", "http_limits", "grpc_limits", "http_restrictions",
                 "grpc_restrictions"},
    "http": set(), "grpc": set(), "on_demand": set(),
}
# no setting: the record's default is what the server uses
KEPT = {"http": {"ping_interval", "backlog"}, "grpc": {"ping_interval"}}


def test_every_target_exists_and_every_field_is_accounted_for():
    assert set(CLASSES) == set(RECORDS)
    declared_into: dict[str, set[str]] = {record: set() for record in RECORDS}
    for name, setting in declared(FunctionSettings):
        for target in setting.into:
            record, _, field_name = target.partition(".")
            assert record in CLASSES, f"{name}: no record {record!r}"
            assert field_name in {f.name for f in dataclasses.fields(CLASSES[record])}, f"{name}: {target}"
            declared_into[record].add(field_name)
    for record, cls in CLASSES.items():
        fields = {f.name for f in dataclasses.fields(cls)}
        assert not declared_into[record] & GIVEN[record], record
        assert fields == declared_into[record] | GIVEN[record] | KEPT.get(record, set()), record


def test_a_settings_value_arrives_where_it_is_declared_to_go():
    settings = parse_settings({"server": {"header_timeout_seconds": 7.5, "max_connections": 99,
                                          "grpc_max_streams": 12}, "shutdown_timeout_seconds": 4.0,
                               "model_control": {"mode": "on_demand", "keep_warm_seconds": 60}}, Path("."))
    http, grpc = hand_off(settings, "http", HttpLimits), hand_off(settings, "grpc", GrpcLimits)
    assert (http.header_timeout, http.max_connections) == (7.5, 99)
    assert (grpc.handshake_timeout, grpc.max_streams) == (7.5, 12)  # one setting, two fields
    assert hand_off(settings, "on_demand", OnDemandSettings).keep_warm == 60
    server = handed_into(settings, "server")
    assert (server["shutdown_timeout"], server["model_control"]) == (4.0, "on_demand")


def test_a_field_both_declared_into_and_given_is_refused():
    settings = parse_settings({}, Path("."))
    with pytest.raises(ValueError, match="max_connections"):
        hand_off(settings, "http", HttpLimits, max_connections=1)
