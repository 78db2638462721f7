"""Triton's trace extension: its settings (global and per model) and the traces of sampled requests.

Checked against Triton 2.51.  Settings read as Triton prints them (every value a string, the level a list);
an update takes a value (a string, or a list for ``trace_level``) or ``None`` to clear it: a model's setting
then follows the global one again, a global one returns to its value at start.  ``trace_file`` and ``trace_mode``
are set only at start (``--trace-config``).  A request is sampled every ``trace_rate``-th one of its model while
the level is not OFF and ``trace_count`` (-1: no limit) is not spent.

Mode ``triton`` writes Triton's JSON trace file: an array of records, one naming the request (id, model, version,
request id; ``parent_id`` for an ensemble's steps) and one per timestamp (``{"id", "timestamps": [{"name",
"ns"}]}``, monotonic nanoseconds).  With ``log_frequency`` N > 0, every N traces go to ``<file>.<k>``; with 0, all
go to ``<file>`` at shutdown (past ``MAX_BUFFERED_TRACES`` they are written out early, to ``<file>.<k>``).  Mode
``opentelemetry`` hands each finished trace to an exporter (``runtime.extensions.otel_export``).
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from runtime.errors import InvalidArgument, Unsupported

logger = logging.getLogger(__name__)

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
MAX_BUFFERED_TRACES = 10_000
_KEYS = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
# the settings the extension may change: key -> TraceSettings field
_FIELD_OF = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


_OFF = ("OFF",)


@dataclass(frozen=True)
class TraceSettings:
    level: tuple[str, ...] = _OFF
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    otel_url: str = "http://localhost:4318/v1/traces"
    otel_resource: tuple[tuple[str, str], ...] = ()

    @property
    def on(self) -> bool:
        return self.level != _OFF and any(level != "OFF" for level in self.level)  # asked on every request

    def as_json(self) -> dict[str, Any]:
        """As Triton's trace setting endpoints print them."""
        return {"trace_level": list(self.level), "trace_rate": str(self.rate), "trace_count": str(self.count),
                "log_frequency": str(self.log_frequency), "trace_file": self.file, "trace_mode": self.mode}


def parse_trace_config(specs: Iterable[str]) -> TraceSettings:
    """Triton's ``--trace-config`` values: ``rate=N``, ``level=L`` (repeatable), ``count=N``, ``mode=M``,
    ``triton,file=PATH``, ``triton,log-frequency=N``, ``opentelemetry,url=URL``, ``opentelemetry,resource=K=V``;
    ValueError naming what is wrong."""
    settings = TraceSettings()
    levels: list[str] = []
    resources: list[tuple[str, str]] = []
    for spec in specs:
        scope, _, setting = spec.partition(",") if "," in spec else ("", "", spec)
        key, equals, value = setting.partition("=")
        if not equals:
            raise ValueError(f"--trace-config '{spec}': expected [<mode>,]<setting>=<value>")
        try:
            if scope == "" and key == "level":
                if value not in LEVELS:
                    raise ValueError(f"level must be one of {', '.join(LEVELS)}")
                levels.append(value)
            elif scope == "" and key in ("rate", "count"):  # rate 0: only requests that carry a trace context
                number = _integer(key, value, 0 if key == "rate" else -1)
                settings = replace(settings, rate=number) if key == "rate" else replace(settings, count=number)
            elif scope == "" and key == "mode":
                if value not in MODES:
                    raise ValueError(f"mode must be one of {', '.join(MODES)}")
                settings = replace(settings, mode=value)
            elif scope == "triton" and key == "file":
                settings = replace(settings, file=value)
            elif scope == "triton" and key == "log-frequency":
                settings = replace(settings, log_frequency=_integer(key, value, 0))
            elif scope == "opentelemetry" and key == "url":
                settings = replace(settings, otel_url=value)
            elif scope == "opentelemetry" and key == "resource":
                name, _, resource_value = value.partition("=")
                resources.append((name, resource_value))
            else:
                raise ValueError("unknown setting")
        except ValueError as exc:
            raise ValueError(f"--trace-config '{spec}': {exc}") from None
    if levels:
        settings = replace(settings, level=tuple(dict.fromkeys(levels)))
    return replace(settings, otel_resource=tuple(resources))


