"""Where a connection's bytes stand among its requests, as the gateway reads them before the
server does."""

from __future__ import annotations

import pytest

from eco_router.entrypoints.http.request_framing import FramingError, Phase, RequestFraming

GET = b"GET /a HTTP/1.1\r\nHost: g\r\n\r\n"


def post(body: bytes, *headers: bytes) -> bytes:
    return (
        b"POST /a HTTP/1.1\r\nHost: g\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body
    )


def fed(*chunks: bytes, max_body_bytes: int = 100) -> RequestFraming:
    framing = RequestFraming(max_body_bytes)
    for chunk in chunks:
        assert framing.feed(chunk) is None
    return framing


class TestPhases:
    def test_a_request_without_a_body_ends_between_requests(self) -> None:
        framing = fed(GET)

        assert (framing.phase, framing.heads) == (Phase.BETWEEN, 1)

    def test_a_head_is_under_way_from_its_first_byte_to_its_blank_line(self) -> None:
        framing = fed(b"G")
        assert framing.phase is Phase.HEAD

        framing.feed(b"ET /a HTTP/1.1\r\nHost: g\r\n")
        assert (framing.phase, framing.heads) == (Phase.HEAD, 0)

        framing.feed(b"\r\n")
        assert (framing.phase, framing.heads) == (Phase.BETWEEN, 1)

    def test_a_body_is_under_way_from_its_head_to_its_last_byte(self) -> None:
        framing = fed(post(b"12", b"Content-Length: 5"))
        assert (framing.phase, framing.heads, framing.body_bytes) == (Phase.BODY, 1, 2)

        framing.feed(b"345")
        assert (framing.phase, framing.body_bytes) == (Phase.BETWEEN, 5)

    def test_pipelined_requests_are_each_counted_and_the_next_one_begun(self) -> None:
        framing = fed(GET + post(b"abc", b"Content-Length: 3") + GET + b"GET /b HT")

        assert (framing.phase, framing.heads) == (Phase.HEAD, 3)

    def test_blank_lines_between_requests_begin_none(self) -> None:
        framing = fed(GET + b"\r\n")

        assert (framing.phase, framing.heads) == (Phase.BETWEEN, 1)


class TestBodies:
    def test_a_chunked_body_is_counted_as_its_bytes_not_its_chunks(self) -> None:
        framing = fed(post(b"5\r\nhello\r\n3\r\nabc\r\n", b"Transfer-Encoding: chunked"))

        assert (framing.phase, framing.body_bytes, framing.oversized) == (Phase.BODY, 8, 0)

    def test_the_first_request_whose_body_passes_the_limit_is_named(self) -> None:
        chunk = b"%x\r\n%s\r\n" % (60, b"a" * 60)
        framing = fed(
            post(b"abc", b"Content-Length: 3"),
            post(chunk * 2, b"Transfer-Encoding: chunked"),
            max_body_bytes=100,
        )

        assert (framing.heads, framing.oversized) == (2, 2)


class TestNotRead:
    def test_a_request_that_switches_protocols_says_where_it_ends(self) -> None:
        upgrade = b"GET /a HTTP/1.1\r\nHost: g\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"

        assert RequestFraming(100).feed(upgrade + b"\x81\x05hello") == len(upgrade)

    @pytest.mark.parametrize(
        "data",
        [
            b"HELLO THERE\r\n\r\n",
            post(b"", b"Content-Length: 3", b"Transfer-Encoding: chunked"),
            post(b"zz\r\n", b"Transfer-Encoding: chunked"),
        ],
    )
    def test_bytes_that_are_no_request_are_refused(self, data: bytes) -> None:
        with pytest.raises(FramingError):
            RequestFraming(100).feed(data)

    def test_bytes_after_a_request_that_closes_are_no_error(self) -> None:
        # As uvicorn reads them: the server answers the request and closes.
        closing = GET.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")

        assert (fed(closing + GET).heads, fed(closing, GET).heads) == (1, 2)
