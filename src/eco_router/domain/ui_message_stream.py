"""A chat job's SSE frames as the AI SDK's UI message stream (protocol v1): one pure mapping.

The job's stream (`StreamJobEvents`) says `token` (a delta), `token_recovery` (the whole text
so far, in place of tokens missed), a text restarted by a retried attempt (`restart`, or a
recovery of a newer attempt), and the job's end (`done`, a failed event, or the stream giving
up: `timeout`, `idle`). The AI SDK's `DefaultChatTransport` reads parts: `start`,
`text-start`, `text-delta`, `text-end`, `finish`, `error`, `reset-step`. This module turns
the first into the second, keeping only what a mapping needs: which text part is open, its
attempt and how many characters of it were sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from eco_router.domain.sse import Frame

# What `DefaultChatTransport` checks a response for (ai's `UI_MESSAGE_STREAM_HEADERS`).
HEADER_NAME = "x-vercel-ai-ui-message-stream"
HEADER_VALUE = "v1"
DONE_LINE = b"data: [DONE]\n\n"

Part = dict[str, Any]


@dataclass(frozen=True, slots=True)
class UiText:
    """Where one response stands: text parts opened so far (the open one is the last), whether
    one is open, the attempt its text belongs to (None: not known), the characters of it sent,
    and whether the response has ended."""

    parts: int = 0
    open: bool = False
    attempt: int | None = None
    sent: int = 0
    ended: bool = False

    @property
    def part_id(self) -> str:
        return f"text-{self.parts}"


def opening(job_id: str) -> list[Part]:
    """The parts every response starts with: the assistant message is the job (its id), and
    one step holds its text (so a restarted text resets that step only)."""
    return [{"type": "start", "messageId": job_id}, {"type": "start-step"}]


def ui_parts(frame: Frame, state: UiText) -> tuple[list[Part], UiText]:
    """The UI parts one frame of the job's stream maps to, and where the response then stands.

    - `token`: a delta of the open text part (a part is opened first if none is); a token
      that restarts the text (`restart`) resets the step and opens a new part with it.
    - `token_recovery` of the open part's attempt: the characters not sent yet, as one delta
      (on a fresh response or a reconnect: the whole text so far, in one delta). Of another
      attempt (a retried task restarted the text): `reset-step`, then a new part holding the
      whole text.
    - `done`: the text part ends, then `finish-step` and `finish` (`stop`; `other` for any
      other status, `cancelled` among them); its metadata has the job's id, its status and
      the text's check.
    - A failed event: the text part ends, then `error` (what failed) and `finish` (`error`).
    - The stream giving up (`timeout`, `idle`): the text part ends, then `error` naming why;
      no `finish`: the job has not ended and a resume may go on.
    - Stage events, snapshots and announcements map to nothing: the text is the message.
    """
    if state.ended:
        return [], state
    name = frame.name
    if name not in ("token", "token_recovery", "done", "error"):
        return [], state
    body = json.loads(frame.data)
    if not isinstance(body, dict):
        return [], state
    if name == "token":
        return _token(body, state)
    if name == "token_recovery":
        return _recovery(body, state)
    if name == "done":
        return _finished(body, state)
    if "job_id" not in body:
        # The stream's own error (no id): it gave up on the job, which may go on.
        parts, state = _close_text(state)
        reason = str(body.get("error", "error"))
        parts.append({"type": "error", "errorText": GIVING_UP.get(reason, reason)})
        return parts, replace(state, ended=True)
    return _failed(body, state)


GIVING_UP = {
    "timeout": "timeout: the job sent no end in time; resume to go on waiting",
    "idle": "idle: nothing was heard of the job for too long; its outcome is unknown",
}


def _token(body: dict[str, Any], state: UiText) -> tuple[list[Part], UiText]:
    content = body.get("content")
    if not isinstance(content, str):
        return [], state
    parts: list[Part] = []
    if body.get("restart") is True and state.parts:
        parts, state = _restarted(state, _attempt(body))
    elif not state.open:
        parts, state = _opened(state, _attempt(body))
    if content:
        parts.append({"type": "text-delta", "id": state.part_id, "delta": content})
    return parts, replace(state, sent=state.sent + len(content))


def _recovery(body: dict[str, Any], state: UiText) -> tuple[list[Part], UiText]:
    text = body.get("accumulated")
    if not isinstance(text, str):
        return [], state
    attempt = _attempt(body)
    parts: list[Part] = []
    if state.open and attempt is not None and attempt == state.attempt and len(text) >= state.sent:
        rest = text[state.sent :]
    else:
        parts, state = (_restarted if state.parts else _opened)(state, attempt)
        rest = text
    if rest:
        parts.append({"type": "text-delta", "id": state.part_id, "delta": rest})
    return parts, replace(state, sent=state.sent + len(rest))


def _finished(body: dict[str, Any], state: UiText) -> tuple[list[Part], UiText]:
    parts, state = _close_text(state)
    status = body.get("status")
    metadata: dict[str, Any] = {"job_id": body.get("job_id"), "status": status}
    if "text_check" in body:
        metadata["text_check"] = body["text_check"]
    reason = "stop" if status == "done" else "other"
    parts += [
        {"type": "finish-step"},
        {"type": "finish", "finishReason": reason, "messageMetadata": metadata},
    ]
    return parts, replace(state, ended=True)


def _failed(body: dict[str, Any], state: UiText) -> tuple[list[Part], UiText]:
    parts, state = _close_text(state)
    stage = body.get("stage") or "the job"
    detail = _detail(body.get("result"))
    error = f"{stage} failed" + (f": {detail}" if detail else "")
    metadata = {"job_id": body.get("job_id"), "status": body.get("status")}
    parts += [
        {"type": "error", "errorText": error},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "error", "messageMetadata": metadata},
    ]
    return parts, replace(state, ended=True)


def _detail(result: object) -> str | None:
    """What a failed event's result says went wrong: a string, or an object's `error`."""
    if isinstance(result, str) and result:
        return result
    if isinstance(result, dict) and isinstance(result.get("error"), str):
        return str(result["error"])
    return None


def _opened(state: UiText, attempt: int | None) -> tuple[list[Part], UiText]:
    state = replace(state, parts=state.parts + 1, open=True, attempt=attempt, sent=0)
    return [{"type": "text-start", "id": state.part_id}], state


def _restarted(state: UiText, attempt: int | None) -> tuple[list[Part], UiText]:
    """A newer attempt's text replaces the step's: the parts it holds go, a new one opens."""
    parts, opened = _opened(replace(state, open=False), attempt)
    return [{"type": "reset-step"}, *parts], opened


def _close_text(state: UiText) -> tuple[list[Part], UiText]:
    if not state.open:
        return [], state
    return [{"type": "text-end", "id": state.part_id}], replace(state, open=False)


def _attempt(body: dict[str, Any]) -> int | None:
    """The attempt a token or a recovery belongs to: absent is 0, as for the router; None
    when it is not a number (then a recovery starts the text again, which is never wrong)."""
    attempt = body.get("attempt", 0)
    if isinstance(attempt, str) and attempt.isascii() and attempt.isdigit():
        return int(attempt)
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        return None
    return attempt


def encode(parts: list[Part]) -> bytes:
    """The parts as SSE `data:` lines, as the AI SDK's `JsonToSseTransformStream` writes them."""
    return b"".join(
        b"data: %s\n\n" % json.dumps(part, ensure_ascii=False, separators=(",", ":")).encode()
        for part in parts
    )
