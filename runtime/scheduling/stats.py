"""Per-model-version statistics in the shape of Triton's statistics extension."""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.direct_path import ServedRows


class FailureReason(enum.Enum):
    """Why a request failed, as Triton labels ``nv_inference_request_failure``."""

    REJECTED = "REJECTED"  # refused by the queue (full, or timed out in it)
    CANCELED = "CANCELED"  # the client went away
    BACKEND = "BACKEND"  # the model's execution failed
    OTHER = "OTHER"


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def to_dict(self) -> dict:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


# Triton's default buckets of nv_inference_first_response_histogram_ms, and ours for the time between responses.
FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)
RESPONSE_INTERVAL_BUCKETS_MS = (1.0, 5.0, 10.0, 50.0, 100.0, 500.0)


logger = logging.getLogger(__name__)
FIRST_RESPONSE_FAMILY = "nv_inference_first_response_histogram_ms"


def configured_buckets(model_metrics: Any, model: str) -> tuple[float, ...] | None:
    """A config's ``model_metrics`` buckets for the first-response histogram (Triton 2.52, core #405; the one
    histogram Triton lets a model customize), sorted; None where it sets none. Another family is warned of and
    ignored, as Triton does."""
    found = None
    for control in model_metrics.metric_control:
        family = control.metric_identifier.family
        if family != FIRST_RESPONSE_FAMILY:
            logger.warning("model '%s': metric family '%s' in 'metric_identifier' is not a customizable metric",
                           model, family)
            continue
        buckets = sorted({float(b) for b in control.histogram_options.buckets if math.isfinite(b)})
        if buckets:
            found = tuple(buckets)
    return found


