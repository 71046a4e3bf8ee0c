"""The active OpenTelemetry context as stream-entry fields (W3C `traceparent`, `tracestate`)."""

from __future__ import annotations

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# Only the W3C pair, whatever propagators the application configured globally (baggage,
# B3...): the router and the browsers read `traceparent`, and an entry stays small.
_PROPAGATOR = TraceContextTextMapPropagator()


def current_trace_fields() -> dict[str, str]:
    """`traceparent` (and `tracestate` when it has entries) of the current span; nothing
    when no valid span is current, e.g. without an OpenTelemetry SDK configured."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier
