"""Tracing mode ``opentelemetry``: each finished trace as OpenTelemetry spans, sent over OTLP/HTTP by
opentelemetry-sdk's batch span processor, as Triton sends them.

A trace becomes Triton's three kinds of span: a top-level ``InferRequest`` span (from the request's start to its
end; the child of the client's span when the request carried a W3C ``traceparent``), a model span named after the
model (request start to end, with its queue timestamp) and a ``compute`` span (the compute timestamps); an
ensemble's steps add their model and compute spans under the ensemble's model span.  Every timestamp is an event
named as in Triton's trace file; spans carry ``model_name``, ``model_version``, ``request_id`` and ``parent_id``.
Monotonic timestamps are moved onto the wall clock OpenTelemetry uses.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace as otel
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runtime.extensions.tracing import Trace, TraceSettings

_COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


class OtlpExport:
    """Sends finished traces to ``settings.otel_url`` (its own provider: the process's global one is left alone)."""

    def __init__(self, settings: TraceSettings) -> None:
        resource = Resource.create({"service.name": "triton-inference-server", **dict(settings.otel_resource)})
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otel_url)))
        self.tracer = self.provider.get_tracer("serverless-triton")
        self.wall_offset = time.time_ns() - time.perf_counter_ns()

    def __call__(self, traces: list[Trace]) -> None:
        for trace in traces:
            if not trace.events:
                continue
            context = None
            if trace.context:
                context = TraceContextTextMapPropagator().extract({"traceparent": trace.context})
            start, end = self._wall(trace.events[0][1]), self._wall(trace.events[-1][1])
            top = self.tracer.start_span("InferRequest", context=context, start_time=start)
            self._model_spans(trace, otel.set_span_in_context(top))
            top.end(end_time=end)

    def _model_spans(self, trace: Trace, parent_context) -> None:
        model_events = [(name, ns) for name, ns in trace.events if name not in _COMPUTE_EVENTS]
        compute_events = [(name, ns) for name, ns in trace.events if name in _COMPUTE_EVENTS]
        attributes: dict[str, Any] = {"model_name": trace.model, "model_version": trace.version,
                                      "request_id": trace.request_id, "triton.trace_id": trace.id}
        if trace.parent_id is not None:
            attributes["parent_id"] = trace.parent_id
        model_span = self.tracer.start_span(trace.model, context=parent_context, attributes=attributes,
                                            start_time=self._wall(trace.events[0][1]))
        for name, ns in model_events:
            model_span.add_event(name, timestamp=self._wall(ns))
        inside = otel.set_span_in_context(model_span)
        if compute_events:
            compute = self.tracer.start_span("compute", context=inside, start_time=self._wall(compute_events[0][1]))
            for name, ns in compute_events:
                compute.add_event(name, timestamp=self._wall(ns))
            compute.end(end_time=self._wall(compute_events[-1][1]))
        for child in trace.children:
            if child.events:
                self._model_spans(child, inside)
        model_span.end(end_time=self._wall(trace.events[-1][1]))

    def _wall(self, monotonic_ns: int) -> int:
        return monotonic_ns + self.wall_offset

    def close(self) -> None:
        """Send what is batched, then stop."""
        self.provider.shutdown()
