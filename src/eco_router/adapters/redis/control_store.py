"""Redis adapter of `ControlStore`, and a worker's blocking inbox on the same scripts."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import redis

from eco_router.adapters.redis.connections.connection import RedisClient
from eco_router.adapters.redis.connections.replica_wait import ReplicaWait
from eco_router.adapters.redis.errors import redis_errors
from eco_router.adapters.redis.keys import JobKeys
from eco_router.adapters.redis.scripts import load_lua
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
)
from eco_router.domain.control_reading import ControlReading, Deliver, KnownCancels
from eco_router.domain.streams import StreamFamily

# A read's page of waiting messages; the bounds keep a log to about this many.
DELIVER_LIMIT = 100
# `EVENT_ROUTER_STATE_TTL_S`'s default: a worker's inbox records nothing, and needs none.
DEFAULT_STATE_TTL_S = 3600
# The shard streams' approximate MAXLEN, as the producer SDK keeps them.
SHARD_MAXLEN = 10_000


class ControlKeys:
    """Where a domain's jobs keep their control messages: the family's layout decides."""

    def __init__(self, families: Sequence[StreamFamily]) -> None:
        self._families = {f.domain: f for f in families}

    def of(self, domain: str, job_id: str) -> tuple[JobKeys, str]:
        """The job's keys and its shard stream."""
        family = self._families[domain]
        return JobKeys.in_family(family, job_id), family.stream_for(job_id)


def request_field(request: ControlRequest) -> str:
    """The control state's field that remembers a sender's request id."""
    return f"request:{request.sender}:{request.request_id}"


def rate_field(request: ControlRequest) -> str:
    """The control state's field that holds a sender's rate bucket."""
    return f"rate:{request.sender}"


def read_arguments(
    request: ControlRequest, keys: ControlKeys
) -> tuple[list[str], list[str | int | bytes]]:
    """KEYS and ARGV of `read_control.lua`."""
    job, _ = keys.of(request.domain, request.job_id)
    return [job.state, job.history, job.markers, job.control_state], [
        request_field(request),
        rate_field(request),
    ]


def control_log(reply: Sequence[Any]) -> ControlLog:
    """`read_control.lua`'s reply as what the rules judge."""
    known, state, version, count, waiting, waiting_bytes, first, cancel, cancel_n, bucket = reply
    return ControlLog(
        known=int(known) > 0,
        ended=state is not None and has_ended(_state(state)),
        version=int(version or 0),
        count=int(count or 0),
        waiting=int(waiting or 0),
        waiting_bytes=int(waiting_bytes or 0),
        first=FirstMessage.decode(None if first is None else _text(first)),
        cancel=None
        if cancel is None
        else FirstMessage(_text(cancel), int(cancel_n or 0), ControlKind.CANCEL),
        bucket=RateBucket.decode(None if bucket is None else _text(bucket)),
    )


def append_arguments(
    request: ControlRequest,
    admission: Admission,
    keys: ControlKeys,
    *,
    version: int,
    state_ttl_s: int,
    now_ms: int,
) -> tuple[list[str], list[str | int | bytes]]:
    """KEYS and ARGV of `record_control.lua`."""
    job, stream = keys.of(request.domain, request.job_id)
    args: list[str | int | bytes] = [
        version,
        request_field(request),
        request.request_id,
        request.kind.value,
        request.body,
        len(request.body),
        admission.number,
        rate_field(request),
        "" if admission.bucket is None else admission.bucket.encode(),
        state_ttl_s,
        SHARD_MAXLEN,
        request.job_id,
        request.kind.stage,
        request.kind.status,
        f"{now_ms / 1000:.3f}",
    ]
    return [stream, job.state, job.control, job.control_state], args


def appended(reply: Sequence[Any]) -> str | None:
    """`record_control.lua`'s reply: the new message's id, or None when nothing was written."""
    return _text(reply[1]) if _text(reply[0]) == "new" else None


def pending(domain: str, job_id: str, reply: Sequence[Any]) -> PendingControls:
    """`deliver_control.lua`'s reply as the messages handed."""
    if int(reply[0]) == 1:
        return PendingControls(ended=True)
    messages = tuple(
        _message(domain, job_id, _text(entry_id), _fields(raw), ControlState.DELIVERED, int(n))
        for entry_id, raw, n in reply[2]
    )
    return PendingControls(messages, _text(reply[1]), more=int(reply[3]) == 1)


