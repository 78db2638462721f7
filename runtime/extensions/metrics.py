"""Prometheus metrics with Triton's families, names, help texts and labels (prometheus_client).

A collector reads each model version's :class:`ModelStatistics` at scrape time: one source of truth for
``/metrics``, the statistics extension and gRPC ModelStatistics.  The families are prometheus_client
Metrics; they are written out as Triton's prometheus-cpp writes them (a counter family keeps its own
name, where prometheus_client's writer would rename it ``<name>_total`` but not its samples), so
dashboards and alerts written for Triton work unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import psutil
from prometheus_client.core import CollectorRegistry, Metric

from runtime.devices import gpu_count
from runtime.extensions.response_cache import ResponseCache
from runtime.models.manager import ModelManager
from runtime.models.memory_ledger import gpu_resource
from runtime.models.model import ModelVersion
from runtime.models.on_demand import OnDemandLoader

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (name, type, help, how to read it from (version, statistics dict)); help texts are Triton's.
_MODEL_METRICS: tuple[tuple[str, str, str, Callable[[ModelVersion, dict], float]], ...] = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
     lambda m, s: s["inference_stats"]["success"]["count"]),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)",
     lambda m, s: s["inference_count"]),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)",
     lambda m, s: s["execution_count"]),
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda m, s: s["inference_stats"]["success"]["ns"] // 1000),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda m, s: s["inference_stats"]["queue"]["ns"] // 1000),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda m, s: s["inference_stats"]["compute_input"]["ns"] // 1000),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda m, s: s["inference_stats"]["compute_infer"]["ns"] // 1000),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     lambda m, s: s["inference_stats"]["compute_output"]["ns"] // 1000),
    ("nv_inference_pending_request_count", "gauge",
     "Instantaneous number of pending requests awaiting execution per-model.", lambda m, s: m.pending),
    ("nv_model_load_duration_secs", "gauge", "Model load time in seconds", lambda m, s: m.load_seconds),
)


def _labels(model: ModelVersion) -> dict[str, str]:
    return {"model": model.name, "version": str(model.version)}


class ServerCollector:
    """Yields every metric family at scrape time."""

    def __init__(self, manager: ModelManager, cache: ResponseCache | None = None,
                 on_demand: OnDemandLoader | None = None, histograms: bool = False) -> None:
        self.manager = manager
        self.cache = cache
        self.on_demand = on_demand
        self.histograms = histograms  # Triton's latency histograms (--metrics-config histogram_latencies=true)
        psutil.cpu_percent(interval=None)  # the first call starts the measuring interval

    def _versions(self) -> list[ModelVersion]:
        return [model for name in sorted(self.manager.models)
                for _, model in sorted(self.manager.models[name].versions.items()) if model.in_service]

    def collect(self) -> Iterator[Metric]:
        models = [(m, m.stats.to_dict(m.name, m.version)) for m in self._versions()]
        yield from _model_metrics(models)
        if self.cache is not None:
            yield from _cache_metrics(self.cache, [(m, s) for m, s in models if m.spec.response_cache])
        yield from _host_metrics()
        if gpu_count():
            yield from _gpu_metrics()
        yield _batch_size_histogram(models)
        yield from _lane_metrics([model for model, _ in models])
        yield from _readiness_metrics([model for model, _ in models])
        yield from _latency_histograms([model for model, _ in models], self.histograms)
        if self.on_demand is not None:
            yield from _on_demand_metrics(self.on_demand)


def _histogram(metric: Metric, labels: dict[str, str], snapshot: tuple) -> None:
    buckets, total, count = snapshot
    for bound, cumulative in buckets:
        metric.add_sample(f"{metric.name}_bucket", labels | {"le": _number(bound)}, cumulative)
    metric.add_sample(f"{metric.name}_bucket", labels | {"le": "+Inf"}, count)
    metric.add_sample(f"{metric.name}_count", labels, count)
    metric.add_sample(f"{metric.name}_sum", labels, total)


def _lane_metrics(models: list[ModelVersion]) -> Iterator[Metric]:
    """The native lanes (runtime/native/lanes.py): whether plain requests to a model go past its scheduler."""
    lanes = [(_labels(model), model.stats.lanes()) for model in models]
    yield _metric("serverless_triton_lane_open", "gauge", "Native lanes open to the model's worker (1: a lone plain "
                  "request may be served past the scheduler)", [(labels, open_) for labels, (open_, _, _) in lanes])
    yield _metric("serverless_triton_lane_executing", "gauge", "Requests the model's native lane is serving now",
                  [(labels, executing) for labels, (_, executing, _) in lanes])
    yield _metric("serverless_triton_lane_requests_total", "counter", "Inference requests served on the model's "
                  "native lane, past the scheduler (counted in nv_inference_request_success or _failure too)",
                  [(labels, served) for labels, (_, _, served) in lanes])


def _readiness_metrics(models: list[ModelVersion]) -> Iterator[Metric]:
    """What readiness reports while Python workers are restarted: a version is ready while one of its instances
    can serve (its worker up, no execution stuck past its timeout)."""
    yield _metric("serverless_triton_model_ready", "gauge", "1 while the model version can serve (at least one "
                  "instance available), 0 while every instance is being restarted or stuck",
                  [(_labels(model), float(model.ready)) for model in models])
    yield _metric("serverless_triton_instances_unavailable", "gauge", "Instances of the model version that cannot "
                  "serve now (a Python worker being restarted)",
                  [(_labels(model), sum(not instance.available for instance in model.instances)) for model in models])
    yield _metric("serverless_triton_worker_restarts_total", "counter", "Python-backend workers of the model version "
                  "lost (crashed, killed, past execute_timeout or their memory limit) and restarted",
                  [(_labels(model), sum(instance.worker_restarts for instance in model.instances))
                   for model in models])


def _on_demand_metrics(loader: OnDemandLoader) -> Iterator[Metric]:
    """Model control on_demand: loads, unloads by reason, cold calls, and memory against the budget."""
    counts = loader.counts
    yield _metric("serverless_triton_on_demand_loads", "counter", "Models loaded on demand by a first call",
                  [({}, counts.loads)])
    yield _metric("serverless_triton_on_demand_unloads", "counter", "Models unloaded by the on-demand mode, by "
                  "reason (idle: unused for keep_warm_seconds; evicted: to make room in the memory budget)",
                  [({"reason": reason}, count) for reason, count in sorted(counts.unloads.items())])
    cold = Metric("serverless_triton_cold_call_ms", "Time a call waited for its model to load on demand, in "
                  "milliseconds", "histogram")
    _histogram(cold, {}, counts.cold_calls.snapshot())
    yield cold
    yield _metric("serverless_triton_model_resident_bytes", "gauge", "Memory a model loaded on demand holds "
                  "(measured as the server's resident memory grew by its load)",
                  [({"model": name}, held) for name, held in sorted(loader.resident_by_model().items())])
    yield _metric("serverless_triton_memory_budget_bytes", "gauge", "The memory budget of models loaded on "
                  "demand (0: none)", [({}, loader.settings.memory_budget)])
    gpus = [(gpu_resource(index), index) for index in loader.ledger.gpu_indices()]
    if gpus:
        yield _metric("serverless_triton_model_gpu_resident_bytes", "gauge", "GPU memory a model loaded on demand "
                      "holds (measured as the GPU's used memory grew by its load)",
                      [({"model": name, "gpu": str(index)}, held) for resource, index in gpus
                       for name, held in sorted(loader.ledger.held_by_model(resource).items())])
        yield _metric("serverless_triton_gpu_memory_overhead_bytes", "gauge", "GPU memory grown since start that "
                      "no loaded model accounts for (CUDA contexts, framework caches); it counts against the budget",
                      [({"gpu": str(index)}, loader.ledger.overhead.get(resource, 0)) for resource, index in gpus])
        yield _metric("serverless_triton_gpu_memory_budget_bytes", "gauge", "The memory budget of models loaded on "
                      "demand on each GPU (0: none)",
                      [({"gpu": str(index)}, loader.settings.gpu_memory_budget) for _, index in gpus])


def _latency_histograms(models: list[ModelVersion], triton_histograms: bool) -> Iterator[Metric]:
    """Triton's time to first response, of every model since Triton 2.65 (only when asked for, as Triton), and
    ours: the time between a decoupled model's responses."""
    first = Metric("nv_inference_first_response_histogram_ms", "Duration from request to first response in "
                   "milliseconds", "histogram")
    between = Metric("serverless_triton_response_interval_ms", "Time between two responses of one request to a "
                     "decoupled model (an LLM's time per output chunk) in milliseconds", "histogram")
    for model in models:
        if not (triton_histograms or model.spec.decoupled):
            continue  # nothing of its to export
        first_snapshot, between_snapshot = model.stats.latency_histograms()
        if triton_histograms:
            _histogram(first, _labels(model), first_snapshot)
        if model.spec.decoupled:
            _histogram(between, _labels(model), between_snapshot)
    if triton_histograms:
        yield first
    yield between


