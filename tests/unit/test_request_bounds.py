"""The rules behind the gateway's bounds on a request and on connections per address."""

from __future__ import annotations

import pytest

from eco_router.entrypoints.http.request_bounds import (
    ClientConnections,
    HeadMeter,
    TrustedAddresses,
    declared_body_bytes,
    refusal,
)
from eco_router.entrypoints.http.request_limits import RequestLimits


def make_limits(**overrides: int) -> RequestLimits:
    values = {"max_head_bytes": 200, "max_request_line_bytes": 40, "max_headers": 3}
    return RequestLimits(**(values | overrides))


def fed(meter: HeadMeter, *chunks: bytes) -> list[int]:
    return [meter.take(chunk) for chunk in chunks]


class TestHeadMeter:
    def test_a_head_within_every_limit_is_taken_whole(self) -> None:
        head = b"GET /a HTTP/1.1\r\nHost: x\r\nA: 1\r\nB: 2\r\n\r\n"

        assert fed(HeadMeter(make_limits()), head) == [len(head)]

    def test_a_head_is_cut_at_its_byte_limit_across_chunks_and_refused_with_431(self) -> None:
        meter = HeadMeter(make_limits())

        taken = fed(meter, b"GET / HTTP/1.1\r\n", b"X: " + b"a" * 300)

        assert taken == [16, 200 - 16]
        assert meter.refusal() == 431

    def test_a_request_line_past_its_limit_is_cut_and_refused_with_414(self) -> None:
        meter = HeadMeter(make_limits())

        taken = fed(meter, b"GET /" + b"a" * 30, b"a" * 30 + b" HTTP/1.1\r\n")

        assert sum(taken) == 40 + 2  # the line's limit and its CRLF
        assert meter.refusal() == 414

    def test_a_request_line_at_its_limit_is_taken(self) -> None:
        line = b"GET /" + b"a" * 35 + b"\r\n"  # 40 bytes and the CRLF

        assert fed(HeadMeter(make_limits()), line + b"Host: x\r\n\r\n") == [len(line) + 11]

    def test_past_the_header_count_the_head_is_cut_after_the_last_line_allowed(self) -> None:
        meter = HeadMeter(make_limits())
        head = b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n"

        taken = meter.take(head)

        # The request line, three headers, and one more line that could have ended the head.
        assert head[:taken] == b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n"
        assert meter.refusal() == 431

    def test_a_body_after_the_head_in_the_same_chunk_is_left_for_the_parser(self) -> None:
        # The meter stops at a limit: the caller feeds the parser that much, sees the head
        # complete, and sends the rest on unmetered.
        head = b"POST / HTTP/1.1\r\nContent-Length: 500\r\n\r\n"
        chunk = head + b"\n" * 500

        taken = HeadMeter(make_limits()).take(chunk)

        assert len(head) <= taken < len(chunk)

    def test_reset_starts_the_next_head_from_nothing(self) -> None:
        meter = HeadMeter(make_limits())
        meter.take(b"GET / HTTP/1.1\r\nA: " + b"a" * 150)

        meter.reset()

        assert meter.take(b"GET /" + b"a" * 20 + b" HTTP/1.1\r\n") == 36


class TestAnswers:
    @pytest.mark.parametrize("status", [408, 413, 414, 431])
    def test_a_refusal_is_a_whole_response_that_closes_the_connection(self, status: int) -> None:
        answer = refusal(status, [(b"server", b"uvicorn")])

        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d " % status)
        assert b"\r\nserver: uvicorn\r\n" in head
        assert b"\r\nconnection: close" in head
        assert b"content-length: %d" % len(body) in head

    def test_the_declared_body_is_the_content_length(self) -> None:
        assert declared_body_bytes([(b"host", b"x"), (b"content-length", b"70000")]) == 70_000
        assert declared_body_bytes([(b"host", b"x")]) == 0
        assert declared_body_bytes([(b"content-length", b"lots")]) == 0


class TestConnectionsPerAddress:
    def test_past_the_cap_an_address_is_refused_until_one_of_its_connections_closes(
        self,
    ) -> None:
        clients = ClientConnections(2)

        admitted = [clients.admit("10.0.0.1") for _ in range(3)]
        elsewhere = clients.admit("10.0.0.2")
        clients.release("10.0.0.1")
        again = clients.admit("10.0.0.1")

        assert admitted == [True, True, False]
        assert (elsewhere, again) == (True, True)
        assert clients.open_connections("10.0.0.1") == 2

    def test_an_address_whose_connections_all_closed_is_forgotten(self) -> None:
        clients = ClientConnections(2)
        clients.admit("10.0.0.1")

        clients.release("10.0.0.1")

        assert clients.open_connections("10.0.0.1") == 0
        assert clients._open == {}  # no entry left per address ever seen

    def test_zero_is_no_cap(self) -> None:
        clients = ClientConnections(0)

        assert all(clients.admit("10.0.0.1") for _ in range(10_000))

    def test_a_trusted_proxy_is_never_capped(self) -> None:
        clients = ClientConnections(1, TrustedAddresses("10.1.0.0/16, 127.0.0.1"))

        assert all(clients.admit("10.1.2.3") for _ in range(5))
        assert all(clients.admit("127.0.0.1") for _ in range(5))
        assert [clients.admit("10.2.0.1") for _ in range(2)] == [True, False]


class TestTrustedAddresses:
    @pytest.mark.parametrize(
        ("spec", "host", "trusted"),
        [
            ("127.0.0.1,::1", "127.0.0.1", True),
            ("127.0.0.1,::1", "::1", True),
            ("127.0.0.1,::1", "127.0.0.2", False),
            ("10.0.0.0/8", "10.200.0.1", True),
            ("10.0.0.0/8", "11.0.0.1", False),
            ("*", "203.0.113.9", True),
            ("/run/gateway.sock", "/run/gateway.sock", True),
            ("", "127.0.0.1", False),
        ],
    )
    def test_addresses_are_read_as_uvicorn_reads_forwarded_allow_ips(
        self, spec: str, host: str, trusted: bool
    ) -> None:
        assert (host in TrustedAddresses(spec)) is trusted

    def test_a_list_is_read_like_the_comma_separated_string(self) -> None:
        assert "10.0.0.1" in TrustedAddresses(["192.0.2.1", "10.0.0.0/8"])