def log_page(reply: Sequence[Any]) -> ControlLogPage:
    """`list_control.lua`'s reply as the console's page."""
    count, waiting, waiting_bytes, rows = reply
    return ControlLogPage(
        total=int(count),
        waiting=int(waiting),
        waiting_bytes=int(waiting_bytes),
        messages=tuple(
            ControlSummary(
                number=int(number),
                message_id=_text(message_id),
                kind=ControlKind(_text(kind)),
                request_id=_text(request_id),
                state=ControlState(_text(state)),
                deliveries=int(deliveries),
                size=int(size),
                preview=None if preview is None else _text_lenient(preview),
            )
            for message_id, number, kind, state, deliveries, size, request_id, preview in rows
        ),
    )


class RedisControlStore(ControlStore):
    """Control messages on the streams server: `read_control.lua` reads what the rules judge,
    `record_control.lua` writes a message and its announcement together if nothing moved,
    `deliver_control.lua` hands them out, `acknowledge_control.lua` retires them;
    a blocking XREAD on the log waits for the next one. With `replica_wait`, a
    record returns only once that many replicas have it (`ReplicasBehind` otherwise: it is
    written, and the same request id answers it)."""

    def __init__(
        self,
        client: RedisClient,
        *,
        families: Sequence[StreamFamily],
        state_ttl_s: int = DEFAULT_STATE_TTL_S,
        clock: Clock,
        replica_wait: ReplicaWait | None = None,
    ) -> None:
        self._client = client
        self._replica_wait = replica_wait or ReplicaWait()
        self._keys = ControlKeys(families)
        self._state_ttl_s = state_ttl_s
        self._clock = clock
        self._read = client.register_script(load_lua("read_control.lua"))
        self._record = client.register_script(load_lua("record_control.lua"))
        self._list = client.register_script(load_lua("list_control.lua"))
        self._deliver = client.register_script(load_lua("deliver_control.lua"))
        self._acknowledge = client.register_script(load_lua("acknowledge_control.lua"))

    async def control_log(self, request: ControlRequest) -> ControlLog:
        keys, args = read_arguments(request, self._keys)
        with redis_errors("read control log", key=keys[3]):
            return control_log(await self._read(keys=keys, args=args))

    async def append(
        self, request: ControlRequest, admission: Admission, *, version: int
    ) -> str | None:
        keys, args = append_arguments(
            request,
            admission,
            self._keys,
            version=version,
            state_ttl_s=self._state_ttl_s,
            now_ms=self._clock.now_ms(),
        )
        with redis_errors("record control message", key=keys[2]):
            reply = await self._replica_wait.call(self._client, self._record, keys, args)
        return appended(reply)

    async def deliver(
        self, domain: str, job_id: str, *, after: str = "0-0", limit: int = DELIVER_LIMIT
    ) -> PendingControls:
        job, _ = self._keys.of(domain, job_id)
        with redis_errors("deliver control messages", key=job.control):
            reply = await self._deliver(**deliver_call(job, after=after, limit=limit))
        return pending(domain, job_id, reply)

    async def acknowledge(self, domain: str, job_id: str, message_id: str) -> bool:
        job, _ = self._keys.of(domain, job_id)
        with redis_errors("acknowledge control message", key=job.control_state):
            return bool(await self._acknowledge(**acknowledge_call(job, message_id)))

    async def cancelled(self, domain: str, job_id: str) -> bool:
        job, _ = self._keys.of(domain, job_id)
        with redis_errors("read cancel", key=job.control_state):
            return bool(await self._client.hexists(job.control_state, "cancel"))

    async def wait(self, domain: str, job_id: str, *, after: str, timeout_s: float) -> None:
        job, _ = self._keys.of(domain, job_id)
        with redis_errors("wait for control messages", key=job.control):
            await self._client.xread(**wait_call(job, after, timeout_s))

    async def messages(self, domain: str, job_id: str, *, limit: int = 50) -> ControlLogPage:
        job, _ = self._keys.of(domain, job_id)
        with redis_errors("read control messages", key=job.control):
            reply = await self._list(
                keys=[job.control_state, job.control], args=[limit, PREVIEW_BYTES]
            )
        return log_page(reply)


