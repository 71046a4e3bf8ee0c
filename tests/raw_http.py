"""A client's raw TCP connection to an HTTP server under test: bytes in, bytes out, for the
tests of what a server does with clients no HTTP library would be."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

# Only bounds how long a test waits for the server to act; never what it asserts.
PATIENCE_S = 20


def address_of(base_url: str) -> tuple[str, int]:
    """`http://host:port` as (host, port)."""
    host, port = base_url.removeprefix("http://").split(":")
    return host, int(port)


@contextlib.asynccontextmanager
async def connected(
    address: tuple[str, int],
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection(*address)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (nothing, if it resets it)."""
    try:
        return await asyncio.wait_for(reader.read(), PATIENCE_S)
    except ConnectionResetError:
        return b""
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open {PATIENCE_S} s") from None
