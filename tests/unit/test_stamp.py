"""`stamp`: the fields put first in a routed event's JSON, in one order whatever is set."""

from __future__ import annotations

import json
from typing import Any

import pytest

from eco_router.domain.text import TextCheck, stamp

CHECK = TextCheck(3, "a9993e364706816aba3e25717850c26c9cd0d89d", truncated=False)


@pytest.mark.parametrize("prev_id", [None, 7])
@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize("check", [None, CHECK])
def test_the_fields_are_the_id_the_previous_id_the_restart_and_the_check_in_order(
    prev_id: int | None, restart: bool, check: TextCheck | None
) -> None:
    expected: dict[str, Any] = {"event_id": 8}
    if prev_id is not None:
        expected["prev_event_id"] = prev_id
    if restart:
        expected["restart"] = True
    if check is not None:
        expected["text_check"] = {"bytes": 3, "sha1": check.sha1, "truncated": False}

    fields = stamp(8, prev_id, restart=restart, text_check=check)

    assert fields == json.dumps(expected, separators=(",", ":"))[1:-1].encode() + b","
