"""What a JSON value must be to travel as an event's `result`: the one rule the router routes
by and the gateway admits control bodies by, so that what one accepts the other never refuses."""

from __future__ import annotations

import json
import math
import re

from eco_router.domain.rejection import RejectReason

# Results are records, not trees: a bound well inside what every JSON library here can nest.
MAX_RESULT_DEPTH = 64
# The widest integers the payload encoder writes exactly (a signed or an unsigned 64-bit one).
MIN_RESULT_INT = -(2**63)
MAX_RESULT_INT = 2**64 - 1
# The cheap scans that say a value needs the full walk: an escaped surrogate (a lone one has
# no UTF-8 form), a run of digits long enough to leave 64 bits, or enough brackets to nest.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONG_DIGITS = re.compile(r"[0-9]{19}")


class InvalidResult(ValueError):
    """A `result` that cannot be routed; `reason` names it for the dead-letter stream."""

    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def parse_result(text: str) -> object:
    """The JSON value `text` holds, or `InvalidResult` saying in one line why it cannot be
    routed: not JSON, a number beyond a double (`1e999`, `NaN`), an integer beyond 64 bits,
    nesting deeper than `MAX_RESULT_DEPTH`, or a string with an unpaired surrogate."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except InvalidResult:
        raise
    except (ValueError, RecursionError) as error:
        raise InvalidResult(
            RejectReason.RESULT_NOT_JSON, f"is not JSON: {_first_line(error)}"
        ) from None
    if (
        text.count("[") + text.count("{") > MAX_RESULT_DEPTH
        or _SURROGATE_ESCAPE.search(text) is not None
        or _LONG_DIGITS.search(text) is not None
    ):
        _check_value(value)
    return value


def _check_value(value: object) -> None:
    """Walk `value` once (without recursion: its depth is what is checked)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > MAX_RESULT_DEPTH:
                raise _too_deep()
            for key, member in item.items():
                _check_string(key)
                stack.append((member, depth + 1))
        elif isinstance(item, list):
            if depth > MAX_RESULT_DEPTH:
                raise _too_deep()
            stack.extend((member, depth + 1) for member in item)
        elif isinstance(item, str):
            _check_string(item)
        elif isinstance(item, int) and not MIN_RESULT_INT <= item <= MAX_RESULT_INT:
            # bool is an int, always within bounds.
            raise InvalidResult(
                RejectReason.RESULT_NOT_JSON, f"holds the integer {str(item)[:32]}…, beyond 64 bits"
            )


def _check_string(text: str) -> None:
    try:
        text.encode()
    except UnicodeEncodeError:
        raise InvalidResult(
            RejectReason.RESULT_NOT_JSON,
            "holds a string with an unpaired surrogate (\\ud800-\\udfff)",
        ) from None


def _too_deep() -> InvalidResult:
    return InvalidResult(
        RejectReason.RESULT_NOT_JSON, f"nests deeper than {MAX_RESULT_DEPTH} levels"
    )


def _refuse_constant(name: str) -> object:
    raise InvalidResult(RejectReason.RESULT_NOT_FINITE, f"holds {name}, which JSON cannot carry")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidResult(
            RejectReason.RESULT_NOT_FINITE, f"holds {text[:32]}, which is beyond a double"
        )
    return value


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__