class BlockingControlInbox:
    """`ControlInbox` for synchronous code (a Celery task): the same loop
    (`ControlReading`) and scripts, on a blocking client; redis-py's errors as they come, as
    the blocking publisher raises them."""

    def __init__(
        self, client: redis.Redis | redis.cluster.RedisCluster, family: StreamFamily
    ) -> None:
        self._client = client
        self._domain = family.domain
        self._keys = ControlKeys([family])
        self._deliver = client.register_script(load_lua("deliver_control.lua"))
        self._acknowledge = client.register_script(load_lua("acknowledge_control.lua"))
        self._cancels = KnownCancels()

    def cancelled(self, job_id: str) -> bool:
        """As `ControlInbox.cancelled`."""
        if self._cancels.known(job_id):
            return True
        job, _ = self._keys.of(self._domain, job_id)
        return self._cancels.read(job_id, bool(self._client.hexists(job.control_state, "cancel")))

    def messages(self, job_id: str, *, timeout_s: float | None = None) -> Iterator[ControlMessage]:
        """As `ControlInbox.messages`."""
        job, _ = self._keys.of(self._domain, job_id)
        reading = ControlReading(timeout_s=timeout_s, now=time.monotonic())
        while (step := reading.next_step(time.monotonic())) is not None:
            if isinstance(step, Deliver):
                reply = self._deliver(**deliver_call(job, after=step.after))
                yield from reading.delivered(pending(self._domain, job_id, reply))
            else:
                self._client.xread(**wait_call(job, step.after, step.timeout_s))

    def next(self, job_id: str, *, timeout_s: float) -> ControlMessage | None:
        """As `ControlInbox.next`."""
        return next(iter(self.messages(job_id, timeout_s=timeout_s)), None)

    def acknowledge(self, message: ControlMessage) -> bool:
        """As `ControlInbox.acknowledge`."""
        job, _ = self._keys.of(message.domain, message.job_id)
        return bool(self._acknowledge(**acknowledge_call(job, message.message_id)))


def deliver_call(job: JobKeys, *, after: str, limit: int = DELIVER_LIMIT) -> dict[str, Any]:
    """`deliver_control.lua`'s keys and arguments."""
    return {"keys": [job.state, job.control, job.control_state], "args": [after, limit]}


def acknowledge_call(job: JobKeys, message_id: str) -> dict[str, Any]:
    """`acknowledge_control.lua`'s keys and arguments."""
    return {"keys": [job.control_state, job.control], "args": [message_id]}


def wait_call(job: JobKeys, after: str, timeout_s: float) -> dict[str, Any]:
    """XREAD's arguments that wait for the job's next control message after `after`."""
    return {"streams": {job.control: after}, "count": 1, "block": _block_ms(timeout_s)}


def _block_ms(timeout_s: float) -> int:
    # BLOCK 0 waits for ever: the shortest wait is a millisecond.
    return max(1, round(timeout_s * 1000))


def _message(
    domain: str,
    job_id: str,
    message_id: str,
    fields: Mapping[str, str],
    state: ControlState,
    deliveries: int,
) -> ControlMessage:
    return ControlMessage(
        domain=domain,
        job_id=job_id,
        message_id=message_id,
        number=int(fields["number"]),
        kind=ControlKind(fields["kind"]),
        request_id=fields["request_id"],
        body=json.loads(fields["body"]),
        state=state,
        deliveries=deliveries,
    )


def _fields(raw: Any) -> dict[str, str]:
    """A stream entry's fields, as XRANGE (a dict) or a script (a flat list) gives them."""
    if isinstance(raw, dict):
        return {_text(k): _text(v) for k, v in raw.items()}
    return {_text(raw[i]): _text(raw[i + 1]) for i in range(0, len(raw), 2)}


def _state(raw: Any) -> dict[str, Any] | None:
    try:
        state = json.loads(raw)
    except ValueError:
        return None
    return state if isinstance(state, dict) else None


def _text_lenient(value: bytes) -> str:
    # A preview cut inside a character keeps what it can.
    return value.decode(errors="ignore") if isinstance(value, bytes) else str(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
