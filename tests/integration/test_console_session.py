"""What the console page asks on load: is this visitor signed in? Always 200, never a 401 the
browser would log as an error for a visitor who has not signed in yet."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.integration.test_console_auth import (
    COOKIE,
    SECRET,
    bearer,
    clean_env,
    console,
    secured,
    token,
)

__all__ = ["clean_env", "secured"]  # fixtures shared with test_console_auth.py


class TestTheSessionQuestion:
    async def test_a_first_visit_is_not_signed_in_and_has_nothing_to_be_told(
        self, secured: httpx.AsyncClient
    ) -> None:
        response = await secured.get("/console/api/session")

        assert response.status_code == 200
        assert response.json() == {"signed_in": False, "detail": None, "token_required": True}

    async def test_an_admin_cookie_is_signed_in(self, secured: httpx.AsyncClient) -> None:
        secured.cookies.set(COOKIE, token(admin=True))

        response = await secured.get("/console/api/session")

        assert response.json() == {"signed_in": True, "detail": None, "token_required": True}

    @pytest.mark.parametrize(
        ("claims", "detail"),
        [
            ({"exp": int(time.time()) - 60, "admin": True}, "the token has expired"),
            ({"jobs": ["*"]}, "not an admin token"),
        ],
    )
    async def test_a_refused_token_is_not_signed_in_and_says_why(
        self, secured: httpx.AsyncClient, claims: dict[str, object], detail: str
    ) -> None:
        response = await secured.get("/console/api/session", headers=bearer(token(**claims)))

        assert response.status_code == 200
        assert response.json()["signed_in"] is False
        assert detail in response.json()["detail"]

    async def test_without_a_secret_everyone_is_signed_in_with_no_sign_out(self) -> None:
        async with console(console=True) as client:
            response = await client.get("/console/api/session")

        assert response.json() == {"signed_in": True, "detail": None, "token_required": False}

    async def test_it_is_404_when_the_console_is_off(self) -> None:
        async with console(jwt_secret=SECRET) as client:
            response = await client.get("/console/api/session")

        assert response.status_code == 404
