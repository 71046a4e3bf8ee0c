"""Admin authorizers: who may use the operator console, by HS256 JWT or, with no secret, all."""

from __future__ import annotations

import time

import jwt

from eco_router.adapters.jwt_claims import OversizedToken, decode_hs256
from eco_router.adapters.jwt_secret import MAX_TOKEN_BYTES
from eco_router.application.errors import Forbidden, Unauthorized
from eco_router.application.ports import AdminAuthorizer

ADMIN_CLAIM = "admin"


class JwtAdminAuthorizer(AdminAuthorizer):
    """Requires an HS256 token with `"admin": true` and an `exp` (an admin token that never
    expires is refused: it would open replay to whoever finds it, for good); `exp`, `nbf`
    and `iat` must be JSON numbers; a token longer than `max_token_bytes` is refused before it
    is decoded."""

    def __init__(self, secret: str, *, max_token_bytes: int = MAX_TOKEN_BYTES) -> None:
        self._secret = secret
        self._max_token_bytes = max_token_bytes

    def authorize_admin(self, token: str | None) -> None:
        self.expiry(token)

    def expiry(self, token: str | None) -> int:
        """The admin token's `exp` (Unix seconds), after the same checks as `authorize_admin`."""
        if not token:
            raise Unauthorized("an admin bearer token is required")
        try:
            claims = decode_hs256(
                token,
                self._secret,
                options={"require": ["exp"]},
                max_bytes=self._max_token_bytes,
            )
        except OversizedToken as error:
            raise Unauthorized(str(error)) from error
        except jwt.ExpiredSignatureError as error:
            raise Unauthorized("the token has expired") from error
        except jwt.MissingRequiredClaimError as error:
            raise Unauthorized("the token has no `exp` claim") from error
        except jwt.InvalidTokenError as error:
            raise Unauthorized("the token is not valid") from error
        if claims.get(ADMIN_CLAIM) is not True:
            raise Forbidden('the token is not an admin token (no `"admin": true` claim)')
        return int(claims["exp"])

    def issue(self, *, ttl_s: int) -> str:
        """An admin token valid for `ttl_s` seconds (tests and tooling)."""
        claims = {ADMIN_CLAIM: True, "exp": int(time.time()) + ttl_s}
        return jwt.encode(claims, self._secret, algorithm="HS256")


class OpenAdminAuthorizer(AdminAuthorizer):
    """Lets everyone in (no secret configured; the app warns at startup)."""

    def authorize_admin(self, token: str | None) -> None:
        return None
