"""Grant: what a checked token opens, each job a lookup."""

from __future__ import annotations

import pytest

from eco_router.domain.grant import ANY, Grant


class TestGrant:
    def test_a_grant_opens_its_jobs_of_its_domain_only(self) -> None:
        grant = Grant.of("scan", ["a", "b"])

        assert grant.refusal("scan", "a") is None
        assert grant.refusal("scan", "c") == "the token does not grant this job"
        assert grant.refusal("chat", "a") == "the token does not grant this domain"

    @pytest.mark.parametrize(("domain", "jobs"), [(ANY, ["a"]), ("scan", [ANY]), (ANY, [ANY])])
    def test_a_wildcard_opens_more_and_names_no_finite_set(
        self, domain: str, jobs: list[str]
    ) -> None:
        grant = Grant.of(domain, jobs)

        assert grant.finite_jobs() is None
        assert grant.refusal("scan", "a") is None

    def test_the_first_refusal_is_of_the_first_job_not_opened(self) -> None:
        grant = Grant.of("chat", ["a", "b"])

        assert grant.first_refusal([("chat", "b"), ("chat", "a")]) is None
        assert grant.first_refusal([("chat", "a"), ("scan", "b"), ("chat", "z")]) == (
            "the token does not grant this domain"
        )

    def test_everything_opens_every_job_of_every_domain(self) -> None:
        assert Grant.everything().first_refusal([("scan", "a"), ("chat", "b")]) is None

    def test_finite_jobs_are_distinct_and_ordered(self) -> None:
        assert Grant.of("scan", ["b", "a", "b"]).finite_jobs() == [("scan", "a"), ("scan", "b")]
