"""JwtAuthorizer: HS256 tokens whose `jobs` claim names the jobs a bearer may watch."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest

from eco_router.adapters.jwt_authorizer import JwtAuthorizer, OpenAuthorizer
from eco_router.application.errors import Forbidden, Unauthorized

# 64 bytes: long enough for HS512 too, so only the algorithm differs in that test.
SECRET = "test-secret-" + "s" * 52
OTHER_SECRET = "other-secret-" + "o" * 51


def make_token(secret: str = SECRET, algorithm: str = "HS256", **claims: Any) -> str:
    payload: dict[str, Any] = {"jobs": ["job-1"]}
    payload.update(claims)
    return jwt.encode(payload, secret, algorithm=algorithm)


@pytest.fixture
def authorizer() -> JwtAuthorizer:
    return JwtAuthorizer(SECRET)


class TestUnauthorized:
    @pytest.mark.parametrize("token", [None, ""])
    def test_a_request_without_a_token_is_unauthorized(
        self, authorizer: JwtAuthorizer, token: str | None
    ) -> None:
        with pytest.raises(Unauthorized):
            authorizer.authorize(token, "job-1")

    @pytest.mark.parametrize("token", ["garbage", "a.b.c", "Bearer x", "eyJhbGciOi.."])
    def test_a_token_that_is_not_a_jwt_is_unauthorized(
        self, authorizer: JwtAuthorizer, token: str
    ) -> None:
        with pytest.raises(Unauthorized):
            authorizer.authorize(token, "job-1")

    def test_a_token_signed_with_another_secret_is_unauthorized(
        self, authorizer: JwtAuthorizer
    ) -> None:
        with pytest.raises(Unauthorized):
            authorizer.authorize(make_token(secret=OTHER_SECRET), "job-1")

    def test_an_expired_token_is_unauthorized(self, authorizer: JwtAuthorizer) -> None:
        token = make_token(exp=int(time.time()) - 3600)

        with pytest.raises(Unauthorized, match="expired"):
            authorizer.authorize(token, "job-1")

    def test_an_unsigned_token_is_unauthorized(self, authorizer: JwtAuthorizer) -> None:
        token = jwt.encode({"jobs": ["*"]}, None, algorithm="none")

        with pytest.raises(Unauthorized):
            authorizer.authorize(token, "job-1")

    def test_a_token_signed_with_another_algorithm_is_unauthorized(
        self, authorizer: JwtAuthorizer
    ) -> None:
        token = make_token(algorithm="HS512", jobs=["*"])

        with pytest.raises(Unauthorized):
            authorizer.authorize(token, "job-1")

    def test_a_token_with_a_tampered_payload_is_unauthorized(
        self, authorizer: JwtAuthorizer
    ) -> None:
        header, _, signature = make_token(jobs=["job-2"]).split(".")
        forged_payload = jwt.utils.base64url_encode(b'{"jobs":["*"]}').decode()

        with pytest.raises(Unauthorized):
            authorizer.authorize(f"{header}.{forged_payload}.{signature}", "job-1")


class TestAuthorized:
    def test_a_valid_token_naming_the_job_is_accepted(self, authorizer: JwtAuthorizer) -> None:
        authorizer.authorize(make_token(jobs=["job-0", "job-1"]), "job-1")

    def test_a_wildcard_token_is_accepted_for_any_job(self, authorizer: JwtAuthorizer) -> None:
        token = make_token(jobs=["*"])

        authorizer.authorize(token, "job-1")
        authorizer.authorize(token, "some-other-job")

    def test_a_token_that_has_not_expired_is_accepted(self, authorizer: JwtAuthorizer) -> None:
        authorizer.authorize(make_token(exp=int(time.time()) + 3600), "job-1")

    def test_the_open_authorizer_lets_everyone_in(self) -> None:
        OpenAuthorizer().authorize(None, "job-1")


class TestForbidden:
    def test_a_token_for_other_jobs_is_forbidden(self, authorizer: JwtAuthorizer) -> None:
        with pytest.raises(Forbidden):
            authorizer.authorize(make_token(jobs=["job-2", "job-3"]), "job-1")

    def test_a_token_with_no_jobs_is_forbidden(self, authorizer: JwtAuthorizer) -> None:
        with pytest.raises(Forbidden):
            authorizer.authorize(make_token(jobs=[]), "job-1")

    def test_a_token_without_a_jobs_claim_is_forbidden(self, authorizer: JwtAuthorizer) -> None:
        token = jwt.encode({"sub": "viewer"}, SECRET, algorithm="HS256")

        with pytest.raises(Forbidden):
            authorizer.authorize(token, "job-1")

    @pytest.mark.parametrize(
        "jobs",
        [
            pytest.param("job-1", id="string naming the job"),
            pytest.param("*", id="wildcard string"),
            pytest.param({"job-1": True}, id="object"),
            pytest.param([1, 2], id="list of numbers"),
            pytest.param(["job-1", 7], id="mixed list"),
            pytest.param(None, id="null"),
        ],
    )
    def test_an_ill_typed_jobs_claim_is_forbidden(
        self, authorizer: JwtAuthorizer, jobs: object
    ) -> None:
        with pytest.raises(Forbidden):
            authorizer.authorize(make_token(jobs=jobs), "job-1")

    def test_a_job_id_is_matched_exactly_not_as_a_prefix(self, authorizer: JwtAuthorizer) -> None:
        with pytest.raises(Forbidden):
            authorizer.authorize(make_token(jobs=["job-1"]), "job-10")
