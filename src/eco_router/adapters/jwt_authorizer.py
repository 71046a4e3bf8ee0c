"""Authorizers: HS256 JWTs naming the jobs a bearer may watch, or none at all."""

from __future__ import annotations

import time

import jwt

from eco_router.application.errors import Forbidden, Unauthorized
from eco_router.application.ports import Authorizer


class JwtAuthorizer(Authorizer):
    """Requires an HS256 token whose `jobs` claim lists the job (or `"*"`); `exp` is honoured."""

    def __init__(self, secret: str) -> None:
        self._secret = secret

    def authorize(self, token: str | None, job_id: str) -> None:
        if not token:
            raise Unauthorized("a bearer token is required")
        try:
            claims = jwt.decode(token, self._secret, algorithms=["HS256"])
        except jwt.ExpiredSignatureError as error:
            raise Unauthorized("the token has expired") from error
        except jwt.InvalidTokenError as error:
            raise Unauthorized("the token is not valid") from error
        jobs = claims.get("jobs")
        if not isinstance(jobs, list) or not all(isinstance(j, str) for j in jobs):
            raise Forbidden("the token has no `jobs` list")
        if "*" not in jobs and job_id not in jobs:
            raise Forbidden("the token does not grant this job")

    def issue(self, job_ids: list[str], *, ttl_s: int) -> str:
        """A token for `job_ids`, valid for `ttl_s` seconds (the demo page's own jobs)."""
        claims = {"jobs": job_ids, "exp": int(time.time()) + ttl_s}
        return jwt.encode(claims, self._secret, algorithm="HS256")


class OpenAuthorizer(Authorizer):
    """Lets everyone watch every job (no secret configured)."""

    def authorize(self, token: str | None, job_id: str) -> None:
        return None
