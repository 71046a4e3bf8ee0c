"""Turning a request for many jobs' events into one streaming response: the job set, the
resume point, the token, errors."""

from __future__ import annotations

from fastapi import HTTPException, Request
from fastapi.responses import Response

from eco_router.application.errors import Forbidden, Unauthorized
from eco_router.application.ports import AdminAuthorizer, Authorizer
from eco_router.application.stream_many_jobs import StreamManyJobs
from eco_router.domain.errors import DomainError
from eco_router.domain.grant import Grant
from eco_router.domain.job_set import Job, JobSet, read_stream_id
from eco_router.entrypoints.http.client_streams import ClientStreams
from eco_router.entrypoints.http.sse_responses import JOB_ID, bearer_token, streaming_response

# What an error quotes of a client's input, at most.
_QUOTED_CHARS = 40


async def many_jobs_stream(
    request: Request,
    *,
    named: list[str],
    last_event_id: str | None,
    domains: tuple[str, ...],
    max_jobs: int,
    cookie: str,
    authorizer: Authorizer,
    admin_authorizer: AdminAuthorizer,
    stream: StreamManyJobs,
    client_streams: ClientStreams,
) -> Response:
    """Validate everything and open every job's stream before the first byte; then stream.

    The jobs are the `job=domain:id` parameters (at most `max_jobs`, counted before anything
    else), else the token's `jobs` claim. Each must be granted by the token, or the token is
    an admin's; the token is decoded once, whatever the number of jobs. A resuming client
    whose every job has ended at its Last-Event-ID gets 204 No Content (its EventSource
    stops). One connection counts as one stream of its client address (429 past the cap);
    an unreachable Pub/Sub or state store is 503.
    """
    token = bearer_token(request, cookie)
    if named:
        job_set = JobSet.of(parse_jobs(named, domains=domains, max_jobs=max_jobs))
        authorize_all(authorizer, admin_authorizer, token, job_set)
    else:
        # The jobs come from the grant: it opens each of them.
        job_set = JobSet.of(token_jobs(authorizer.grant(token), max_jobs=max_jobs))
    value = request.headers.get("last-event-id") or last_event_id
    try:
        positions = read_stream_id(job_set, value) if value else [None] * len(job_set)
    except DomainError as error:
        raise HTTPException(422, str(error)) from error
    return await streaming_response(
        request, client_streams, lambda: stream.open(job_set, positions)
    )


def parse_jobs(named: list[str], *, domains: tuple[str, ...], max_jobs: int) -> list[Job]:
    """`domain:job_id` each (the id may hold more colons); 422 for the first that is not."""
    if len(named) > max_jobs:
        raise HTTPException(
            422, f"at most {max_jobs} jobs per stream (EVENT_ROUTER_SSE_MAX_JOBS_PER_STREAM)"
        )
    jobs = []
    for value in named:
        domain, colon, job_id = value.partition(":")
        if not colon:
            raise HTTPException(422, f"job must be domain:job_id, got {_quote(value)}")
        if domain not in domains:
            known = ", ".join(domains)
            raise HTTPException(422, f"unknown domain {_quote(domain)} in job; known: {known}")
        if JOB_ID.fullmatch(job_id) is None:
            raise HTTPException(
                422, f"job_id must be 1-128 characters of [A-Za-z0-9_.:-], got {_quote(job_id)}"
            )
        jobs.append((domain, job_id))
    return jobs


def token_jobs(grant: Grant, *, max_jobs: int) -> list[Job]:
    """The jobs the token's claims name, for a request that names none."""
    granted = grant.finite_jobs()
    if granted is None:
        raise HTTPException(
            422, "name the jobs (job=domain:job_id, repeatable): the token names no finite set"
        )
    jobs = [(d, j) for d, j in granted if JOB_ID.fullmatch(j) is not None]
    if not jobs:
        raise HTTPException(422, "the token names no job: name the jobs (job=domain:job_id)")
    if len(jobs) > max_jobs:
        raise HTTPException(
            422,
            f"the token names more than {max_jobs} jobs, the most per stream "
            "(EVENT_ROUTER_SSE_MAX_JOBS_PER_STREAM): name the jobs (job=domain:job_id)",
        )
    return jobs


def authorize_all(
    authorizer: Authorizer, admin: AdminAuthorizer, token: str | None, job_set: JobSet
) -> None:
    """Every job granted by the token (checked once, each job then a lookup), else the token
    is an admin's; else the first refused job's refusal."""
    try:
        refusal = authorizer.grant(token).first_refusal(job_set.jobs)
        if refusal is not None:
            raise Forbidden(refusal)
    except (Unauthorized, Forbidden) as refused:
        try:
            admin.authorize_admin(token)
        except (Unauthorized, Forbidden):
            raise refused from None


def _quote(value: str) -> str:
    shown = value if len(value) <= _QUOTED_CHARS else value[:_QUOTED_CHARS] + "..."
    return repr(shown)