def _integer(key: str, text: str, minimum: int) -> int:
    if not text.lstrip("-").isdigit() or int(text) < minimum:
        raise ValueError(f"{key} must be a whole number >= {minimum}")
    return int(text)


class Trace:
    """One sampled request's timestamps (and its place among an ensemble's steps)."""

    def __init__(self, trace_id: int, model: str, parent: Trace | None, tracer: Tracer) -> None:
        self.id = trace_id
        self.model = model
        self.version = 0
        self.request_id = ""
        self.parent = parent
        self.parent_id = parent.id if parent is not None else None
        self.children: list[Trace] = []  # an ensemble's steps, once they finished
        self.events: list[tuple[str, int]] = []
        self.context: str | None = None  # a W3C traceparent the client sent (opentelemetry mode)
        self.tracer = tracer

    def event(self, name: str, ns: int | None = None) -> None:
        self.events.append((name, time.perf_counter_ns() if ns is None else ns))

    def child(self, model: str) -> Trace | None:
        """The trace of an ensemble step (or None once tracing has stopped)."""
        return self.tracer.start(model, parent=self)

    def records(self) -> list[dict[str, Any]]:
        """Triton's trace-file records of this trace."""
        info: dict[str, Any] = {"id": self.id, "model_name": self.model, "model_version": self.version,
                                "request_id": self.request_id}
        if self.parent_id is not None:
            info["parent_id"] = self.parent_id
        return [info, *({"id": self.id, "timestamps": [{"name": name, "ns": ns}]} for name, ns in self.events)]


@dataclass
class _ModelOverrides:
    values: dict[str, Any] = field(default_factory=dict)
    seen: int = 0  # requests of the model counted towards its sampling rate


