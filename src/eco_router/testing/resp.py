"""A minimal synchronous RESP2 client, enough to drive and inspect throwaway servers."""

from __future__ import annotations

import socket
from typing import BinaryIO, TypeAlias

Reply: TypeAlias = "bytes | int | list[Reply] | None"

_HOST = "127.0.0.1"


class ReplyError(Exception):
    """The server answered a command with an error reply (``-ERR ...``, ``-LOADING ...``)."""


def encode_command(*args: str) -> bytes:
    """Encode one command as a RESP array of bulk strings."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


def read_reply(reader: BinaryIO) -> Reply:
    """Read one reply; simple and bulk strings come back as bytes, nil as None."""
    line = reader.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed mid-reply")
    kind, payload = line[:1], line[1:-2]
    if kind == b"+":
        return payload
    if kind == b"-":
        raise ReplyError(payload.decode(errors="replace"))
    if kind == b":":
        return int(payload)
    if kind == b"$":
        length = int(payload)
        if length < 0:
            return None
        data = reader.read(length + 2)
        if len(data) < length + 2:
            raise ConnectionError("connection closed mid-reply")
        return data[:length]
    if kind == b"*":
        count = int(payload)
        return None if count < 0 else [read_reply(reader) for _ in range(count)]
    raise ConnectionError(f"not a RESP2 reply: {line!r}")


def call(port: int, *args: str, timeout: float = 1.0) -> Reply:
    """Send one command to the loopback server on ``port`` over a fresh connection."""
    with (
        socket.create_connection((_HOST, port), timeout=timeout) as sock,
        sock.makefile("rb") as reader,
    ):
        sock.sendall(encode_command(*args))
        return read_reply(reader)


def text(reply: Reply) -> str:
    """A string or bulk-string reply as text."""
    if not isinstance(reply, bytes):
        raise TypeError(f"expected a string reply, got {reply!r}")
    return reply.decode()


def array(reply: Reply) -> list[Reply]:
    """An array reply as a list."""
    if not isinstance(reply, list):
        raise TypeError(f"expected an array reply, got {reply!r}")
    return reply


def fields(reply: Reply) -> dict[str, str]:
    """The ``name:value`` lines of an INFO or CLUSTER INFO reply."""
    lines = text(reply).splitlines()
    return dict(line.split(":", 1) for line in lines if ":" in line and not line.startswith("#"))


def pairs(reply: Reply) -> dict[str, str]:
    """A flat ``[name, value, name, value, ...]`` array (as SENTINEL REPLICAS gives) as a dict."""
    items = [text(item) for item in array(reply)]
    return dict(zip(items[::2], items[1::2], strict=True))