def _metric(name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> Metric:
    metric = Metric(name, help_text, kind)
    for labels, value in samples:
        metric.add_sample(name, labels, value)
    return metric


def _model_metrics(models: list[tuple[ModelVersion, dict]]) -> Iterator[Metric]:
    name, kind, help_text, read = _MODEL_METRICS[0]
    yield _metric(name, kind, help_text, ((_labels(m), read(m, s)) for m, s in models))
    yield _metric("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes",
                  ((_labels(m) | {"reason": reason.value}, count)
                   for m, _ in models for reason, count in m.stats.failure_counts().items()))
    for name, kind, help_text, read in _MODEL_METRICS[1:]:
        yield _metric(name, kind, help_text, ((_labels(m), read(m, s)) for m, s in models))


def _cache_metrics(cache: ResponseCache, models: list[tuple[ModelVersion, dict]]) -> Iterator[Metric]:
    """Triton's response-cache families: per model (the versions that use the cache), then the cache's own."""
    per_model = (("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit", "count"),
                 ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
                  "cache_hit", "ns"),
                 ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss", "count"),
                 ("nv_cache_miss_duration_per_model",
                  "Total cache miss (insert+lookup) duration per model, in microseconds", "cache_miss", "ns"))
    for name, help_text, phase, field in per_model:
        scale = 1000 if field == "ns" else 1
        yield _metric(name, "counter", help_text,
                      ((_labels(m), s["inference_stats"][phase][field] // scale) for m, s in models))
    counters = cache.counters()
    utilization = counters.used_bytes / counters.capacity_bytes if counters.capacity_bytes else 0.0
    for name, help_text, value in (
            ("nv_cache_util", "Cache utilization [0.0 - 1.0]", utilization),
            ("nv_cache_num_entries", "Number of responses stored in response cache", counters.entries),
            ("nv_cache_num_hits", "Number of cache hits in response cache", counters.hits),
            ("nv_cache_num_misses", "Number of cache misses in response cache", counters.misses),
            ("nv_cache_num_lookups", "Number of cache lookups in response cache", counters.lookups),
            ("nv_cache_num_evictions", "Number of cache evictions in response cache", counters.evictions),
            ("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds",
             counters.lookup_ns // 1000),
            ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds",
             counters.insertion_ns // 1000)):
        yield _metric(name, "gauge", help_text, [({}, value)])


def _host_metrics() -> Iterator[Metric]:
    memory = psutil.virtual_memory()
    yield _metric("nv_pinned_memory_pool_total_bytes", "gauge", "Pinned memory pool total memory size, in bytes",
                  [({}, 0)])  # no pinned-memory pool here: tensors live in ordinary (and shared) memory
    yield _metric("nv_pinned_memory_pool_used_bytes", "gauge", "Pinned memory pool used memory size, in bytes",
                  [({}, 0)])
    yield _metric("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]",
                  [({}, psutil.cpu_percent(interval=None) / 100.0)])
    yield _metric("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes", [({}, memory.total)])
    yield _metric("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes",
                  [({}, memory.total - memory.available)])


def _gpu_metrics() -> Iterator[Metric]:
    """Triton's nv_gpu_* families through NVML (nvidia-ml-py)."""
    import pynvml

    readings: dict[str, list[tuple[dict[str, str], float]]] = {key: [] for key in (
        "utilization", "memory_total", "memory_used", "power_usage", "power_limit", "energy")}
    for index in range(gpu_count()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        labels = {"gpu_uuid": uuid.decode() if isinstance(uuid, bytes) else uuid}
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        readings["utilization"].append((labels, pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0))
        readings["memory_total"].append((labels, memory.total))
        readings["memory_used"].append((labels, memory.used))
        readings["power_usage"].append((labels, pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0))
        readings["power_limit"].append((labels, pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0))
        readings["energy"].append((labels, pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0))
    yield _metric("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", readings["utilization"])
    yield _metric("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes", readings["memory_total"])
    yield _metric("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes", readings["memory_used"])
    yield _metric("nv_gpu_power_usage", "gauge", "GPU power usage in watts", readings["power_usage"])
    yield _metric("nv_gpu_power_limit", "gauge", "GPU power management limit in watts", readings["power_limit"])
    yield _metric("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server "
                  "started", readings["energy"])


def _batch_size_histogram(models: list[tuple[ModelVersion, dict]]) -> Metric:
    """Ours, beside Triton's: how large the executed batches were."""
    name = "serverless_triton_batch_size"
    metric = Metric(name, "Batch size of each model execution", "histogram")
    for model, stats in models:
        counts = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
        labels = _labels(model)
        for bound in BATCH_BUCKETS:
            metric.add_sample(f"{name}_bucket", labels | {"le": str(bound)},
                              sum(c for size, c in counts.items() if size <= bound))
        metric.add_sample(f"{name}_bucket", labels | {"le": "+Inf"}, sum(counts.values()))
        metric.add_sample(f"{name}_count", labels, sum(counts.values()))
        metric.add_sample(f"{name}_sum", labels, sum(size * c for size, c in counts.items()))
    return metric


def metrics_registry(manager: ModelManager, cache: ResponseCache | None = None,
                     on_demand: OnDemandLoader | None = None, histograms: bool = False) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(manager, cache, on_demand, histograms))
    return registry


def render_metrics(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format (0.0.4) of everything the registry collects."""
    lines: list[str] = []
    for metric in registry.collect():
        lines.append(f"# HELP {metric.name} {_escape(metric.documentation, quotes=False)}")
        lines.append(f"# TYPE {metric.name} {metric.type}")
        for sample in metric.samples:
            labels = ",".join(f'{key}="{_escape(value)}"' for key, value in _label_order(sample.labels))
            lines.append(f"{sample.name}{{{labels}}} {_number(sample.value)}" if labels
                         else f"{sample.name} {_number(sample.value)}")
    return ("\n".join(lines) + "\n").encode()


def _label_order(labels: dict[str, str]) -> list[tuple[str, str]]:
    """Labels sorted by name, a histogram bucket's ``le`` last (as prometheus-cpp writes them)."""
    return sorted(labels.items(), key=lambda item: (item[0] == "le", item[0]))


def _escape(text: str, quotes: bool = True) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quotes else text


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
