"""Decoding HS256 tokens of a bounded size, with time claims that must be JSON numbers as
RFC 7519 says."""

from __future__ import annotations

import math
from typing import Any

import jwt
from jwt.types import Options

from eco_router.adapters.jwt_secret import MAX_TOKEN_BYTES

# NumericDate claims (RFC 7519, sections 2 and 4.1.4-4.1.6).
TIME_CLAIMS = ("exp", "nbf", "iat")


class OversizedToken(jwt.InvalidTokenError):
    """A token longer than the gateway decodes."""


def decode_hs256(
    token: str, secret: str, *, options: Options, max_bytes: int = MAX_TOKEN_BYTES
) -> dict[str, Any]:
    """The verified claims of `token`, else a `jwt.InvalidTokenError` (or a subclass):
    `OversizedToken` past `max_bytes`, before any decoding.

    PyJWT reads `exp`, `nbf` and `iat` with `int()`, so `"exp": "1900000000"` (a string) or
    `"nbf": true` would pass as times, and it has no option to refuse them; they are refused
    here, like any token that is not valid.
    """
    # Headers and cookies reach us as latin-1 text: one character is one byte of the request.
    if len(token) > max_bytes:
        raise OversizedToken(f"the token is longer than {max_bytes} bytes, the most accepted")
    claims = jwt.decode(token, secret, algorithms=["HS256"], options=options)
    for name in TIME_CLAIMS:
        if name in claims and not is_numeric_date(claims[name]):
            raise jwt.InvalidTokenError(f"the `{name}` claim is not a JSON number")
    return claims


def is_numeric_date(value: object) -> bool:
    """A JSON number (a bool is not one, though Python calls it an int), and finite."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)
