"""Triton's logging extension: the server's log settings, read and changed at run time
(``GET/POST /v2/logging``, gRPC ``LogSettings``), with Triton's keys and words.

``log_info``, ``log_warning`` and ``log_error`` switch those levels on or off; ``log_verbose_level`` > 0 lets
verbose (debug) records through, models' ``log_verbose`` included; ``log_format`` is ``default`` or
``ISO8601`` (timestamps).  ``log_file`` cannot be changed over the network, as in Triton.  Changes take effect
at once, through a filter and a formatter on the root logger's handlers.

Verbose means the server's own loggers (``OWN_LOGGERS``): third-party libraries keep their level, since some log
every header they decode at debug level (hpack: the ``Authorization`` header among them).  Whatever the level, no
secret reaches the log: :class:`SecretRedaction` on the root's handlers replaces credentials in every record.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import asdict, dataclass
from typing import Any

from runtime.errors import InvalidArgument, Unsupported

OWN_LOGGERS = ("runtime", "handlers", "bootstrap", "model")  # "model": what Python models log (pb_utils.Logger)
# Libraries whose debug records carry request headers, never let below INFO (the redaction would still hide the
# credentials; this keeps a debug log from holding every header of every request)
HEADER_LOGGERS = ("hpack", "h2")
FORMATS = {"default": "%(asctime)s %(levelname)s %(name)s: %(message)s",
           "ISO8601": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
_DATE_FORMATS = {"default": None, "ISO8601": "%Y-%m-%dT%H:%M:%S"}
_BOOLEANS = ("log_info", "log_warning", "log_error")


@dataclass
class LogSettings:
    """Triton's log settings (the order of the fields is the order Triton answers them in)."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"


class ServerLog:
    """The log settings in force, and the filter that applies them to every record."""

    def __init__(self, root: logging.Logger | None = None) -> None:
        self._root = root or logging.getLogger()
        # a server started at debug level (--log-level DEBUG) logs verbose records until told otherwise
        self.settings = LogSettings(log_verbose_level=1 if self._root.getEffectiveLevel() <= logging.DEBUG else 0)
        self._lock = threading.Lock()
        self._filter = _SettingsFilter(self)
        for handler in self._root.handlers:
            handler.addFilter(self._filter)

    def current(self) -> dict[str, Any]:
        return asdict(self.settings)

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply the known keys of ``changes`` (others are ignored, as by Triton); the settings now in force.
        Values are checked first, so a bad request changes nothing."""
        if "log_file" in changes:
            raise Unsupported("log file location can not be updated through network protocol")
        checked = dict(changes)
        for key in _BOOLEANS:
            if key in checked and not isinstance(checked[key], bool):
                raise InvalidArgument("attempt to access JSON non-boolean as boolean")
        level = checked.get("log_verbose_level", 0)
        if not isinstance(level, int) or isinstance(level, bool) or level < 0:
            raise InvalidArgument("attempt to access JSON non-unsigned-integer as unsigned-integer")
        if "log_format" in checked and checked["log_format"] not in FORMATS:
            raise InvalidArgument(f"invalid argument for --log_format, got: {str(checked['log_format'])[:64]}")
        with self._lock:
            for key in (*_BOOLEANS, "log_verbose_level", "log_format"):
                if key in checked:
                    setattr(self.settings, key, checked[key])
            self._apply()
        return self.current()

    def allows(self, record: logging.LogRecord) -> bool:
        settings = self.settings
        if record.levelno >= logging.ERROR:
            return settings.log_error
        if record.levelno >= logging.WARNING:
            return settings.log_warning
        if record.levelno >= logging.INFO:
            return settings.log_info
        return settings.log_verbose_level > 0

    def _apply(self) -> None:
        if self.settings.log_verbose_level > 0:
            for name in OWN_LOGGERS:
                if logging.getLogger(name).getEffectiveLevel() > logging.DEBUG:
                    logging.getLogger(name).setLevel(logging.DEBUG)
        formatter = logging.Formatter(FORMATS[self.settings.log_format], _DATE_FORMATS[self.settings.log_format])
        for handler in self._root.handlers:
            handler.setFormatter(formatter)
            if self._filter not in handler.filters:
                handler.addFilter(self._filter)


class _SettingsFilter(logging.Filter):
    def __init__(self, log: ServerLog) -> None:
        super().__init__()
        self.log = log

    def filter(self, record: logging.LogRecord) -> bool:
        return self.log.allows(record)


class SecretRedaction(logging.Filter):
    """Credentials never reach the log: an ``Authorization`` value (Bearer or Basic, in any record: a header a
    library logs, an error that quotes one) and each secret the server holds (its token, storage keys) are replaced
    in the record's message and its traceback before any handler writes it."""

    _CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)(\s+|%20|\+)[A-Za-z0-9._~+/=\-]+")
    REDACTED = "[redacted]"

    def __init__(self, secrets: list[str] | None = None) -> None:
        super().__init__()
        self.secrets = [secret for secret in secrets or () if len(secret) >= 4]

    def clean(self, text: str) -> str:
        text = self._CREDENTIAL.sub(lambda found: f"{found.group(1)} {self.REDACTED}", text)
        for secret in self.secrets:
            text = text.replace(secret, self.REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record whose arguments do not format: logging reports it itself
            return True
        cleaned = self.clean(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.clean(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = self.clean(record.exc_text)
        return True


# The environment's object-storage credentials (the AWS chain's, OSS's): kept out of the log whatever quotes them.
STORAGE_SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "OSS_ACCESS_KEY_SECRET",
                            "ALIBABA_CLOUD_ACCESS_KEY_SECRET", "OSS_SESSION_TOKEN")


def storage_secrets() -> list[str]:
    return [os.environ[name] for name in STORAGE_SECRET_VARIABLES if os.environ.get(name)]


def redact_secrets(secrets: list[str], root: logging.Logger | None = None) -> SecretRedaction:
    """Put a :class:`SecretRedaction` of ``secrets`` on every handler of the root logger (the process's log), and
    hold the loggers that dump headers at INFO or above."""
    root = root or logging.getLogger()
    redaction = SecretRedaction(secrets)
    for handler in root.handlers:
        for old in [f for f in handler.filters if isinstance(f, SecretRedaction)]:
            handler.removeFilter(old)
        handler.addFilter(redaction)
    for name in HEADER_LOGGERS:
        if logging.getLogger(name).getEffectiveLevel() < logging.INFO:
            logging.getLogger(name).setLevel(logging.INFO)
    return redaction
