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
    ControlKind,
    ControlMessage,
    ControlReceipt,
    ControlRequest,
    ControlState,
    PendingControls,
    Recorded,
    has_ended,
    lifecycle_fields,
)
from eco_router.domain.event import StreamEntryId
from eco_router.domain.streams import StreamFamily


@dataclass(slots=True)
class _Controls:
    """A job's control state, as the Redis hash holds it."""

    by_request: dict[str, str] = field(default_factory=dict)
    messages: dict[str, ControlMessage] = field(default_factory=dict)
    cancel: str | None = None
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

    async def record(self, request: ControlRequest) -> ControlReceipt:
        controls = self._controls(request.domain, request.job_id)
        known = controls.by_request.get(request.request_id)
        if known is not None:
            first = controls.messages[known]
            return ControlReceipt(
                Recorded.DUPLICATE, request.request_id, known, first.number, first.kind
            )
        if await self._ended(request.domain, request.job_id):
            return ControlReceipt(Recorded.ENDED, request.request_id)
        family = self._families[request.domain]
        number = len(controls.messages) + 1
        message_id = self._streams.xadd(
            _log(request.domain, request.job_id),
            {
                "request_id": request.request_id,
                "kind": request.kind.value,
                "body": request.body.decode(),
                "number": str(number),
            },
        )
        controls.by_request[request.request_id] = message_id
        controls.messages[message_id] = ControlMessage(
            request.domain,
            request.job_id,
            message_id,
            number,
            request.kind,
            request.request_id,
            json.loads(request.body),
        )
        if request.kind is ControlKind.CANCEL and controls.cancel is None:
            controls.cancel = message_id
        now = self._clock.now_ms()
        controls.expires_ms = now + self._ttl_ms
        fields = lifecycle_fields(request, message_id, number, f"{now / 1000:.3f}")
        self._streams.xadd(family.stream_for(request.job_id), fields)
        return ControlReceipt(Recorded.NEW, request.request_id, message_id, number, request.kind)

    async def deliver(
        self, domain: str, job_id: str, *, after: str = "0-0", limit: int = 100
    ) -> PendingControls:
        if await self._ended(domain, job_id):
            return PendingControls(ended=True)
        controls = self._controls(domain, job_id)
        floor = StreamEntryId.parse(after)
        later = [m for m in controls.messages.values() if StreamEntryId.parse(m.message_id) > floor]
        later = later[:limit]
        handed = []
        for message in later:
            if message.state is ControlState.ACKNOWLEDGED:
                continue
            updated = replace(
                message, state=ControlState.DELIVERED, deliveries=message.deliveries + 1
            )
            controls.messages[message.message_id] = updated
            handed.append(updated)
        return PendingControls(tuple(handed), later[-1].message_id if later else after)

    async def acknowledge(self, domain: str, job_id: str, message_id: str) -> bool:
        controls = self._controls(domain, job_id)
        message = controls.messages.get(message_id)
        if message is None:
            return False
        controls.messages[message_id] = replace(message, state=ControlState.ACKNOWLEDGED)
        return True

    async def cancelled(self, domain: str, job_id: str) -> bool:
        return self._controls(domain, job_id).cancel is not None

    async def wait(self, domain: str, job_id: str, *, after: str, timeout_s: float) -> None:
        await self._streams.wait_for_entries({_log(domain, job_id): after}, timeout_s)

    async def messages(self, domain: str, job_id: str) -> list[ControlMessage]:
        return list(self._controls(domain, job_id).messages.values())

    async def _ended(self, domain: str, job_id: str) -> bool:
        state = (await self._states.view(domain, job_id)).state
        return has_ended(None if state is None else json.loads(state))

    def _controls(self, domain: str, job_id: str) -> _Controls:
        key = (domain, job_id)
        controls = self._jobs.get(key)
        if controls is not None and self._clock.now_ms() >= controls.expires_ms:
            self._streams.delete_stream(_log(domain, job_id))
            controls = None
        if controls is None:
            controls = self._jobs[key] = _Controls()
        return controls


def _log(domain: str, job_id: str) -> str:
    """The job's control log among the in-memory streams."""
    return f"{domain}:control:{job_id}"
