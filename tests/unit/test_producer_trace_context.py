"""The producer writes the W3C `traceparent` of the span current at the call, and nothing
without one; the router keeps it on the published event."""

from __future__ import annotations

import orjson
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import format_span_id, format_trace_id

from eco_router.domain.event import JobEvent
from eco_router.domain.parsing import parse_entry
from eco_router.domain.progress import StageEvent
from eco_router.domain.streams import StreamFamily
from eco_router.producer import ProducerConfig

CONFIG = ProducerConfig(family=StreamFamily("scan:events", 4))


def expected_traceparent(span: trace.Span) -> str:
    context = span.get_span_context()
    flags = f"{int(context.trace_flags):02x}"
    return f"00-{format_trace_id(context.trace_id)}-{format_span_id(context.span_id)}-{flags}"


def sampled(traceparent: str) -> bool:
    return bool(int(traceparent.rsplit("-", 1)[1], 16) & 0x01)


class TestTheProducerWritesTheCurrentTraceContext:
    def test_no_span_no_trace_fields(self) -> None:
        fields = CONFIG.stage_event(StageEvent("job-1", "vision", "started"))

        assert not {"traceparent", "tracestate", "trace_id", "span_id"} & set(fields.fields)

    def test_a_recording_span_is_written_as_its_traceparent(self) -> None:
        tracer = TracerProvider().get_tracer("worker")
        with tracer.start_as_current_span("vision") as span:
            fields = CONFIG.stage_event(StageEvent("job-1", "vision", "started", progress=0)).fields

        assert fields["traceparent"] == expected_traceparent(span)
        assert sampled(fields["traceparent"])
        assert "tracestate" not in fields

    def test_an_unsampled_span_still_propagates_with_its_flag_off(self) -> None:
        tracer = TracerProvider(sampler=ALWAYS_OFF).get_tracer("worker")
        with tracer.start_as_current_span("vision") as span:
            fields = CONFIG.stage_event(StageEvent("job-1", "vision", "completed")).fields

        assert fields["traceparent"] == expected_traceparent(span)
        assert not sampled(fields["traceparent"])

    def test_the_routed_event_carries_the_same_traceparent(self) -> None:
        tracer = TracerProvider().get_tracer("worker")
        with tracer.start_as_current_span("done") as span:
            fields = CONFIG.stage_event(
                StageEvent("job-1", "done", "completed", result={"answer": "정상입니다"})
            )

        routed = parse_entry(
            domain="scan",
            stream=fields.stream,
            entry_id="1-0",
            fields={k.encode(): v.encode() for k, v in fields.fields.items()},
        )
        assert isinstance(routed, JobEvent)
        payload = orjson.loads(orjson.dumps(routed.as_payload()))
        assert payload["traceparent"] == expected_traceparent(span)
