"""Authorizers: HS256 JWTs naming the jobs, and their domain, a bearer may watch; or none."""

from __future__ import annotations

import time

import jwt
from jwt.types import Options

from eco_router.adapters.jwt_claims import OversizedToken, decode_hs256
from eco_router.adapters.jwt_secret import MAX_TOKEN_BYTES, MIN_SECRET_BYTES
from eco_router.application.errors import Forbidden, Unauthorized
from eco_router.application.ports import Authorizer
from eco_router.domain.grant import Grant

# The domain of tokens minted before tokens named one: the reference design's only domain.
LEGACY_DOMAIN = "scan"


class JwtAuthorizer(Authorizer):
    """Requires an HS256 token whose `domain` claim is the job's domain (or `"*"`) and whose
    `jobs` claim lists the job (or `"*"`).

    - A token without `domain` opens jobs of `LEGACY_DOMAIN` only.
    - `exp` is required when `require_exp` (the default) and honoured whenever present.
    - `exp`, `nbf` and `iat` must be JSON numbers (NumericDate); any other type is not valid.
    - A token longer than `max_token_bytes` is not valid, refused before it is decoded.
    """

    def __init__(
        self, secret: str, *, require_exp: bool = True, max_token_bytes: int = MAX_TOKEN_BYTES
    ) -> None:
        if len(secret.encode()) < MIN_SECRET_BYTES:
            raise ValueError(f"an HS256 secret needs at least {MIN_SECRET_BYTES} bytes")
        self._secret = secret
        self._options: Options = {"require": ["exp"] if require_exp else []}
        self._max_token_bytes = max_token_bytes

    def authorize(self, token: str | None, job_id: str, *, domain: str) -> None:
        refusal = self.grant(token).refusal(domain, job_id)
        if refusal is not None:
            raise Forbidden(refusal)

    def grant(self, token: str | None) -> Grant:
        if not token:
            raise Unauthorized("a bearer token is required")
        try:
            claims = decode_hs256(
                token, self._secret, options=self._options, max_bytes=self._max_token_bytes
            )
        except OversizedToken as error:
            raise Unauthorized(str(error)) from error
        except jwt.ExpiredSignatureError as error:
            raise Unauthorized("the token has expired") from error
        except jwt.MissingRequiredClaimError as error:
            raise Unauthorized("the token has no expiry (`exp` claim)") from error
        except jwt.InvalidTokenError as error:
            raise Unauthorized("the token is not valid") from error
        domain = claims.get("domain", LEGACY_DOMAIN)
        if not isinstance(domain, str):
            raise Forbidden("the token's `domain` is not a string")
        jobs = claims.get("jobs")
        if not isinstance(jobs, list) or not all(isinstance(j, str) for j in jobs):
            raise Forbidden("the token has no `jobs` list")
        return Grant.of(domain, jobs)

    def issue(self, domain: str, job_ids: list[str], *, ttl_s: int) -> str:
        """A token for `job_ids` of `domain`, valid for `ttl_s` seconds (the demo page's jobs)."""
        claims = {"domain": domain, "jobs": job_ids, "exp": int(time.time()) + ttl_s}
        return jwt.encode(claims, self._secret, algorithm="HS256")


class OpenAuthorizer(Authorizer):
    """Lets everyone watch every job (no secret configured)."""

    def authorize(self, token: str | None, job_id: str, *, domain: str) -> None:
        return None

    def grant(self, token: str | None) -> Grant:
        return Grant.everything()