class Tracer:
    """The trace settings in force, sampling, and where finished traces go."""

    def __init__(self, startup: TraceSettings | None = None, model_known: Callable[[str], bool] | None = None,
                 export: TraceExport | None = None) -> None:
        self.startup = startup or TraceSettings()
        self.current = self.startup
        self.model_known = model_known or (lambda name: True)
        self.export = export  # opentelemetry mode: where finished traces go (else the trace file)
        self._models: dict[str, _ModelOverrides] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._buffered: list[Trace] = []
        self._files_written = 0
        self.idle = True  # no request can be sampled (tracing off, no model's own settings): asked per request
        self._refresh_idle()

    # -- settings --------------------------------------------------------------------------------------
    def settings(self, model: str = "") -> dict[str, Any]:
        return self._effective(model).as_json()

    def _effective(self, model: str) -> TraceSettings:
        if model and not self.model_known(model):
            raise InvalidArgument(f"Request for unknown model : {model}")
        overrides = self._models.get(model) if model else None
        return replace(self.current, **overrides.values) if overrides else self.current

    def update(self, changes: dict[str, Any], model: str = "") -> dict[str, Any]:
        """Apply ``changes`` (key -> string, list of level names, or None to clear) in Triton's order of checks;
        returns the settings then in force for ``model`` (or globally)."""
        effective = self._effective(model)
        if "trace_file" in changes and changes["trace_file"] is not None:
            raise Unsupported("trace file location can not be updated through network protocol")
        parsed: dict[str, Any] = {}
        cleared: list[str] = []
        for key, value in changes.items():
            if key not in _KEYS or key in ("trace_file", "trace_mode"):
                continue  # Triton ignores unknown keys, and the mode is set at start
            if value is None:
                cleared.append(key)
            elif key == "trace_level":
                if not isinstance(value, list):
                    raise InvalidArgument("attempt to access JSON non-array as array")
                levels = tuple(dict.fromkeys(level for level in value if level in LEVELS))
                if levels:
                    parsed["level"] = ("OFF",) if "OFF" in levels else levels
            else:
                parsed.update(_parse_number(key, value))
        candidate = replace(effective, **parsed)
        if candidate.on and candidate.mode == "triton":  # checked only once tracing would be on, as in Triton
            if candidate.rate == 0:
                raise InvalidArgument("Attempting to set invalid trace setting :sample rate must be non-zero")
            if not candidate.file:
                raise InvalidArgument("Attempting to set invalid trace setting :trace file name is not given")
        with self._lock:
            if model:
                overrides = self._models.setdefault(model, _ModelOverrides())
                overrides.values.update(parsed)
                for key in cleared:
                    overrides.values.pop(_FIELD_OF[key], None)
            else:
                restored = {_FIELD_OF[key]: getattr(self.startup, _FIELD_OF[key]) for key in cleared}
                self.current = replace(self.current, **parsed, **restored)
            self._refresh_idle()
        return self.settings(model)

    def _refresh_idle(self) -> None:
        self.idle = not self.current.on and not any(overrides.values for overrides in self._models.values())

    # -- sampling ----------------------------------------------------------------------------------------
    def start(self, model: str, parent: Trace | None = None, context: str | None = None) -> Trace | None:
        """A trace for this request of ``model`` if it is sampled (an ensemble step: whenever its parent was; in
        opentelemetry mode, a request carrying the client's trace ``context``: always, as in Triton)."""
        overrides = self._models.get(model)
        values = overrides.values if overrides is not None else None
        if not values and not self.current.on:  # tracing off: the path every request takes
            return None
        settings = replace(self.current, **values) if values else self.current
        if not settings.on:
            return None
        propagated = context is not None and settings.mode == "opentelemetry"
        with self._lock:
            if parent is None and not propagated:
                holder = overrides or self._models.setdefault(model, _ModelOverrides())
                holder.seen += 1
                if not settings.rate or holder.seen % settings.rate:  # rate 0 (opentelemetry): propagated only
                    return None
                if settings.count == 0:
                    return None
                if settings.count > 0:
                    self._spend_one(model, settings.count)
            trace = Trace(next(self._ids), model, parent, self)
        trace.context = parent.context if parent is not None else context
        return trace

    def _spend_one(self, model: str, count: int) -> None:
        overrides = self._models.get(model)
        if overrides is not None and "count" in overrides.values:
            overrides.values["count"] = count - 1
        else:
            self.current = replace(self.current, count=count - 1)

    def finish(self, trace: Trace) -> None:
        """A trace whose request has ended: to the exporter, or the trace file as ``log_frequency`` says."""
        if self.export is not None:  # spans nest: a step goes with its ensemble's trace
            if trace.parent is not None:
                trace.parent.children.append(trace)
            else:
                self.export([trace])
            return
        with self._lock:
            self._buffered.append(trace)
            frequency = self.current.log_frequency
            if (frequency and len(self._buffered) >= frequency) or len(self._buffered) >= MAX_BUFFERED_TRACES:
                batch, self._buffered = self._buffered, []
                path = f"{self.current.file}.{self._files_written}"
                self._files_written += 1
            else:
                return
        self._write(path, batch)

    def close(self) -> None:
        """At shutdown: traces not yet written go to the trace file itself (or the exporter is flushed)."""
        if self.export is not None:
            self.export.close()
            return
        with self._lock:
            batch, self._buffered = self._buffered, []
        if batch and self.current.file:
            self._write(self.current.file, batch)

    @staticmethod
    def _write(path: str, traces: list[Trace]) -> None:
        records = [record for trace in traces for record in trace.records()]
        try:
            with open(path, "w", encoding="utf-8") as stream:
                json.dump(records, stream, separators=(",", ":"))
        except OSError as exc:
            logger.error("cannot write the trace file %s: %s", path, exc)


class TraceExport(Protocol):
    """Where an opentelemetry-mode tracer sends finished traces."""

    def __call__(self, traces: list[Trace]) -> None: ...
    def close(self) -> None: ...


def trace_exporter(settings: TraceSettings) -> TraceExport | None:
    """The exporter ``settings`` ask for: none in mode ``triton`` (the trace file), OTLP/HTTP in ``opentelemetry``."""
    if settings.mode != "opentelemetry":
        return None
    from runtime.extensions.otel_export import OtlpExport  # opentelemetry-sdk loads only when it is used

    return OtlpExport(settings)


def _parse_number(key: str, value: Any) -> dict[str, int]:
    if not isinstance(value, str):
        raise InvalidArgument("attempt to access JSON non-string as string")
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgument(f"Unable to parse '{key}', got: {value}") from None
    if key == "trace_count" and number < -1:
        raise InvalidArgument(f"Unable to parse 'trace_count'. Expecting value >= -1, got:{value}")
    if key != "trace_count" and number < 0:
        raise InvalidArgument(f"Unable to parse '{key}', got: {value}")
    return {_FIELD_OF[key]: number}
