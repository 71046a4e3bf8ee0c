"""JwtAdminAuthorizer: who may use the operator console (an HS256 token with `admin: true`)."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest

from eco_router.adapters.admin_authorizer import JwtAdminAuthorizer, OpenAdminAuthorizer
from eco_router.application.errors import Forbidden, Unauthorized

SECRET = "console-secret-" + "s" * 49


def make_token(secret: str = SECRET, algorithm: str = "HS256", **claims: Any) -> str:
    payload: dict[str, Any] = {"admin": True, "exp": int(time.time()) + 600}
    payload.update(claims)
    return jwt.encode({k: v for k, v in payload.items() if v is not None}, secret, algorithm)


@pytest.fixture
def gate() -> JwtAdminAuthorizer:
    return JwtAdminAuthorizer(SECRET)


class TestJwtAdminAuthorizer:
    def test_an_admin_token_is_let_in(self, gate: JwtAdminAuthorizer) -> None:
        gate.authorize_admin(make_token())

    def test_an_issued_token_is_an_admin_token_that_expires(self, gate: JwtAdminAuthorizer) -> None:
        token = gate.issue(ttl_s=60)

        assert time.time() < gate.expiry(token) <= time.time() + 60

    @pytest.mark.parametrize("token", [None, "", "garbage"])
    def test_no_token_or_not_a_jwt_is_unauthorized(
        self, gate: JwtAdminAuthorizer, token: str | None
    ) -> None:
        with pytest.raises(Unauthorized):
            gate.authorize_admin(token)

    @pytest.mark.parametrize(
        "token",
        [
            make_token(secret="another-secret-" + "o" * 49),
            make_token(algorithm="HS512"),
            make_token(exp=int(time.time()) - 10),
        ],
        ids=["wrong-secret", "other-algorithm", "expired"],
    )
    def test_a_token_that_does_not_verify_is_unauthorized(
        self, gate: JwtAdminAuthorizer, token: str
    ) -> None:
        with pytest.raises(Unauthorized):
            gate.authorize_admin(token)

    def test_an_admin_token_without_exp_is_unauthorized(self, gate: JwtAdminAuthorizer) -> None:
        with pytest.raises(Unauthorized, match="exp"):
            gate.authorize_admin(make_token(exp=None))

    @pytest.mark.parametrize(
        "claims",
        [
            {"exp": str(int(time.time()) + 600)},
            {"exp": True},
            {"nbf": str(int(time.time()) - 60)},
            {"iat": str(int(time.time()) - 60)},
        ],
        ids=["exp-string", "exp-boolean", "nbf-string", "iat-string"],
    )
    def test_a_time_claim_that_is_not_a_json_number_is_unauthorized(
        self, gate: JwtAdminAuthorizer, claims: dict[str, Any]
    ) -> None:
        with pytest.raises(Unauthorized):
            gate.authorize_admin(make_token(**claims))

    @pytest.mark.parametrize(
        "claims",
        [{"admin": None, "jobs": ["*"]}, {"admin": "true"}, {"admin": 1}, {"admin": False}],
        ids=["job-token", "string", "number", "false"],
    )
    def test_a_valid_token_without_admin_true_is_forbidden(
        self, gate: JwtAdminAuthorizer, claims: dict[str, Any]
    ) -> None:
        with pytest.raises(Forbidden):
            gate.authorize_admin(make_token(**claims))


def test_without_a_secret_everyone_is_let_in() -> None:
    OpenAdminAuthorizer().authorize_admin(None)
