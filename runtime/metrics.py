"""Prometheus text exposition of per-model metrics, with Triton's metric names where one exists.

Everything is read from each version's :class:`ModelStatistics` at scrape time: one source of
truth for ``/metrics``, the statistics extension and gRPC ModelStatistics.
"""

from __future__ import annotations

from collections.abc import Iterable

from runtime.manager import ModelManager
from runtime.model import ModelVersion

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

# (name, type, help, how to read it from (version, stats dict))
_METRICS = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests",
     lambda m, s: s["inference_stats"]["success"]["count"]),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests",
     lambda m, s: s["inference_stats"]["fail"]["count"]),
    ("nv_inference_count", "counter", "Number of inferences performed (a batch of n counts n)",
     lambda m, s: s["inference_count"]),
    ("nv_inference_exec_count", "counter", "Number of model executions performed",
     lambda m, s: s["execution_count"]),
    ("nv_inference_request_duration_us", "counter", "Cumulative end-to-end duration of successful requests",
     lambda m, s: s["inference_stats"]["success"]["ns"] // 1000),
    ("nv_inference_queue_duration_us", "counter", "Cumulative time requests spent queued",
     lambda m, s: s["inference_stats"]["queue"]["ns"] // 1000),
    ("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration",
     lambda m, s: s["inference_stats"]["compute_input"]["ns"] // 1000),
    ("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration",
     lambda m, s: s["inference_stats"]["compute_infer"]["ns"] // 1000),
    ("nv_inference_compute_output_duration_us", "counter", "Cumulative compute output duration",
     lambda m, s: s["inference_stats"]["compute_output"]["ns"] // 1000),
    ("nv_inference_pending_request_count", "gauge", "Requests queued, waiting for an instance",
     lambda m, s: m.pending),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(model: ModelVersion, extra: str = "") -> str:
    base = f'model="{_escape(model.name)}",version="{model.version}"'
    return "{" + base + (f",{extra}" if extra else "") + "}"


def _le(bound: object) -> str:
    return f'le="{bound}"'


def _ready_versions(manager: ModelManager) -> Iterable[ModelVersion]:
    for name in sorted(manager.models):
        for _, model in sorted(manager.models[name].versions.items()):
            if model.in_service:
                yield model


def render_metrics(manager: ModelManager) -> str:
    """The Prometheus text format (version 0.0.4) for every ready model version."""
    models = [(m, m.stats.to_dict(m.name, m.version)) for m in _ready_versions(manager)]
    lines: list[str] = []
    for name, kind, help_text, read in _METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{_labels(m)} {read(m, s)}" for m, s in models]
    name = "serverless_triton_batch_size"
    lines += [f"# HELP {name} Batch size of each model execution", f"# TYPE {name} histogram"]
    for model, stats in models:
        counts = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
        for bound in BATCH_BUCKETS:
            cumulative = sum(c for size, c in counts.items() if size <= bound)
            lines.append(f"{name}_bucket{_labels(model, _le(bound))} {cumulative}")
        total = sum(counts.values())
        lines.append(f"{name}_bucket{_labels(model, _le('+Inf'))} {total}")
        lines.append(f"{name}_sum{_labels(model)} {sum(size * c for size, c in counts.items())}")
        lines.append(f"{name}_count{_labels(model)} {total}")
    return "\n".join(lines) + "\n"
