"""A served request's access log line never carries a token, from the query string (no value
is shown) or the path."""

from __future__ import annotations

from pathlib import Path

import httpx

from eco_router.testing import RedisServer
from tests.integration.test_gateway import Gateway

SECRETS = ("eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.first", "second-secret-value", "third-secret-value")
# Sent where a name does not say "token": an encoded name, a job, a resume point, the path.
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJqb2JzIjpbImoiXX0.c2lnbmF0dXJlLW9mLWEtdGVzdA"


def test_query_string_tokens_are_hidden_in_the_access_log(
    tmp_path: Path, streams_server: RedisServer, pubsub_server: RedisServer
) -> None:
    gateway = Gateway.launch(tmp_path, streams_url=streams_server.url, pubsub_url=pubsub_server.url)
    try:
        with httpx.Client(base_url=gateway.base_url, timeout=10) as client:
            health = client.get("/health", params={"token": SECRETS[0], "x": "1"})
            bad_job = client.get(
                "/api/v1/stream", params={"job_id": "no spaces", "access_token": SECRETS[1]}
            )
            other = client.get("/health", params={"id_token": SECRETS[2]})
            # Both refused (a resume point that is not one): no stream is left open.
            refused = [
                client.get(f"/api/v1/streams?tok%65n={JWT}&job=scan:{JWT}&last_event_id={JWT}"),
                client.get(f"/api/v1/scan/{JWT}/events?last_event_id=x"),
            ]
    finally:
        gateway.stop()

    log = gateway.log()
    assert (health.status_code, bad_job.status_code, other.status_code) == (200, 422, 200)
    assert "GET /health?token=***&x=*** HTTP/1.1" in log
    assert "GET /api/v1/streams?token=***&job=***&last_event_id=*** HTTP/1.1" in log
    assert "GET /api/v1/scan/***/events?last_event_id=*** HTTP/1.1" in log
    assert [r.status_code for r in refused] == [422, 422]
    assert "access_token=***" in log
    assert "id_token=***" in log
    for secret in (*SECRETS, JWT):
        assert secret not in log
