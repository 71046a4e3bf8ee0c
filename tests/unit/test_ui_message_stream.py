"""A chat job's frames as the AI SDK's UI message stream: the parts each frame maps to, and
the text a reader of those parts holds, whatever recoveries and restarts the job's stream sent."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from eco_router.domain.sse import Frame, GatewayEvent, live_frame, notice, snapshot
from eco_router.domain.ui_message_stream import (
    DONE_LINE,
    Part,
    UiText,
    encode,
    opening,
    ui_parts,
)

JOB = "chat-1"


def frame(event_id: int, stage: str, status: str, **fields: Any) -> Frame:
    """One frame of the job's stream, as `StreamJobEvents` writes it."""
    body = {"event_id": event_id, "job_id": JOB, "stage": stage, "status": status, **fields}
    return live_frame(GatewayEvent(event_id, stage, status, json.dumps(body).encode()))


def token(event_id: int, content: str, **fields: Any) -> Frame:
    return frame(event_id, "token", "streaming", content=content, **fields)


def recovery(event_id: int, text: str, *, attempt: int = 0) -> Frame:
    return frame(event_id, "token_recovery", "snapshot", accumulated=text, attempt=attempt)


def mapped(*frames: Frame) -> tuple[list[Part], UiText]:
    parts: list[Part] = []
    state = UiText()
    for one in frames:
        more, state = ui_parts(one, state)
        parts += more
    return parts, state


def held_text(parts: list[Part]) -> str:
    """The text of the message a reader of `parts` holds, as the AI SDK's
    `processUIMessageStream` builds it: text parts by id, `reset-step` drops the step's parts."""
    message: list[dict[str, str]] = []
    active: dict[str, dict[str, str]] = {}
    for part in opening(JOB) + parts:
        kind = part["type"]
        if kind == "start-step":
            message.append({"type": "step-start"})
        elif kind == "text-start":
            active[part["id"]] = {"type": "text", "text": ""}
            message.append(active[part["id"]])
        elif kind == "text-delta":
            active[part["id"]]["text"] += part["delta"]
        elif kind == "reset-step":
            starts = [i for i, p in enumerate(message) if p["type"] == "step-start"]
            del message[starts[-1] + 1 if starts else 0 :]
            active = {}
    return "".join(p["text"] for p in message if p["type"] == "text")


class TestFrames:
    def test_parts_are_written_as_the_ai_sdk_writes_them(self) -> None:
        assert encode([{"type": "text-delta", "id": "text-1", "delta": "안녕"}]) == (
            b'data: {"type":"text-delta","id":"text-1","delta":"\xec\x95\x88\xeb\x85\x95"}\n\n'
        )
        assert DONE_LINE == b"data: [DONE]\n\n"

    def test_a_response_opens_a_message_named_by_the_job_and_one_step(self) -> None:
        assert opening(JOB) == [{"type": "start", "messageId": JOB}, {"type": "start-step"}]


class TestText:
    def test_tokens_are_deltas_of_one_text_part(self) -> None:
        parts, state = mapped(token(1001, "Hel"), token(1002, "lo"))
        assert parts == [
            {"type": "text-start", "id": "text-1"},
            {"type": "text-delta", "id": "text-1", "delta": "Hel"},
            {"type": "text-delta", "id": "text-1", "delta": "lo"},
        ]
        assert state == UiText(parts=1, open=True, attempt=0, sent=5)

    def test_a_resume_gets_the_whole_text_so_far_in_one_delta_then_live_deltas(self) -> None:
        parts, _ = mapped(recovery(1002, "Hello"), token(1003, "!"))
        assert parts == [
            {"type": "text-start", "id": "text-1"},
            {"type": "text-delta", "id": "text-1", "delta": "Hello"},
            {"type": "text-delta", "id": "text-1", "delta": "!"},
        ]

    def test_a_catch_up_of_the_same_attempt_sends_only_what_was_missed(self) -> None:
        parts, state = mapped(token(1001, "Hel"), recovery(1003, "Hello!"))
        assert parts[-1] == {"type": "text-delta", "id": "text-1", "delta": "lo!"}
        assert state.sent == len("Hello!")

    def test_a_recovery_with_nothing_new_sends_nothing(self) -> None:
        parts, _ = mapped(token(1001, "Hi"), recovery(1001, "Hi"))
        assert parts == [
            {"type": "text-start", "id": "text-1"},
            {"type": "text-delta", "id": "text-1", "delta": "Hi"},
        ]

    def test_a_retried_attempt_resets_the_step_and_starts_a_new_text_part(self) -> None:
        parts, state = mapped(token(1001, "first try"), recovery(1005, "Second", attempt=1))
        assert parts[2:] == [
            {"type": "reset-step"},
            {"type": "text-start", "id": "text-2"},
            {"type": "text-delta", "id": "text-2", "delta": "Second"},
        ]
        assert held_text(parts) == "Second"
        assert state.attempt == 1

    def test_a_restarting_token_resets_the_step_too(self) -> None:
        parts, _ = mapped(token(1001, "old"), token(1002, "new", restart=True, attempt=1))
        assert parts[2:] == [
            {"type": "reset-step"},
            {"type": "text-start", "id": "text-2"},
            {"type": "text-delta", "id": "text-2", "delta": "new"},
        ]

    def test_stage_events_snapshots_and_announcements_map_to_nothing(self) -> None:
        parts, state = mapped(
            snapshot(None, JOB),
            frame(1, "queued", "queued"),
            frame(2, "cancel_requested", "requested"),
            frame(3, "needs_input", "waiting"),
        )
        assert parts == []
        assert state == UiText()