@dataclass
class LatencyHistogram:
    """Observations (ms) counted into fixed buckets, as a Prometheus histogram reports them."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, milliseconds: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)
        for index, bound in enumerate(self.bounds):
            if milliseconds <= bound:
                self.counts[index] += 1
        self.total += milliseconds
        self.count += 1

    def snapshot(self) -> tuple[list[tuple[float, int]], float, int]:
        """(cumulative count at each bound, sum, count)."""
        return list(zip(self.bounds, self.counts or [0] * len(self.bounds), strict=True)), self.total, self.count


_PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


@dataclass
class ModelStatistics:
    """Counts and cumulative durations (ns) of one model version; safe across threads."""

    inference_count: int = 0
    execution_count: int = 0
    last_inference_ns: int = 0  # wall clock
    phases: dict[str, Duration] = field(default_factory=lambda: {p: Duration() for p in _PHASES})
    batches: dict[int, BatchStats] = field(default_factory=dict)
    failures: dict[FailureReason, int] = field(default_factory=lambda: dict.fromkeys(FailureReason, 0))
    first_response: LatencyHistogram = field(default_factory=lambda: LatencyHistogram(FIRST_RESPONSE_BUCKETS_MS))
    response_interval: LatencyHistogram = field(
        default_factory=lambda: LatencyHistogram(RESPONSE_INTERVAL_BUCKETS_MS))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    lane_requests: int = 0  # of those counted above, the requests served past the scheduler (on a lane)
    _sources: list[tuple[Callable[[], ServedRows], Callable[[], tuple[bool, bool]]]] = field(default_factory=list,
                                                                                          repr=False)

    def __post_init__(self) -> None:
        # the phases every request and execution adds to, held directly: recording is on every request's path
        phases = self.phases
        self._success, self._queue = phases["success"], phases["queue"]
        self._computing = (phases["compute_input"], phases["compute_infer"], phases["compute_output"])

    def record_request(self, failure: FailureReason | None, total_ns: int, queue_ns: int, batch_size: int) -> None:
        """One request finished after ``total_ns`` (``queue_ns`` of it queued): ``failure`` None if it succeeded."""
        with self._lock:
            if failure is None:
                success, queue = self._success, self._queue
                success.count += 1
                success.ns += total_ns
                queue.count += 1
                queue.ns += queue_ns
                self.inference_count += batch_size
            else:
                self.phases["fail"].add(total_ns)
                self.failures[failure] += 1
            self.last_inference_ns = time.time_ns()

    def record_cache_hit(self, lookup_ns: int, total_ns: int) -> None:
        """A request answered from the response cache after ``total_ns`` (``lookup_ns`` of it finding the answer):
        a success, but no inference (as Triton counts them)."""
        with self._lock:
            self.phases["success"].add(total_ns)
            self.phases["queue"].add(0)
            self.phases["cache_hit"].add(lookup_ns)
            self.last_inference_ns = time.time_ns()

    def record_cache_miss(self, lookup_and_insert_ns: int) -> None:
        """A request the cache could not answer (``lookup_and_insert_ns`` spent looking and storing)."""
        with self._lock:
            self.phases["cache_miss"].add(lookup_and_insert_ns)

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int, requests: int) -> None:
        """One model execution of ``batch_size`` (summed over ``requests`` requests)."""
        computing_input, computing_infer, computing_output = self._computing
        with self._lock:
            self.execution_count += 1
            computing_input.count += requests
            computing_input.ns += input_ns
            computing_infer.count += requests
            computing_infer.ns += infer_ns
            computing_output.count += requests
            computing_output.ns += output_ns
            batch = self.batches.get(batch_size)
            if batch is None:
                batch = self.batches[batch_size] = BatchStats()
            batch.compute_input.add(input_ns)
            batch.compute_infer.add(infer_ns)
            batch.compute_output.add(output_ns)

    def add_source(self, pull: Callable[[], ServedRows], state: Callable[[], tuple[bool, bool]]) -> Callable[[], None]:
        """A lane serving requests past the scheduler (``runtime/direct_path.py``): ``pull()`` is asked for what it
        served since last asked whenever these statistics are read, ``state()`` whether it takes requests and
        whether it serves one now whenever its lanes are.  Returns the remover, which takes its last rows."""
        source = (pull, state)
        self._sources.append(source)

        def remove() -> None:
            if source in self._sources:
                self._sources.remove(source)
                self.record_served(*pull())

        return remove

    def _pull_sources(self) -> None:
        for pull, _ in list(self._sources):
            self.record_served(*pull())

    def lanes(self) -> tuple[int, int, int]:
        """(lanes open to the model, requests they serve now, requests they have served): what an operator, or a
        test, reads to tell that plain requests go past the scheduler."""
        self._pull_sources()
        states = [state() for _, state in list(self._sources)]
        with self._lock:
            served = self.lane_requests
        return sum(1 for open_, _ in states if open_), sum(1 for _, busy in states if busy), served

    def record_served(self, rows: list[tuple[int, int, int, int, int, int]], failed: int, failed_ns: int,
                      last_wall_ns: int) -> None:
        """Requests served past the scheduler, each alone in its execution: ``rows`` of (batch size, requests,
        total, input, infer and output ns), and ``failed`` requests that took ``failed_ns`` (the model's errors)."""
        if not rows and not failed:
            return
        computing_input, computing_infer, computing_output = self._computing
        with self._lock:
            self.lane_requests += sum(row[1] for row in rows) + failed
            for batch_size, requests, total_ns, input_ns, infer_ns, output_ns in rows:
                self._success.add(total_ns, requests)
                self._queue.add(requests, requests)  # never queued: 1 ns each, so the field is there as Triton's is
                self.inference_count += batch_size * requests
                self.execution_count += requests
                computing_input.add(input_ns, requests)
                computing_infer.add(infer_ns, requests)
                computing_output.add(output_ns, requests)
                batch = self.batches.get(batch_size)
                if batch is None:
                    batch = self.batches[batch_size] = BatchStats()
                batch.compute_input.add(input_ns, requests)
                batch.compute_infer.add(infer_ns, requests)
                batch.compute_output.add(output_ns, requests)
            if failed:
                self.execution_count += failed
                self.phases["fail"].add(failed_ns, failed)
                self.failures[FailureReason.BACKEND] += failed
            self.last_inference_ns = max(self.last_inference_ns, last_wall_ns)

    def record_response(self, first: bool, milliseconds: float) -> None:
        """A response: ``milliseconds`` since its request began (the first; any model's, with Triton's latency
        histograms on) or since the previous response (the others: a decoupled model's)."""
        with self._lock:
            (self.first_response if first else self.response_interval).observe(milliseconds)

    def latency_histograms(self) -> tuple[tuple, tuple]:
        """Snapshots of the first-response and between-responses histograms."""
        with self._lock:
            return self.first_response.snapshot(), self.response_interval.snapshot()

    def failure_counts(self) -> dict[FailureReason, int]:
        self._pull_sources()
        with self._lock:
            return dict(self.failures)

    def to_dict(self, name: str, version: int) -> dict:
        self._pull_sources()
        with self._lock:
            return {
                "name": name,
                "version": str(version),
                "last_inference": self.last_inference_ns // 1_000_000,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {phase: d.to_dict() for phase, d in self.phases.items()},
                "response_stats": {},  # per-response statistics of decoupled models (none yet)
                "memory_usage": [],
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": b.compute_input.to_dict(),
                        "compute_infer": b.compute_infer.to_dict(),
                        "compute_output": b.compute_output.to_dict(),
                    }
                    for size, b in sorted(self.batches.items())
                ],
            }
