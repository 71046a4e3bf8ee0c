"""What reaches a terminal: stored strings cannot drive it, whatever they hold."""

from __future__ import annotations

import io
import json
import logging
import sys

from hypothesis import given
from hypothesis import strategies as st

from eco_router.entrypoints.operator_commands import say
from eco_router.entrypoints.terminal_text import PrintableFormatter, printable


def test_plain_text_and_non_latin_scripts_are_left_as_they_are() -> None:
    assert printable("vision completed 25% — 분석 완료 🐈") == "vision completed 25% — 분석 완료 🐈"


def test_escape_sequences_and_bidi_overrides_are_written_as_escapes() -> None:
    assert (
        printable("a\x1b[2Jb\x9b31m\u202ec\r\n") == "a\\u001b[2Jb\\u009b31m\\u202ec\\u000d\\u000a"
    )


@given(st.text())
def test_nothing_unprintable_survives_and_json_lines_keep_their_meaning(text: str) -> None:
    line = json.dumps({"value": text}, ensure_ascii=False)

    safe = printable(line)

    assert safe.isprintable()
    assert json.loads(safe) == {"value": text}


def test_say_prints_one_safe_line() -> None:
    out = io.StringIO()

    say("job \x1b]0;owned\x07 done", out)

    assert out.getvalue() == "job \\u001b]0;owned\\u0007 done\n"


def test_log_messages_are_made_printable_and_tracebacks_keep_their_lines() -> None:
    formatter = PrintableFormatter("%(levelname)s %(message)s")
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "t", logging.WARNING, __file__, 1, "entry %s\nFAKE line", ("\x1b[31m",), None
        )
        record.exc_info = sys.exc_info()

    text = formatter.format(record)

    first, *rest = text.split("\n")
    assert first == "WARNING entry \\u001b[31m\\u000aFAKE line"
    assert rest[0] == "Traceback (most recent call last):"