class TestEnds:
    def test_done_ends_the_text_and_finishes_with_stop_and_the_text_check(self) -> None:
        check = {"bytes": 2, "sha1": "x", "truncated": False}
        parts, state = mapped(token(1001, "Hi"), frame(1002, "done", "done", text_check=check))
        assert parts[2:] == [
            {"type": "text-end", "id": "text-1"},
            {"type": "finish-step"},
            {
                "type": "finish",
                "finishReason": "stop",
                "messageMetadata": {"job_id": JOB, "status": "done", "text_check": check},
            },
        ]
        assert state.ended

    def test_a_cancelled_job_finishes_with_other_and_says_so(self) -> None:
        parts, _ = mapped(token(1001, "Hi"), frame(1003, "done", "cancelled"))
        assert parts[-1] == {
            "type": "finish",
            "finishReason": "other",
            "messageMetadata": {"job_id": JOB, "status": "cancelled"},
        }

    def test_a_failed_job_is_an_error_part_then_a_finish_with_error(self) -> None:
        failed = frame(7, "answer", "failed", result={"error": "model overloaded"})
        parts, state = mapped(token(1001, "Hi"), failed)
        assert parts[2:] == [
            {"type": "text-end", "id": "text-1"},
            {"type": "error", "errorText": "answer failed: model overloaded"},
            {"type": "finish-step"},
            {
                "type": "finish",
                "finishReason": "error",
                "messageMetadata": {"job_id": JOB, "status": "failed"},
            },
        ]
        assert state.ended

    def test_a_stream_that_gives_up_is_an_error_without_a_finish(self) -> None:
        parts, state = mapped(token(1001, "Hi"), notice("timeout"))
        assert [p["type"] for p in parts[2:]] == ["text-end", "error"]
        assert parts[-1]["errorText"].startswith("timeout: ")
        assert state.ended

    def test_nothing_maps_after_the_end(self) -> None:
        parts, _ = mapped(frame(1, "done", "done"), token(1001, "late"))
        assert [p["type"] for p in parts] == ["finish-step", "finish"]


@st.composite
def job_streams(draw: st.DrawFn) -> tuple[list[Frame], str]:
    """What one connection to a job's stream may carry: attempts of tokens, some replaced by
    one recovery of the text so far (a resume, a catch-up), a newer attempt restarting the text
    by a recovery or by its first token; and the text the job ends with."""
    alphabet = st.sampled_from(["a", "é", "안", "👍", " ", "z"])
    attempts = draw(st.lists(st.lists(st.text(alphabet, max_size=3), max_size=8), min_size=1))
    frames: list[Frame] = []
    event_id = 1000
    text = ""
    for attempt, tokens in enumerate(attempts):
        # A newer attempt restarts the text at its first token: one without any restarts nothing.
        for index, content in enumerate(tokens):
            if index == 0:
                text = ""
            event_id += 1
            text += content
            if attempt and index == 0 and draw(st.booleans()):
                frames.append(token(event_id, content, restart=True, attempt=attempt))
            elif (attempt and index == 0) or draw(st.integers(0, 3)) == 0:
                frames.append(recovery(event_id, text, attempt=attempt))
            else:
                frames.append(token(event_id, content, attempt=attempt))
    return frames, text


class TestHeldText:
    @given(job_streams())
    def test_a_reader_holds_exactly_the_jobs_text(self, stream: tuple[list[Frame], str]) -> None:
        frames, text = stream
        parts, _ = mapped(*frames)
        assert held_text(parts) == text
