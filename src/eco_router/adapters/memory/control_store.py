"""In-memory adapter of `ControlStore`: the control log is a stream of `InMemoryStreams`, the
announcement goes to the job's shard stream there, and the job's end is read from the state
store, as the scripts do on Redis."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.application.ports import Clock, ControlStore
from eco_router.domain.control import (
    PREVIEW_BYTES,
    Admission,
    ControlKind,
    ControlLog,
    ControlLogPage,
    ControlMessage,
    ControlRequest,
    ControlState,
    ControlSummary,
    FirstMessage,
    PendingControls,
    RateBucket,
    has_ended,
    lifecycle_fields,
)
from eco_router.domain.event import StreamEntryId
from eco_router.domain.streams import StreamFamily


@dataclass(slots=True)
class _Controls:
    """A job's control state, as the Redis hash holds it; an acknowledged message keeps no
    body (its `ControlMessage` stays, for the console's page and the request ids)."""

    by_request: dict[tuple[str, str], FirstMessage] = field(default_factory=dict)
    messages: dict[str, ControlMessage] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    buckets: dict[str, RateBucket] = field(default_factory=dict)
    cancel: FirstMessage | None = None
    version: int = 0
    waiting: int = 0
    waiting_bytes: int = 0
    expires_ms: int = 0


class InMemoryControlStore(ControlStore):
    """Control messages in dicts with the state TTL; the log and the announcements are
    entries of `streams`, the job's end is its state in `states`."""

    def __init__(
        self,
        *,
        streams: InMemoryStreams,
        states: InMemoryStateStore,
        families: Sequence[StreamFamily],
        state_ttl_s: int,
        clock: Clock,
    ) -> None:
        self._streams = streams
        self._states = states
        self._families = {f.domain: f for f in families}
        self._ttl_ms = state_ttl_s * 1000
        self._clock = clock
        self._jobs: dict[tuple[str, str], _Controls] = {}

    async def control_log(self, request: ControlRequest) -> ControlLog:
        controls = self._controls(request.domain, request.job_id)
        view = await self._states.view(request.domain, request.job_id)
        return ControlLog(
            known=view.state is not None or bool(view.history) or view.text_last_id is not None,
            ended=_ended(view.state),
            version=controls.version,
            count=len(controls.messages),
            waiting=controls.waiting,
            waiting_bytes=controls.waiting_bytes,
            first=controls.by_request.get((request.sender, request.request_id)),
            cancel=controls.cancel,
            bucket=controls.buckets.get(request.sender),
        )

    async def append(
        self, request: ControlRequest, admission: Admission, *, version: int
    ) -> str | None:
        controls = self._controls(request.domain, request.job_id, keep=True)
        if controls.version != version:
            return None
        if _ended((await self._states.view(request.domain, request.job_id)).state):
            return None
        family = self._families[request.domain]
        number = admission.number
        message_id = self._streams.xadd(
            _log(request.domain, request.job_id),
            {
                "request_id": request.request_id,
                "kind": request.kind.value,
                "body": request.body.decode(),
                "number": str(number),
            },
        )
        first = FirstMessage(message_id, number, request.kind)
        controls.by_request[(request.sender, request.request_id)] = first
        controls.messages[message_id] = ControlMessage(
            request.domain,
            request.job_id,
            message_id,
            number,
            request.kind,
            request.request_id,
            json.loads(request.body),
        )
        controls.sizes[message_id] = len(request.body)
        controls.version += 1
        controls.waiting += 1
        controls.waiting_bytes += len(request.body)
        if admission.bucket is not None:
            controls.buckets[request.sender] = admission.bucket
        if request.kind is ControlKind.CANCEL and controls.cancel is None:
            controls.cancel = first
        now = self._clock.now_ms()
        controls.expires_ms = now + self._ttl_ms
        fields = lifecycle_fields(request, message_id, number, f"{now / 1000:.3f}")
        self._streams.xadd(family.stream_for(request.job_id), fields)
        return message_id

    async def deliver(
        self, domain: str, job_id: str, *, after: str = "0-0", limit: int = 100
    ) -> PendingControls:
        if await self._ended(domain, job_id):
            return PendingControls(ended=True)
        controls = self._controls(domain, job_id)
        floor = StreamEntryId.parse(after)
        # Acknowledged messages have left the log, as on Redis.
        later = [
            m
            for m in controls.messages.values()
            if m.state is not ControlState.ACKNOWLEDGED
            and StreamEntryId.parse(m.message_id) > floor
        ]
        more = len(later) >= limit
        later = later[:limit]
        handed = []
        for message in later:
            updated = replace(
                message, state=ControlState.DELIVERED, deliveries=message.deliveries + 1
            )
            controls.messages[message.message_id] = updated
            handed.append(updated)
        return PendingControls(tuple(handed), later[-1].message_id if later else after, more=more)

    async def acknowledge(self, domain: str, job_id: str, message_id: str) -> bool:
        controls = self._controls(domain, job_id)
        message = controls.messages.get(message_id)
        if message is None:
            return False
        if message.state is not ControlState.ACKNOWLEDGED:
            controls.messages[message_id] = replace(
                message, state=ControlState.ACKNOWLEDGED, body={}
            )
            self._streams.delete_entry(_log(domain, job_id), message_id)
            controls.version += 1
            controls.waiting -= 1
            controls.waiting_bytes -= controls.sizes[message_id]
        return True

    async def cancelled(self, domain: str, job_id: str) -> bool:
        return self._controls(domain, job_id).cancel is not None

    async def wait(self, domain: str, job_id: str, *, after: str, timeout_s: float) -> None:
        await self._streams.wait_for_entries({_log(domain, job_id): after}, timeout_s)

    async def messages(self, domain: str, job_id: str, *, limit: int = 50) -> ControlLogPage:
        controls = self._controls(domain, job_id)
        latest = list(controls.messages.values())[-limit:] if limit > 0 else []
        return ControlLogPage(
            total=len(controls.messages),
            waiting=controls.waiting,
            waiting_bytes=controls.waiting_bytes,
            messages=tuple(
                ControlSummary(
                    number=m.number,
                    message_id=m.message_id,
                    kind=m.kind,
                    request_id=m.request_id,
                    state=m.state,
                    deliveries=m.deliveries,
                    size=controls.sizes[m.message_id],
                    preview=None
                    if m.state is ControlState.ACKNOWLEDGED
                    else _preview(self._body(domain, job_id, m.message_id)),
                )
                for m in latest
            ),
        )

    async def _ended(self, domain: str, job_id: str) -> bool:
        return _ended((await self._states.view(domain, job_id)).state)

    def _body(self, domain: str, job_id: str, message_id: str) -> bytes:
        for entry_id, fields in self._streams.entries(_log(domain, job_id)):
            if entry_id == message_id:
                return fields[b"body"]
        return b""

    def _controls(self, domain: str, job_id: str, *, keep: bool = False) -> _Controls:
        """The job's control state; kept only when `keep` (a write), as no read leaves a key."""
        key = (domain, job_id)
        controls = self._jobs.get(key)
        if controls is not None and self._clock.now_ms() >= controls.expires_ms:
            self._streams.delete_stream(_log(domain, job_id))
            del self._jobs[key]
            controls = None
        if controls is None:
            controls = _Controls()
            if keep:
                self._jobs[key] = controls
        return controls


def _ended(state: bytes | str | None) -> bool:
    return has_ended(None if state is None else json.loads(state))


def _preview(body: bytes) -> str:
    return body[:PREVIEW_BYTES].decode(errors="ignore")


def _log(domain: str, job_id: str) -> str:
    """The job's control log among the in-memory streams."""
    return f"{domain}:control:{job_id}"
