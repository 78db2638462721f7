"""Custom metrics that Python models define (``pb_utils.MetricFamily`` / ``Metric``), exported on ``/metrics``.

Families are counters, gauges or histograms; each labelled series is created by the model, then
incremented, set or observed.  They are written as Triton writes them (a counter keeps its own name,
with no ``_total``), beside the server's own families.  A model cannot take a name the server uses
(``nv_*``) nor grow the registry without bound.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.errors import InvalidArgument

if TYPE_CHECKING:
    from prometheus_client.core import Metric

KINDS = {"COUNTER": "counter", "GAUGE": "gauge", "HISTOGRAM": "histogram"}
MAX_SERIES = 10_000
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
RESERVED_PREFIXES = ("nv_", "serverless_triton_")


@dataclass
class _Series:
    value: float = 0.0
    buckets: tuple[float, ...] = ()
    counts: list[int] = field(default_factory=list)  # per bucket (not cumulative), then +Inf
    total: float = 0.0
    count: int = 0


@dataclass
class _Family:
    name: str
    description: str
    kind: str  # COUNTER, GAUGE, HISTOGRAM
    series: dict[tuple[tuple[str, str], ...], _Series] = field(default_factory=dict)
    owners: set[str] = field(default_factory=set)  # the models that created it: it goes when they all unload


def _labels_key(labels: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(labels, dict):
        raise InvalidArgument("metric labels must be a dict of strings")
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL.fullmatch(key) or not isinstance(value, str):
            raise InvalidArgument(f"metric label {key!r}: names must match [a-zA-Z_][a-zA-Z0-9_]* and values "
                                  "must be strings")
    return tuple(sorted(labels.items()))


def _bound(bound: float) -> str:
    if bound == math.inf:
        return "+Inf"
    return str(int(bound)) if bound.is_integer() else repr(bound)


class CustomMetrics:
    """Every custom metric family of the server (thread-safe: models call in from any thread)."""

    def __init__(self, max_series: int = MAX_SERIES) -> None:
        self.max_series = max_series
        self._families: dict[str, _Family] = {}
        self._lock = threading.Lock()

    def call(self, model: str, operation: str, *arguments: Any) -> Any:
        """One operation as pb_utils sends it: family, series, increment, set, observe, value."""
        operations: dict[str, Callable[..., Any]] = {
            "family": self._family, "series": self._series, "increment": self._increment, "set": self._set,
            "observe": self._observe, "value": self._value}
        handler = operations.get(operation)
        if handler is None:
            raise InvalidArgument(f"unknown metric operation '{operation}'")
        with self._lock:
            if operation == "family":  # the owner is the calling model, never its say
                if len(arguments) != 3:
                    raise InvalidArgument("a metric family takes a name, a description and a kind")
                name, description, kind = arguments
                return self._family(name, description, kind, owner=model)
            return handler(*arguments)

    def forget_model(self, model: str) -> None:
        """A model unloaded: the families only it created go with it (as in Triton, where they die with it)."""
        with self._lock:
            for name, family in list(self._families.items()):
                family.owners.discard(model)
                if not family.owners:
                    del self._families[name]

    def _family(self, name: str, description: str, kind: str, owner: str = "") -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith(RESERVED_PREFIXES):
            raise InvalidArgument(f"metric family name {name!r} is not a valid Prometheus name, or is reserved for "
                                  "the server's own metrics")
        if kind not in KINDS:
            raise InvalidArgument(f"metric family kind must be one of {', '.join(KINDS)}")
        existing = self._families.get(name)
        if existing is not None:
            if existing.kind != kind:
                raise InvalidArgument(f"metric family '{name}' already exists as a {existing.kind.lower()}")
            existing.owners.add(owner)
            return
        self._families[name] = _Family(name, str(description), kind, owners={owner})

    def _get(self, name: str) -> _Family:
        family = self._families.get(name)
        if family is None:
            raise InvalidArgument(f"no metric family named '{name}'")
        return family

    def _series(self, name: str, labels: dict, buckets: list[float] | None) -> None:
        family = self._get(name)
        key = _labels_key(labels)
        if key in family.series:
            return
        if sum(len(f.series) for f in self._families.values()) >= self.max_series:
            raise InvalidArgument(f"too many custom metric series (at most {self.max_series})")
        series = _Series()
        if family.kind == "HISTOGRAM":
            bounds = sorted(float(b) for b in buckets or ())
            if not bounds or any(math.isnan(b) for b in bounds):
                raise InvalidArgument("a histogram metric needs bucket boundaries")
            series.buckets, series.counts = tuple(bounds), [0] * (len(bounds) + 1)
        family.series[key] = series

    def _one(self, name: str, labels: dict) -> tuple[_Family, _Series]:
        family = self._get(name)
        series = family.series.get(_labels_key(labels))
        if series is None:
            raise InvalidArgument(f"metric family '{name}' has no series with labels {labels}")
        return family, series

    def _increment(self, name: str, labels: dict, value: float) -> None:
        family, series = self._one(name, labels)
        if family.kind == "HISTOGRAM" or (family.kind == "COUNTER" and value < 0):
            raise InvalidArgument(f"cannot increment {family.kind.lower()} '{name}' by {value}")
        series.value += float(value)

    def _set(self, name: str, labels: dict, value: float) -> None:
        family, series = self._one(name, labels)
        if family.kind != "GAUGE":
            raise InvalidArgument(f"only gauges can be set, '{name}' is a {family.kind.lower()}")
        series.value = float(value)

    def _observe(self, name: str, labels: dict, value: float) -> None:
        family, series = self._one(name, labels)
        if family.kind != "HISTOGRAM":
            raise InvalidArgument(f"only histograms observe values, '{name}' is a {family.kind.lower()}")
        index = next((i for i, bound in enumerate(series.buckets) if value <= bound), len(series.buckets))
        series.counts[index] += 1
        series.total += float(value)
        series.count += 1

    def _value(self, name: str, labels: dict) -> float:
        family, series = self._one(name, labels)
        if family.kind == "HISTOGRAM":
            raise InvalidArgument("value() is not supported for histograms")
        return series.value

    def collect(self) -> Iterator[Metric]:
        """The families as prometheus_client Metrics (a registry collector)."""
        from prometheus_client.core import Metric

        with self._lock:
            families = [(f.name, f.description, f.kind, list(f.series.items())) for f in self._families.values()]
        for name, description, kind, series in sorted(families):
            metric = Metric(name, description, KINDS[kind])
            for key, state in series:
                labels = dict(key)
                if kind != "HISTOGRAM":
                    metric.add_sample(name, labels, state.value)
                    continue
                metric.add_sample(f"{name}_count", labels, state.count)  # in prometheus-cpp's order, as Triton
                metric.add_sample(f"{name}_sum", labels, state.total)
                cumulative = 0
                for bound, count in zip((*state.buckets, math.inf), state.counts, strict=True):
                    cumulative += count
                    metric.add_sample(f"{name}_bucket", labels | {"le": _bound(bound)}, cumulative)
            yield metric
