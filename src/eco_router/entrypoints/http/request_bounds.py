"""Holding one request to its limits (`request_limits.py`) and one address to its connections:
the rules behind the gateway's connection guard (`connection_guard.py`), as values and pure
functions."""

from __future__ import annotations

import http
import ipaddress
from collections.abc import Iterable

from eco_router.entrypoints.http.request_limits import RequestLimits

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class HeadMeter:
    """Counts a request head's bytes and lines before the parser gets them, so that no head
    grows past the limits in any parser's buffers (httptools keeps every header it is given).

    `take(data)` is how much of `data` may go to the parser. If the parser has not finished
    the head once it has that much, and some of `data` is left, a limit was reached and
    `refusal()` is the status to answer. A head that ends inside `data` is not refused for
    what follows it (a body, or the next request): the caller meters only while the parser
    reads a head, and starts the meter again (`reset`) when the head is complete.
    """

    __slots__ = ("_bytes", "_limits", "_lines")

    def __init__(self, limits: RequestLimits) -> None:
        self._limits = limits
        self._bytes = 0
        self._lines = 0

    def reset(self) -> None:
        self._bytes = 0
        self._lines = 0

    def take(self, data: bytes) -> int:
        limits = self._limits
        allowed = min(len(data), max(limits.max_head_bytes - self._bytes, 0))
        if self._lines == 0:
            # The request line with its CRLF: the line's end must come within its limit.
            line_room = max(limits.max_request_line_bytes + 2 - self._bytes, 0)
            if data.find(b"\n", 0, min(allowed, line_room)) < 0:
                allowed = min(allowed, line_room)
        # The request line, the headers and the empty line that ends them.
        lines_left = limits.max_headers + 2 - self._lines
        lines = data.count(b"\n", 0, allowed)
        if lines > lines_left:
            end = -1
            for _ in range(lines_left):
                end = data.index(b"\n", end + 1)
            allowed, lines = end + 1, lines_left
        self._bytes += allowed
        self._lines += lines
        return allowed

    def refusal(self) -> int:
        """414 while the request line was not over, else 431."""
        return 414 if self._lines == 0 else 431


def refusal(status: int, headers: Iterable[tuple[bytes, bytes]] = ()) -> bytes:
    """A whole response for `status` that closes the connection, for a refusal written
    straight to the transport (no request's response is under way), with `headers` first."""
    phrase = http.HTTPStatus(status).phrase.encode()
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, phrase)]
    lines += [name + b": " + value + b"\r\n" for name, value in headers]
    lines.append(b"content-type: text/plain; charset=utf-8\r\n")
    lines.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(phrase))
    return b"".join(lines) + phrase


def declared_body_bytes(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """The request's Content-Length (header names in lower case, as uvicorn gives them); 0
    without one, or with one the parser will refuse."""
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


class TrustedAddresses:
    """The proxies uvicorn trusts with X-Forwarded-For (`FORWARDED_ALLOW_IPS`: addresses,
    networks, other literals such as a unix socket's name, or `*` for any), read the same way."""

    __slots__ = ("_any", "_literals", "_networks")

    def __init__(self, spec: str | Iterable[str]) -> None:
        items = spec.split(",") if isinstance(spec, str) else spec
        names = [item.strip() for item in items if item.strip()]
        self._any = "*" in names
        self._networks: list[_Network] = []
        self._literals: set[str] = set()
        for name in names:
            try:
                self._networks.append(ipaddress.ip_network(name, strict=False))
            except ValueError:
                self._literals.add(name)

    def __contains__(self, host: str) -> bool:
        if self._any or host in self._literals:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self._networks)


class ClientConnections:
    """Open connections per client address (the TCP peer), counted as they open and close in
    O(1); past `max_per_client` a new one is refused. 0 means no cap. A trusted proxy's
    connections carry many clients: they are never refused here (its own limits apply)."""

    __slots__ = ("_max", "_open", "_proxies")

    def __init__(self, max_per_client: int, proxies: TrustedAddresses | None = None) -> None:
        self._max = max_per_client
        self._proxies = proxies if proxies is not None else TrustedAddresses(())
        self._open: dict[str, int] = {}

    def admit(self, host: str) -> bool:
        """Count one more connection from `host`, unless it is one too many."""
        held = self._open.get(host, 0)
        if self._max and held >= self._max and host not in self._proxies:
            return False
        self._open[host] = held + 1
        return True

    def release(self, host: str) -> None:
        held = self._open.pop(host, 0) - 1
        if held > 0:
            self._open[host] = held

    def open_connections(self, host: str) -> int:
        return self._open.get(host, 0)
