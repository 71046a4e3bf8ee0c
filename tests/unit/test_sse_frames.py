"""The SSE domain: event names, frame bytes, what a (re)connecting client is replayed, and
when nothing more is coming (the end, or an idle job)."""

from __future__ import annotations

import pytest

from eco_router.domain.sse import (
    IDLE_FRAME,
    KEEPALIVE_FRAME,
    GatewayEvent,
    ReplayPlan,
    error_frame,
    event_frame,
    idle_left_ms,
    job_end,
    plan_replay,
    snapshot_frame,
)


def make_gateway_event(seq: int = 1, **overrides: object) -> GatewayEvent:
    values: dict[str, object] = {
        "event_id": seq,
        "stage": "scan",
        "status": "running",
        "data": b'{"job_id":"job-1","seq":%d}' % seq,
    }
    values.update(overrides)
    return GatewayEvent(**values)  # type: ignore[arg-type]


def events(*seqs: int) -> list[GatewayEvent]:
    return [make_gateway_event(seq) for seq in seqs]


class TestEventNames:
    @pytest.mark.parametrize(
        ("stage", "status", "name"),
        [
            ("scan", "running", "scan"),
            ("upload", None, "upload"),
            ("done", "done", "done"),
            ("done", None, "done"),
            ("report", "done", "done"),
            ("scan", "failed", "error"),
            (None, "failed", "error"),
            (None, "running", "progress"),
            (None, None, "progress"),
        ],
    )
    def test_the_event_name_follows_stage_and_status(
        self, stage: str | None, status: str | None, name: str
    ) -> None:
        assert make_gateway_event(stage=stage, status=status).name == name

    @pytest.mark.parametrize(
        ("stage", "status", "terminal"),
        [
            ("done", "done", True),
            ("report", "done", True),
            ("scan", "failed", True),
            ("scan", "running", False),
            ("error_report", "running", False),
            (None, None, False),
        ],
    )
    def test_only_done_and_failed_events_end_the_stream(
        self, stage: str | None, status: str | None, terminal: bool
    ) -> None:
        assert make_gateway_event(stage=stage, status=status).terminal is terminal

    def test_an_event_without_a_domain_belongs_to_every_domain(self) -> None:
        event = make_gateway_event(domain=None)

        assert event.belongs_to("scan")
        assert event.belongs_to("chat")

    def test_an_event_with_a_domain_belongs_to_that_domain_only(self) -> None:
        event = make_gateway_event(domain="scan")

        assert event.belongs_to("scan")
        assert not event.belongs_to("chat")


class TestFrames:
    def test_an_event_frame_has_id_event_and_data_lines(self) -> None:
        event = make_gateway_event(7, stage="upload", data=b'{"seq":7,"stage":"upload"}')

        assert event_frame(event) == b'id: 7\nevent: upload\ndata: {"seq":7,"stage":"upload"}\n\n'

    def test_a_failed_event_is_sent_as_an_error_event(self) -> None:
        event = make_gateway_event(3, status="failed", data=b"{}")

        assert event_frame(event) == b"id: 3\nevent: error\ndata: {}\n\n"

    def test_a_done_event_is_sent_as_a_done_event(self) -> None:
        event = make_gateway_event(9, stage="done", status="done", data=b"{}")

        assert event_frame(event) == b"id: 9\nevent: done\ndata: {}\n\n"

    def test_a_snapshot_carries_the_state_and_no_id(self) -> None:
        state = make_gateway_event(5, data=b'{"seq":5}')

        frame = snapshot_frame(state, "job-1")

        assert frame == b'event: snapshot\ndata: {"job_id":"job-1","state":{"seq":5}}\n\n'
        assert not any(line.startswith(b"id:") for line in frame.split(b"\n"))

    def test_the_snapshot_of_an_unknown_job_names_it_with_a_null_state(self) -> None:
        assert (
            snapshot_frame(None, "job-42")
            == b'event: snapshot\ndata: {"job_id":"job-42","state":null}\n\n'
        )

    def test_an_error_frame_names_the_reason_and_has_no_id(self) -> None:
        assert error_frame("timeout") == b'event: error\ndata: {"error":"timeout"}\n\n'

    def test_a_keepalive_is_a_comment_the_client_ignores(self) -> None:
        assert KEEPALIVE_FRAME.startswith(b":")
        assert KEEPALIVE_FRAME.endswith(b"\n\n")
        assert KEEPALIVE_FRAME.count(b"\n") == 2


