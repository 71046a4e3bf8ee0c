"""The routed event the baseline routers publish, shaped like the worker's."""

from __future__ import annotations

from typing import Any

import orjson

RESERVED_FIELDS = frozenset({"job_id", "stage", "status", "seq", "ts", "progress", "result"})


def routed_payload(
    entry_id: str, fields: dict[bytes, bytes], domain: str
) -> tuple[str, int, bytes] | None:
    """(job_id, seq, JSON payload) of one entry, or None if it cannot parse."""
    try:
        text = {name.decode(): value.decode() for name, value in fields.items()}
        job_id = text["job_id"]
        seq = int(text["seq"])
        message: dict[str, Any] = {
            name: value for name, value in text.items() if name not in RESERVED_FIELDS
        }
        message["job_id"] = job_id
        message["seq"] = seq
        for name in ("stage", "status", "ts"):
            if name in text:
                message[name] = text[name]
        if text.get("progress"):
            message["progress"] = int(text["progress"])
        if "result" in text:
            message["result"] = orjson.loads(text["result"])
        message["stream_id"] = entry_id
        message["domain"] = domain
        return job_id, seq, orjson.dumps(message)
    except (KeyError, ValueError, TypeError):
        return None
