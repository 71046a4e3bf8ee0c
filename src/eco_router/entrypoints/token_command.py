"""`eco-router token`: a viewer or admin token signed with the gateway's own secret."""

from __future__ import annotations

from eco_router.adapters.admin_authorizer import JwtAdminAuthorizer
from eco_router.adapters.jwt_authorizer import JwtAuthorizer
from eco_router.domain.grant import ANY
from eco_router.entrypoints.exit_codes import ExitCode
from eco_router.entrypoints.settings import Settings

DEFAULT_DOMAIN = "scan"


class TokenRefused(Exception):
    """No token can be minted as asked; the message says why in one line."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.CONFIGURATION) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def mint(
    settings: Settings, *, jobs: list[str], domain: str | None, admin: bool, ttl_s: int
) -> str:
    """A token the gateway (viewer) or the console (admin) of these settings accepts.

    - An admin token names no job or domain: it opens the console, not the SSE streams.
    - A viewer token opens the `jobs` of `domain` (default `scan`); with no job, every job of
      the domain; `*` as the domain opens every domain.
    - Both expire after `ttl_s` seconds: the gateway refuses a token without `exp` unless
      EVENT_ROUTER_JWT_REQUIRE_EXP=false, and the console always does.
    """
    if settings.jwt_secret is None:
        raise TokenRefused(
            "no secret to sign with: set EVENT_ROUTER_JWT_SECRET to the secret the gateway "
            "uses (at least 32 bytes, e.g. the output of `openssl rand -base64 32`)"
        )
    secret = settings.jwt_secret.get_secret_value()
    if admin:
        if jobs or domain is not None:
            raise TokenRefused("--admin makes a console token: it takes no --job or --domain")
        return JwtAdminAuthorizer(secret).issue(ttl_s=ttl_s)
    if not jobs and domain is None:
        raise TokenRefused("give --job (repeatable), --domain, or --admin")
    domain = domain or DEFAULT_DOMAIN
    if domain != ANY and domain not in settings.domains:
        known = ", ".join(settings.domains)
        raise TokenRefused(f"unknown domain {domain!r}; EVENT_ROUTER_STREAMS configures: {known}")
    return JwtAuthorizer(secret).issue(domain, jobs or [ANY], ttl_s=ttl_s)