class TestPlanReplay:
    @pytest.mark.parametrize(
        ("last_event_id", "history_seqs", "known", "history_size", "snapshot", "replayed"),
        [
            pytest.param(None, [1, 2, 3], True, 10, False, [1, 2, 3], id="new client"),
            pytest.param(None, [3, 1, 2], True, 10, False, [1, 2, 3], id="new client, seq order"),
            pytest.param(None, [4, 5, 6], True, 3, True, [4, 5, 6], id="new client, full history"),
            pytest.param(2, [1, 2, 3, 4, 5], True, 5, False, [3, 4, 5], id="resume in history"),
            pytest.param(3, [4, 5, 6], True, 3, False, [4, 5, 6], id="resume just before oldest"),
            pytest.param(6, [4, 5, 6], True, 3, False, [], id="up to date"),
            pytest.param(1, [4, 5, 6], True, 3, True, [4, 5, 6], id="id older than full history"),
            pytest.param(1, [4, 5], True, 3, False, [4, 5], id="history not full"),
            pytest.param(None, [], False, 3, True, [], id="unknown job, new client"),
            pytest.param(5, [], False, 3, True, [], id="unknown job, resuming client"),
        ],
    )
    def test_replay_plan(
        self,
        last_event_id: int | None,
        history_seqs: list[int],
        known: bool,
        history_size: int,
        snapshot: bool,
        replayed: list[int],
    ) -> None:
        history = events(*history_seqs)
        state = max(history, key=lambda e: e.event_id) if known else None

        plan = plan_replay(
            last_event_id=last_event_id,
            history=history,
            state=state,
            history_size=history_size,
        )

        assert plan.snapshot is snapshot
        assert [e.event_id for e in plan.events] == replayed

    def test_the_replayed_events_are_the_history_events_themselves(self) -> None:
        history = events(1, 2, 3)

        plan = plan_replay(last_event_id=1, history=history, state=history[-1], history_size=10)

        assert plan == ReplayPlan(snapshot=False, events=history[1:])

    @pytest.mark.parametrize(
        ("last_event_id", "history_bytes", "snapshot"),
        [
            (2, 900, True),  # trimmed by bytes, not back to the client's id: a real gap
            (4, 900, False),  # trimmed by bytes, but reaching back to the client's id
            (2, 700, False),  # too small to have been trimmed by bytes
            (None, 900, True),  # a new client when the start may be gone
        ],
    )
    def test_a_history_that_may_have_lost_events_to_the_byte_cap_is_a_gap(
        self, last_event_id: int | None, history_bytes: int, snapshot: bool
    ) -> None:
        history = events(5, 6, 7)

        plan = plan_replay(
            last_event_id=last_event_id,
            history=history,
            state=history[-1],
            history_size=100,
            history_bytes=history_bytes,
            trimmed_above_bytes=800,
        )

        assert plan.snapshot is snapshot
        assert [e.event_id for e in plan.events] == [
            s for s in (5, 6, 7) if s > (last_event_id or -1)
        ]


class TestJobEnd:
    """Why a client that got `last_sent` has nothing more coming: the end, or an idle job."""

    NOW_MS = 1_700_000_600_000
    IDLE_MS = 600_000

    @pytest.mark.parametrize(
        ("state", "last_sent", "heard_ms", "end"),
        [
            pytest.param(None, 5, 0, None, id="unknown job"),
            pytest.param(None, None, None, None, id="unknown job, new client"),
            pytest.param(
                make_gateway_event(3, stage="done", status="done"), 3, NOW_MS, "done", id="done"
            ),
            pytest.param(make_gateway_event(3, status="failed"), 4, NOW_MS, "failed", id="failed"),
            pytest.param(
                make_gateway_event(3, stage="done", status="done"), 2, 0, None, id="end not seen"
            ),
            pytest.param(make_gateway_event(3), 3, NOW_MS - IDLE_MS, "idle", id="idle"),
            pytest.param(make_gateway_event(3), 9, 0, "idle", id="idle, client ahead of store"),
            pytest.param(make_gateway_event(3), 3, NOW_MS - IDLE_MS + 1, None, id="just heard"),
            pytest.param(make_gateway_event(3), 2, 0, None, id="idle, latest event not seen"),
            pytest.param(make_gateway_event(3), None, 0, None, id="idle, new client"),
            pytest.param(make_gateway_event(3), 3, None, None, id="never heard of"),
        ],
    )
    def test_job_end(
        self,
        state: GatewayEvent | None,
        last_sent: int | None,
        heard_ms: int | None,
        end: str | None,
    ) -> None:
        assert (
            job_end(
                state,
                last_sent,
                last_heard_ms=heard_ms,
                now_ms=self.NOW_MS,
                idle_after_ms=self.IDLE_MS,
            )
            == end
        )

    def test_a_job_is_idle_once_not_heard_of_for_the_whole_limit(self) -> None:
        assert idle_left_ms(last_heard_ms=1_000, now_ms=1_500, idle_after_ms=600) == 100
        assert idle_left_ms(last_heard_ms=1_000, now_ms=1_600, idle_after_ms=600) == 0

    def test_the_idle_frame_is_an_error_event_without_an_id(self) -> None:
        assert IDLE_FRAME == b'event: error\ndata: {"error":"idle"}\n\n'
