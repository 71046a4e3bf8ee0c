"""JwtAuthorizer: HS256 tokens whose `jobs` claim names the jobs a bearer may watch."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jwt
import pytest

from eco_router.adapters.admin_authorizer import JwtAdminAuthorizer
from eco_router.adapters.jwt_authorizer import JwtAuthorizer, OpenAuthorizer
from eco_router.application.errors import Forbidden, Unauthorized

# 64 bytes: long enough for HS512 too, so only the algorithm differs in that test.
SECRET = "test-secret-" + "s" * 52
OTHER_SECRET = "other-secret-" + "o" * 51


def make_token(secret: str = SECRET, algorithm: str = "HS256", **claims: Any) -> str:
    payload: dict[str, Any] = {"jobs": ["job-1"], "exp": int(time.time()) + 300}
    payload.update(claims)
    payload = {name: value for name, value in payload.items() if value is not None}
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
            authorizer.authorize(token, "job-1", domain="scan")

    @pytest.mark.parametrize("token", ["garbage", "a.b.c", "Bearer x", "eyJhbGciOi.."])
    def test_a_token_that_is_not_a_jwt_is_unauthorized(
        self, authorizer: JwtAuthorizer, token: str
    ) -> None:
        with pytest.raises(Unauthorized):
            authorizer.authorize(token, "job-1", domain="scan")

    def test_a_token_signed_with_another_secret_is_unauthorized(
        self, authorizer: JwtAuthorizer
    ) -> None:
        with pytest.raises(Unauthorized):
            authorizer.authorize(make_token(secret=OTHER_SECRET), "job-1", domain="scan")

    def test_an_expired_token_is_unauthorized(self, authorizer: JwtAuthorizer) -> None:
        token = make_token(exp=int(time.time()) - 3600)

        with pytest.raises(Unauthorized, match="expired"):
            authorizer.authorize(token, "job-1", domain="scan")

    def test_an_unsigned_token_is_unauthorized(self, authorizer: JwtAuthorizer) -> None:
        token = jwt.encode({"jobs": ["*"]}, None, algorithm="none")

        with pytest.raises(Unauthorized):
            authorizer.authorize(token, "job-1", domain="scan")

    def test_a_token_signed_with_another_algorithm_is_unauthorized(
        self, authorizer: JwtAuthorizer
    ) -> None:
        token = make_token(algorithm="HS512", jobs=["*"])

        with pytest.raises(Unauthorized):
            authorizer.authorize(token, "job-1", domain="scan")

    def test_a_token_with_a_tampered_payload_is_unauthorized(
        self, authorizer: JwtAuthorizer
    ) -> None:
        header, _, signature = make_token(jobs=["job-2"]).split(".")
        forged_payload = jwt.utils.base64url_encode(b'{"jobs":["*"]}').decode()

        with pytest.raises(Unauthorized):
            authorizer.authorize(f"{header}.{forged_payload}.{signature}", "job-1", domain="scan")


class TestAuthorized:
    def test_a_valid_token_naming_the_job_is_accepted(self, authorizer: JwtAuthorizer) -> None:
        authorizer.authorize(make_token(jobs=["job-0", "job-1"]), "job-1", domain="scan")

    def test_a_wildcard_token_is_accepted_for_any_job(self, authorizer: JwtAuthorizer) -> None:
        token = make_token(jobs=["*"])

        authorizer.authorize(token, "job-1", domain="scan")
        authorizer.authorize(token, "some-other-job", domain="scan")

    def test_a_token_that_has_not_expired_is_accepted(self, authorizer: JwtAuthorizer) -> None:
        authorizer.authorize(make_token(exp=int(time.time()) + 3600), "job-1", domain="scan")

    def test_the_open_authorizer_lets_everyone_in(self) -> None:
        OpenAuthorizer().authorize(None, "job-1", domain="scan")


class TestForbidden:
    def test_a_token_for_other_jobs_is_forbidden(self, authorizer: JwtAuthorizer) -> None:
        with pytest.raises(Forbidden):
            authorizer.authorize(make_token(jobs=["job-2", "job-3"]), "job-1", domain="scan")

    def test_a_token_with_no_jobs_is_forbidden(self, authorizer: JwtAuthorizer) -> None:
        with pytest.raises(Forbidden):
            authorizer.authorize(make_token(jobs=[]), "job-1", domain="scan")

    def test_a_token_without_a_jobs_claim_is_forbidden(self, authorizer: JwtAuthorizer) -> None:
        token = make_token(jobs=None)

        with pytest.raises(Forbidden):
            authorizer.authorize(token, "job-1", domain="scan")

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
            authorizer.authorize(make_token(jobs=jobs), "job-1", domain="scan")

    def test_a_job_id_is_matched_exactly_not_as_a_prefix(self, authorizer: JwtAuthorizer) -> None:
        with pytest.raises(Forbidden):
            authorizer.authorize(make_token(jobs=["job-1"]), "job-10", domain="scan")


class TestExpiry:
    def test_a_token_without_exp_is_unauthorized_by_default(
        self, authorizer: JwtAuthorizer
    ) -> None:
        with pytest.raises(Unauthorized, match="no expiry"):
            authorizer.authorize(make_token(exp=None), "job-1", domain="scan")

    def test_a_token_without_exp_is_accepted_when_exp_is_not_required(self) -> None:
        lenient = JwtAuthorizer(SECRET, require_exp=False)

        lenient.authorize(make_token(exp=None), "job-1", domain="scan")

    def test_an_expired_token_is_refused_even_when_exp_is_not_required(self) -> None:
        lenient = JwtAuthorizer(SECRET, require_exp=False)

        with pytest.raises(Unauthorized, match="expired"):
            lenient.authorize(make_token(exp=int(time.time()) - 60), "job-1", domain="scan")

    @pytest.mark.parametrize("claim", ["exp", "nbf", "iat"])
    @pytest.mark.parametrize(
        "value",
        [
            pytest.param(str, id="numeric string"),
            pytest.param(lambda valid: f"{valid}.5", id="decimal string"),
            pytest.param(lambda valid: True, id="boolean"),
            pytest.param(lambda valid: [valid], id="list"),
        ],
    )
    def test_a_time_claim_that_is_not_a_json_number_is_unauthorized(
        self, authorizer: JwtAuthorizer, claim: str, value: Callable[[int], object]
    ) -> None:
        # RFC 7519 makes exp, nbf and iat NumericDates (JSON numbers); PyJWT reads them with
        # int(), so "1700000000" would pass as that time. Each value stands for a time that
        # would pass: an hour ahead for exp, a minute ago for nbf and iat.
        now = int(time.time())
        valid = now + 3600 if claim == "exp" else now - 60
        token = make_token(**{claim: value(valid)})

        with pytest.raises(Unauthorized):
            authorizer.authorize(token, "job-1", domain="scan")

    @pytest.mark.parametrize("claim", ["nbf", "iat"])
    def test_numeric_time_claims_in_the_past_are_accepted(
        self, authorizer: JwtAuthorizer, claim: str
    ) -> None:
        authorizer.authorize(make_token(**{claim: time.time() - 60}), "job-1", domain="scan")

    def test_a_fractional_exp_is_accepted(self, authorizer: JwtAuthorizer) -> None:
        authorizer.authorize(make_token(exp=time.time() + 60.5), "job-1", domain="scan")


class TestSecret:
    @pytest.mark.parametrize("secret", ["k", "a-few-bytes", "x" * 31, "é" * 15])
    def test_a_secret_shorter_than_32_bytes_is_refused(self, secret: str) -> None:
        with pytest.raises(ValueError, match="at least 32 bytes"):
            JwtAuthorizer(secret)

    def test_a_32_byte_secret_is_accepted(self) -> None:
        JwtAuthorizer("x" * 32).authorize(make_token(secret="x" * 32), "job-1", domain="scan")


class TestDomains:
    def test_a_token_for_a_job_of_one_domain_does_not_open_the_same_job_of_another(
        self, authorizer: JwtAuthorizer
    ) -> None:
        token = make_token(domain="scan", jobs=["job-1"])
        authorizer.authorize(token, "job-1", domain="scan")

        with pytest.raises(Forbidden, match="domain"):
            authorizer.authorize(token, "job-1", domain="chat")

    def test_a_token_naming_no_domain_opens_scan_jobs_only(self, authorizer: JwtAuthorizer) -> None:
        legacy = make_token(jobs=["*"])
        authorizer.authorize(legacy, "job-1", domain="scan")

        with pytest.raises(Forbidden, match="domain"):
            authorizer.authorize(legacy, "job-1", domain="chat")

    def test_a_wildcard_domain_opens_its_jobs_in_every_domain(
        self, authorizer: JwtAuthorizer
    ) -> None:
        token = make_token(domain="*", jobs=["job-1"])

        authorizer.authorize(token, "job-1", domain="scan")
        authorizer.authorize(token, "job-1", domain="chat")
        with pytest.raises(Forbidden):
            authorizer.authorize(token, "job-2", domain="chat")

    @pytest.mark.parametrize("domain", [["scan"], 1, {"scan": True}])
    def test_an_ill_typed_domain_is_forbidden(
        self, authorizer: JwtAuthorizer, domain: object
    ) -> None:
        with pytest.raises(Forbidden):
            authorizer.authorize(make_token(domain=domain), "job-1", domain="scan")

    def test_an_issued_token_names_its_domain_and_expires(self, authorizer: JwtAuthorizer) -> None:
        token = authorizer.issue("chat", ["job-9"], ttl_s=60)

        claims = jwt.decode(token, SECRET, algorithms=["HS256"])
        assert claims["domain"] == "chat"
        assert claims["jobs"] == ["job-9"]
        assert 0 < claims["exp"] - time.time() <= 60
        authorizer.authorize(token, "job-9", domain="chat")
        with pytest.raises(Forbidden):
            authorizer.authorize(token, "job-9", domain="scan")


class TestGrant:
    def test_a_token_names_its_jobs_in_its_domain(self, authorizer: JwtAuthorizer) -> None:
        token = make_token(domain="chat", jobs=["b", "a"])
        assert authorizer.grant(token).finite_jobs() == [("chat", "a"), ("chat", "b")]

    def test_a_token_naming_no_domain_names_scan_jobs(self, authorizer: JwtAuthorizer) -> None:
        assert authorizer.grant(make_token(jobs=["a"])).finite_jobs() == [("scan", "a")]

    @pytest.mark.parametrize(("domain", "jobs"), [("*", ["a"]), ("scan", ["*"]), ("*", ["*"])])
    def test_a_wildcard_names_no_finite_set(
        self, authorizer: JwtAuthorizer, domain: str, jobs: list[str]
    ) -> None:
        assert authorizer.grant(make_token(domain=domain, jobs=jobs)).finite_jobs() is None

    def test_a_token_not_valid_is_unauthorized(self, authorizer: JwtAuthorizer) -> None:
        with pytest.raises(Unauthorized):
            authorizer.grant(make_token(secret=OTHER_SECRET))

    def test_the_open_authorizer_names_no_set(self) -> None:
        assert OpenAuthorizer().grant(None).finite_jobs() is None

    def test_one_grant_answers_for_every_job_of_its_token(self, authorizer: JwtAuthorizer) -> None:
        grant = authorizer.grant(make_token(domain="chat", jobs=["a", "b"]))

        assert grant.first_refusal([("chat", "a"), ("chat", "b")]) is None
        assert grant.first_refusal([("chat", "a"), ("chat", "c")]) == (
            "the token does not grant this job"
        )
        assert grant.first_refusal([("scan", "a")]) == "the token does not grant this domain"


class TestTokenSize:
    def test_a_token_longer_than_the_bound_is_unauthorized_with_one_line(self) -> None:
        token = make_token(jobs=[f"job-{n}" for n in range(200)])
        authorizer = JwtAuthorizer(SECRET, max_token_bytes=len(token) - 1)

        with pytest.raises(Unauthorized) as refused:
            authorizer.grant(token)

        assert str(refused.value) == (
            f"the token is longer than {len(token) - 1} bytes, the most accepted"
        )

    def test_a_token_of_the_bound_is_decoded(self) -> None:
        token = make_token(jobs=[f"job-{n}" for n in range(200)])
        authorizer = JwtAuthorizer(SECRET, max_token_bytes=len(token))

        assert authorizer.grant(token).first_refusal([("scan", "job-199")]) is None

    def test_the_default_bound_is_8_kib(self, authorizer: JwtAuthorizer) -> None:
        token = make_token(jobs=[f"job-{n:05d}" for n in range(1000)])
        assert len(token) > 8 * 1024

        with pytest.raises(Unauthorized, match="longer than 8192 bytes"):
            authorizer.authorize(token, "job-00001", domain="scan")

    def test_an_admin_token_longer_than_the_bound_is_unauthorized(self) -> None:
        admin = JwtAdminAuthorizer(SECRET, max_token_bytes=64)

        with pytest.raises(Unauthorized, match="longer than 64 bytes"):
            admin.authorize_admin(admin.issue(ttl_s=60))
