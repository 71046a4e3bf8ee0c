"""Text made safe for a terminal: stored strings must not drive it (ANSI escapes, bidi tricks)."""

from __future__ import annotations

import logging


def printable(text: str) -> str:
    """`text` with every character `str.isprintable` refuses written as a JSON-style escape.

    Control characters (ESC, CR, newline, C1), format characters (bidi overrides, zero-width)
    and unassigned code points become `\\u001b` and the like, so a stored string cannot move
    the cursor, recolour or rewrite the operator's screen, or forge a line. The escapes are
    valid inside JSON strings, so a JSON line stays the same JSON.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # beyond the BMP: a UTF-16 surrogate pair, as JSON writes it
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """The count with its noun: `1 dead letter`, `2 dead letters`, `0 routers`."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


class PrintableFormatter(logging.Formatter):
    """Log lines whose message cannot drive the terminal; tracebacks keep their lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = printable(record.message)
        return super().formatMessage(record)
