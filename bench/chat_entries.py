"""What the chat benchmark writes: a chat worker's entries, written fast, paced or at once.

An answer is the reference chat worker's sequence on its job's shard of `chat:events`:
`queued` (seq 0), `answer` `started` (160), tokens (`stage=token`, `status=streaming`,
seq 1001, 1002, ..., `content` a delta, `node=answer`), `answer` `completed` (161) and `done`
`completed` (181). Token n (1-based) carries the content ` t<n>`, so a viewer can tell
every token apart by its text alone, whatever else the routed payload holds or leaves out,
and the whole answer is ` t1 t2 ... t<n>`. `ts` is the writer's clock (seconds, as the
producer SDK writes it, with microseconds) when the entry's pipeline was built: a viewer's
latency runs from there.

Entries go out through one raw RESP connection, pipelined (one write for many XADDs, then
one reply each): a 30,000 tokens/s worker fleet is one process of this bench, not several.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Self, cast
from urllib.parse import urlsplit

import hiredis

from bench.pacing import Pacer
from eco_router.domain.event import FIRST_TOKEN_SEQ, TOKEN_STAGE
from eco_router.domain.streams import StreamFamily

CHAT = StreamFamily("chat:events", 4)
NODE = "answer"
# Entries kept per shard: far more than the routers lag behind by, so nothing is trimmed
# before it is read (the SDK's 10,000 is ~1.3 s of a shard at 30,000 tokens/s over four).
DEFAULT_MAXLEN = 1_000_000
WRITE_CHUNK = 2_000
# At most this many entries per tick of a paced writer that fell behind its schedule.
MAX_CATCH_UP = 5_000

Entry = tuple[str, dict[str, str]]


def token_content(n: int) -> str:
    """The delta of token `n` (1-based): unique within its answer."""
    return f" t{n}"


def token_number(content: str) -> int | None:
    """The n of a `token_content`, or None for any other text."""
    digits = content[2:]
    return int(digits) if content.startswith(" t") and digits.isdigit() else None


def answer_text(tokens: int) -> str:
    """An answer's whole text after its first `tokens` tokens."""
    return "".join(token_content(n) for n in range(1, tokens + 1))


def token_seq(n: int) -> int:
    return FIRST_TOKEN_SEQ + n - 1


def now_ts() -> str:
    return f"{time.time():.6f}"


def token_entry(job_id: str, n: int, ts: str, *, stage: str = TOKEN_STAGE) -> Entry:
    """Token `n` of `job_id`; `stage` "delta" gives the same fields as a stage event."""
    fields = {
        "job_id": job_id,
        "stage": stage,
        "status": "streaming",
        "seq": str(token_seq(n)),
        "ts": ts,
        "content": token_content(n),
        "node": NODE,
    }
    return CHAT.stream_for(job_id), fields


def _stage_entry(job_id: str, stage: str, status: str, seq: int, ts: str) -> Entry:
    fields = {"job_id": job_id, "stage": stage, "status": status, "seq": str(seq), "ts": ts}
    if stage == NODE:
        fields["node"] = NODE
    return CHAT.stream_for(job_id), fields


def opening_entries(job_id: str) -> list[Entry]:
    """What the worker writes before the first token: queued, then the answer started."""
    ts = now_ts()
    return [
        _stage_entry(job_id, "queued", "queued", 0, ts),
        _stage_entry(job_id, NODE, "started", 160, ts),
    ]


def closing_entries(job_id: str) -> list[Entry]:
    """What the worker writes after the last token: the answer completed, then done."""
    ts = now_ts()
    return [
        _stage_entry(job_id, NODE, "completed", 161, ts),
        _stage_entry(job_id, "done", "completed", 181, ts),
    ]


class EntryWriter:
    """XADD over one raw RESP connection to the server of a `redis://host:port` URL."""

    def __init__(self, url: str, *, maxlen: int = DEFAULT_MAXLEN) -> None:
        address = urlsplit(url)
        self._sock = socket.create_connection((address.hostname or "127.0.0.1", address.port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader = hiredis.Reader()
        self._maxlen = str(maxlen).encode()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._sock.close()

    def write(self, entries: Sequence[Entry]) -> None:
        """XADD every entry, in order, pipelined; raises on the first error reply."""
        for start in range(0, len(entries), WRITE_CHUNK):
            chunk = entries[start : start + WRITE_CHUNK]
            self._sock.sendall(b"".join(self._xadd(stream, fields) for stream, fields in chunk))
            self._replies(len(chunk))

    def _xadd(self, stream: str, fields: dict[str, str]) -> bytes:
        args = [b"XADD", stream.encode(), b"MAXLEN", b"~", self._maxlen, b"*"]
        for name, value in fields.items():
            args += (name.encode(), value.encode())
        # hiredis's stub types the argument as a 1-tuple; it takes any number.
        packed: bytes = hiredis.pack_command(cast(Any, tuple(args)))
        return packed

    def _replies(self, count: int) -> None:
        while count:
            reply = self._reader.gets()
            if reply is False:
                data = self._sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("the streams server closed the connection")
                self._reader.feed(data)
            elif isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(f"XADD failed: {reply}")
            else:
                count -= 1


@dataclass(frozen=True, slots=True)
class AnswersWritten:
    """What a paced run of answers wrote: its tokens in all, and over how long."""

    tokens: int
    answers: int
    seconds: float
    cpu_s: float  # the writer's own CPU over those seconds

    def tokens_of(self, answer: int) -> int:
        """How many tokens answer number `answer` got (round-robin: the first ones one more)."""
        return self.tokens // self.answers + (1 if answer < self.tokens % self.answers else 0)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def write_answers(
    url: str, job_ids: Sequence[str], rate: int, seconds: float, maxlen: int = DEFAULT_MAXLEN
) -> AnswersWritten:
    """Producer process: every job's opening entries, then `rate` tokens/s for each job for
    `seconds` (round-robin, so each answer's tokens are evenly spaced), then every job's
    closing entries. Run in a process of its own (`ProducerProcess`)."""
    answers = len(job_ids)
    with EntryWriter(url, maxlen=maxlen) as writer:
        cpu = time.process_time()
        writer.write(_all(opening_entries(job) for job in job_ids))
        pacer = Pacer(rate * answers, seconds, max_batch=MAX_CATCH_UP)
        while not pacer.finished:
            ts = now_ts()
            due = pacer.due()
            writer.write([token_entry(job_ids[n % answers], n // answers + 1, ts) for n in due])
            time.sleep(pacer.pause_s())
        elapsed, cpu = pacer.elapsed_s(), time.process_time() - cpu
        writer.write(_all(closing_entries(job) for job in job_ids))
    return AnswersWritten(pacer.sent, answers, elapsed, cpu)


def _all(groups: Iterable[list[Entry]]) -> list[Entry]:
    return [entry for group in groups for entry in group]
