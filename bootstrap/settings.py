"""``function.yaml``: the function's settings, validated with clear errors."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

AUTH_TOKEN_ENV = "FUNCTION_AUTH_TOKEN"


class SettingsError(ValueError):
    """function.yaml is missing, malformed or holds an invalid value."""


@dataclass
class FunctionSettings:
    name: str = "triton-function"
    model_repository: str = "examples/model_repository"
    host: str = "0.0.0.0"
    http_port: int | None = 8000
    grpc_port: int | None = 8001
    device: str = "auto"  # auto | gpu | cpu
    max_request_bytes: int = 64 * 1024 * 1024
    grpc_max_message_bytes: int = 128 * 1024 * 1024
    auth_token: str | None = field(default=None, repr=False)
    auth_exempt_health: bool = True
    shutdown_timeout_seconds: float = 30.0
    base_dir: Path = Path(".")

    @property
    def use_gpu(self) -> bool:
        return self.device != "cpu"

    def repository_path(self) -> Path:
        path = Path(self.model_repository).expanduser()
        return path if path.is_absolute() else (self.base_dir / path)


def _port(value: Any, key: str) -> int | None:
    if value is None or value is False:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
        raise SettingsError(f"{key} must be a port number (0-65535) or null to disable, got {value!r}")
    return value


def _positive_int(section: dict, key: str, default: int) -> int:
    value = section.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SettingsError(f"server.{key} must be a positive integer")
    return value


def _section(data: dict, key: str) -> dict:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise SettingsError(f"'{key}' must be a mapping")
    return value


def parse_settings(data: Any, base_dir: Path) -> FunctionSettings:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SettingsError("function.yaml must be a mapping at the top level")
    known = {"name", "model_repository", "server", "instance", "auth", "shutdown_timeout_seconds"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SettingsError(f"unknown function.yaml keys: {unknown}")
    server = _section(data, "server")
    instance = _section(data, "instance")
    auth = _section(data, "auth")
    settings = FunctionSettings(base_dir=base_dir)
    settings.name = str(data.get("name", settings.name))
    repository = data.get("model_repository", settings.model_repository)
    if not isinstance(repository, str) or not repository:
        raise SettingsError("model_repository must be a path or an s3:// / oss:// URL")
    settings.model_repository = repository
    settings.host = str(server.get("host", settings.host))
    settings.http_port = _port(server.get("http_port", settings.http_port), "server.http_port")
    settings.grpc_port = _port(server.get("grpc_port", settings.grpc_port), "server.grpc_port")
    settings.max_request_bytes = _positive_int(server, "max_request_bytes", settings.max_request_bytes)
    settings.grpc_max_message_bytes = _positive_int(server, "grpc_max_message_bytes", settings.grpc_max_message_bytes)
    token = auth.get("token")
    token_env = auth.get("token_env", AUTH_TOKEN_ENV)
    if token is not None and (not isinstance(token, str) or not token):
        raise SettingsError("auth.token must be a non-empty string")
    if not isinstance(token_env, str):
        raise SettingsError("auth.token_env must be the name of an environment variable")
    settings.auth_token = os.environ.get(token_env) or token
    exempt = auth.get("exempt_health", True)
    if not isinstance(exempt, bool):
        raise SettingsError("auth.exempt_health must be true or false")
    settings.auth_exempt_health = exempt
    device = instance.get("device", settings.device)
    if device not in ("auto", "gpu", "cpu"):
        raise SettingsError(f"instance.device must be auto, gpu or cpu, got {device!r}")
    settings.device = device
    timeout = data.get("shutdown_timeout_seconds", settings.shutdown_timeout_seconds)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0:
        raise SettingsError("shutdown_timeout_seconds must be a non-negative number")
    settings.shutdown_timeout_seconds = float(timeout)
    return settings


def load_settings(path: Path | None) -> FunctionSettings:
    """Read ``path`` (or return defaults when it is None)."""
    if path is None:
        return parse_settings({}, Path.cwd())
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path} is not valid YAML: {exc}") from None
    return parse_settings(data, path.resolve().parent)
