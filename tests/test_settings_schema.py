"""The settings schema: function.yaml keys, flags, defaults and the README's table all come from one declaration."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bootstrap.cli import main_parser
from bootstrap.settings import (
    SETTINGS_CLASSES,
    FunctionSettings,
    SettingsError,
    apply_settings_flags,
    parse_settings,
    settings_readme_table,
)
from bootstrap.settings_schema import declared

ROOT = Path(__file__).resolve().parent.parent


def _run_args(*argv: str):
    return main_parser().parse_args(["run", *argv])


def test_the_readme_table_is_the_generated_one():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert settings_readme_table() in readme, "README's function.yaml table is stale: python -m bootstrap.settings"


def test_every_setting_has_a_row_and_every_key_is_read(tmp_path):
    table = settings_readme_table()
    for cls in SETTINGS_CLASSES:
        for _, schema in declared(cls):
            assert f"| `{schema.key}` |" in table
    # a value given for every key reaches its attribute (nothing declared is left unread)
    defaults = parse_settings({}, tmp_path)
    assert defaults.server_name == "triton" and defaults.storage.max_attempts == 5
    changed = parse_settings({"server": {"name": "other", "stream_max_in_flight": 3},
                              "storage": {"max_attempts": 2, "connect_timeout_seconds": 1}}, tmp_path)
    assert (changed.server_name, changed.stream_max_in_flight) == ("other", 3)
    assert (changed.storage.max_attempts, changed.storage.connect_timeout_seconds) == (2, 1.0)


@pytest.mark.parametrize("data, fragment", [
    ({"server": {"stream_max_in_flight": 0}}, "server.stream_max_in_flight must be a positive integer"),
    ({"storage": {"read_timeout_seconds": -1}}, "storage.read_timeout_seconds must be a positive number"),
    ({"server": {"bogus": 1}}, r"unknown keys in 'server': \['bogus'\]"),
    ({"storage": []}, "'storage' must be a mapping"),
    ({"cache": {"size_bytes": -1}}, "cache.size_bytes must be a whole number of bytes"),
    ({"auth": {"exempt_health": "yes"}}, "auth.exempt_health must be true or false"),
])
def test_a_bad_value_is_named_by_its_key(tmp_path, data, fragment):
    with pytest.raises(SettingsError, match=fragment):
        parse_settings(data, tmp_path)


def test_flags_override_the_file_and_are_checked_as_its_values_are(tmp_path):
    settings = parse_settings({"server": {"trace_config": ["rate=5"], "http_restricted_api": ["health:a=b"]},
                               "model_control": {"mode": "explicit", "load_models": ["a"]}}, tmp_path)
    apply_settings_flags(settings, _run_args("--http-port", "9100", "--no-grpc", "--trace-config", "level=TIMESTAMPS",
                                             "--http-restricted-api", "inference:c=d", "--load-model", "b",
                                             "--strict-readiness", "false", "--frontend-processes", "2",
                                             "--cache-config", "local,size=1024", "--shutdown-timeout", "7"))
    assert (settings.http_port, settings.grpc_port) == (9100, None)
    assert settings.trace_config == ("rate=5", "level=TIMESTAMPS")  # adds to the file's list
    assert settings.http_restricted_api == ("inference:c=d",)  # replaces it
    assert settings.load_models == ("b",)
    assert (settings.strict_readiness, settings.frontend_processes) == (False, 2)
    assert (settings.response_cache_bytes, settings.shutdown_timeout_seconds) == (1024, 7.0)
    for argv, fragment in [(["--shutdown-timeout", "0"], "--shutdown-timeout must be a positive number"),
                           (["--http-port", "70000"], "--http-port must be a port number"),
                           (["--model-load-thread-count", "0"], "--model-load-thread-count must be a positive"),
                           (["--load-model", "x"], "needs model control mode 'explicit'"),
                           (["--metrics-config", "summary_latencies=true"], "only histogram_latencies"),
                           (["--model-control-mode", "on_demand", "--keep-warm-seconds", "-1"],
                            "--keep-warm-seconds must be a non-negative number")]:
        with pytest.raises(SettingsError, match=fragment):
            apply_settings_flags(parse_settings({}, tmp_path), _run_args(*argv))


def test_a_true_or_false_flag_typed_alone_means_true(tmp_path):
    settings = parse_settings({}, tmp_path)
    apply_settings_flags(settings, _run_args("--single-port", "--strict-readiness", "--grpc-native-lanes", "false"))
    assert (settings.single_port, settings.strict_readiness, settings.grpc_native_lanes) == (True, True, False)
    apply_settings_flags(settings, _run_args("--single-port", "false", "--http-port", "9100"))
    assert (settings.single_port, settings.http_port) == (False, 9100)


@pytest.mark.parametrize("argv, fragment", [
    (["--poll-interval", "soon"], "argument --poll-interval: cannot be 'soon'"),
    (["--cache-config", "redis"], "argument --cache-config: --cache-config must be 'local,size=<bytes>'"),
    (["--strict-readiness", "maybe"], "argument --strict-readiness: cannot be 'maybe'"),
])
def test_a_flag_text_that_cannot_be_read_is_a_usage_error(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exited:
        _run_args(*argv)
    assert exited.value.code == 2
    assert fragment in capsys.readouterr().err


def test_every_default_is_declared_once():
    fields = {item.name for item in dataclasses.fields(FunctionSettings)}
    declared_names = {name for name, _ in declared(FunctionSettings)}
    assert fields - declared_names == {"storage", "base_dir"}  # a nested section and function.yaml's folder


def test_triton_s_newer_flags_set_their_settings(tmp_path):
    """--allow-client-shm (2.69) and --http-max-input-size (2.59), written as Triton's docs write them."""
    settings = parse_settings({}, tmp_path)
    assert (settings.allow_client_shm, settings.max_request_bytes) == (False, 64 << 20)  # Triton's defaults
    apply_settings_flags(settings, _run_args("--allow-client-shm=true", "--http-max-input-size=1048576"))
    assert (settings.allow_client_shm, settings.max_request_bytes) == (True, 1 << 20)


@pytest.mark.parametrize("command", ["run", "sync", "check"])
def test_a_command_parses_the_same_when_only_it_and_run_get_their_flags(command, capsys):
    """bootstrap builds the flags of the command given (and run's, whose defaults every command reads) only."""
    def usage(parser) -> str:
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        return capsys.readouterr().out

    every, given = main_parser(), main_parser({command, "run"})
    assert usage(given) == usage(every) and "--config" in usage(given)
    argv = [command, "--cache-dir", "/tmp/cache"]
    assert given.parse_args(argv) == every.parse_args(argv)
    if command != "run":  # the other commands' flags are left out
        assert "--cache-dir CACHE_DIR" in usage(every) and "--cache-dir CACHE_DIR" not in usage(main_parser({"run"}))
