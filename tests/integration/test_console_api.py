"""The operator console's API on an `eco-router serve` process routing real Redis streams."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.integration.sse_client import open_sse, sse_client
from tests.integration.support import (
    ALL_STREAMS,
    SCAN,
    add_event,
    add_raw,
    eventually,
    job_in_shard,
)
from tests.integration.test_gateway import Gateway, module_gateway

ROUTER = "console-router"


@pytest.fixture(scope="module")
def console_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """`eco-router serve` with the console on and its router routing, on its own servers."""
    with module_gateway(
        tmp_path_factory,
        "console-gateway",
        EVENT_ROUTER_CONSOLE="true",
        EVENT_ROUTER_CONSOLE_REFRESH_S="0.2",
        EVENT_ROUTER_CONSUMER_NAME=ROUTER,
    ) as started:
        yield started


@pytest.fixture
async def client(console_gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with sse_client(console_gateway.base_url) as opened:
        yield opened


@pytest.fixture
async def streams(console_gateway: Gateway) -> AsyncIterator[Redis]:
    redis = Redis.from_url(console_gateway.streams_url)
    yield redis
    await redis.aclose()


async def snapshot(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/console/api/snapshot")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def letters(client: httpx.AsyncClient, **params: str) -> list[dict[str, Any]]:
    response = await client.get("/console/api/dead-letters", params={"domain": "scan", **params})
    assert response.status_code == 200, response.text
    (scan,) = response.json()["domains"]
    found: list[dict[str, Any]] = scan["letters"]
    return found


def shard_row(body: dict[str, Any], stream: str) -> dict[str, Any]:
    row: dict[str, Any] = next(
        s for d in body["domains"] for s in d["shards"] if s["stream"] == stream
    )
    return row


class TestSnapshot:
    async def test_every_shard_is_held_by_the_running_router_with_a_token(
        self, client: httpx.AsyncClient
    ) -> None:
        async def all_held() -> dict[str, Any] | None:
            body = await snapshot(client)
            shards = [s for d in body["domains"] for s in d["shards"]]
            return body if all(s["holder"] == ROUTER for s in shards) else None

        body = await eventually(all_held, what="every shard held by the router")

        assert [s["stream"] for s in body["domains"][0]["shards"]] == list(SCAN.streams)
        assert all(
            s["token"] >= 1 and s["since_ms"] <= body["now_ms"]
            for s in body["domains"][0]["shards"]
        )
        (router,) = body["routers"]
        assert router["name"] == ROUTER
        assert sorted(router["shards"]) == sorted(ALL_STREAMS)

    async def test_appended_events_show_as_a_rate_in_and_out(
        self, client: httpx.AsyncClient, streams: Redis
    ) -> None:
        job = job_in_shard(SCAN, 2, "rated")
        # A group made on an empty stream tells how much it has read only once it has read.
        await add_event(streams, job, 1, stage="vision", status="started")

        async def measured() -> bool:
            row = shard_row(await snapshot(client), SCAN.streams[2])
            return row["read_per_s"] is not None and row["lag"] == 0

        await eventually(measured, what="shard 2's counters known")
        for seq in range(2, 22):
            await add_event(streams, job, seq, stage="vision", status="started")

        async def rated() -> dict[str, Any] | None:
            row = shard_row(await snapshot(client), SCAN.streams[2])
            return row if row["added_per_s"] > 0 and row["read_per_s"] > 0 else None

        await eventually(rated, what="a rate in and out on shard 2")

    async def test_the_stream_pushes_snapshots_again_and_again(
        self, client: httpx.AsyncClient
    ) -> None:
        async with open_sse(client, "/console/api/stream") as stream:
            assert stream.status_code == 200
            assert stream.response.headers["content-type"].startswith("text/event-stream")
            first, second = await stream.read(2)

        assert (first.event, second.event) == ("snapshot", "snapshot")
        assert second.json()["now_ms"] > first.json()["now_ms"]
        assert [d["domain"] for d in first.json()["domains"]] == ["scan", "chat"]


class TestDeadLetters:
    async def test_a_bad_entry_is_listed_with_its_reason_then_replayed_onto_its_stream(
        self, client: httpx.AsyncClient, streams: Redis
    ) -> None:
        job = job_in_shard(SCAN, 1, "broken")
        entry = await add_raw(streams, SCAN.streams[1], {b"job_id": job.encode(), b"seq": b"x"})

        async def listed() -> list[dict[str, Any]]:
            return [x for x in await letters(client, q=job) if x["entry_id"] == entry]

        (letter,) = await eventually(listed, what="the dead letter listed")
        assert (letter["reason"], letter["job_id"], letter["stream"]) == (
            "seq_not_integer",
            job,
            SCAN.streams[1],
        )
        assert letter["fields"] == {"job_id": job, "seq": "x"}

        response = await client.post(
            "/console/api/dead-letters/replay", json={"domain": "scan", "ids": [letter["dlq_id"]]}
        )

        assert response.status_code == 200, response.text
        (replayed,) = response.json()["replayed"]
        assert (replayed["dlq_id"], replayed["stream"]) == (letter["dlq_id"], SCAN.streams[1])
        assert await streams.xrange(SCAN.streams[1], replayed["new_id"], replayed["new_id"]) == [
            (replayed["new_id"].encode(), {b"job_id": job.encode(), b"seq": b"x"})
        ]
        # Still invalid: the router judges the replayed entry again and dead-letters it anew.
        again = await eventually(
            lambda: _letters_of_entry(client, job, replayed["new_id"]), what="judged again"
        )
        assert again[0]["dlq_id"] != letter["dlq_id"]
        assert letter["dlq_id"] not in [x["dlq_id"] for x in await letters(client, q=job)]

    async def test_replaying_a_letter_whose_cause_is_gone_routes_it_and_the_job_shows_it(
        self, client: httpx.AsyncClient, streams: Redis
    ) -> None:
        job = job_in_shard(SCAN, 3, "recovered")
        dlq_id = await add_raw(streams, SCAN.dead_letter_stream, _letter_of(job, SCAN.streams[3]))

        response = await client.post(
            "/console/api/dead-letters/replay",
            json={"domain": "scan", "all_matching": True, "q": job},
        )

        assert response.status_code == 200, response.text
        assert [r["dlq_id"] for r in response.json()["replayed"]] == [dlq_id]

        async def looked_up() -> dict[str, Any] | None:
            found = await client.get(f"/console/api/jobs/scan/{job}")
            return found.json() if found.status_code == 200 else None

        view = await eventually(looked_up, what="the replayed event routed")
        assert view["state"]["seq"] == 7
        assert [(e["seq"], e["stage"], e["status"]) for e in view["history"]] == [
            (7, "vision", "completed")
        ]
        assert await letters(client, q=job) == []

    async def test_an_unknown_id_is_404_and_replays_nothing(
        self, client: httpx.AsyncClient, streams: Redis
    ) -> None:
        job = job_in_shard(SCAN, 0, "kept")
        dlq_id = await add_raw(streams, SCAN.dead_letter_stream, _letter_of(job, SCAN.streams[0]))

        response = await client.post(
            "/console/api/dead-letters/replay", json={"domain": "scan", "ids": [dlq_id, "1-1"]}
        )

        assert response.status_code == 404
        assert "1-1" in response.json()["detail"]
        assert [x["dlq_id"] for x in await letters(client, q=job)] == [dlq_id]

    async def test_all_matching_with_a_count_that_no_longer_holds_is_409_and_replays_nothing(
        self, client: httpx.AsyncClient, streams: Redis
    ) -> None:
        job = job_in_shard(SCAN, 0, "confirmed")
        for _ in range(2):
            await add_raw(streams, SCAN.dead_letter_stream, _letter_of(job, SCAN.streams[0]))
        listed = await client.get("/console/api/dead-letters", params={"domain": "scan", "q": job})
        [page] = listed.json()["domains"]

        response = await client.post(
            "/console/api/dead-letters/replay",
            json={"domain": "scan", "all_matching": True, "q": job, "expected": 1},
        )

        assert page["matching"] == 2
        assert response.status_code == 409, response.text
        assert "2 dead letters of scan match now, not the 1" in response.json()["detail"]
        assert len(await letters(client, q=job)) == 2

    @pytest.mark.parametrize(
        ("body", "status"),
        [
            ({"domain": "scan"}, 422),
            ({"domain": "scan", "ids": ["x"]}, 422),
            ({"domain": "billing", "ids": ["1-1"]}, 404),
        ],
        ids=["neither-ids-nor-all", "malformed-id", "unknown-domain"],
    )
    async def test_a_bad_replay_request_is_refused(
        self, client: httpx.AsyncClient, body: dict[str, Any], status: int
    ) -> None:
        response = await client.post("/console/api/dead-letters/replay", json=body)

        assert response.status_code == status, response.text


class TestJobLookup:
    async def test_a_job_shows_its_state_and_history_in_seq_order(
        self, client: httpx.AsyncClient, streams: Redis
    ) -> None:
        job = job_in_shard(SCAN, 0, "looked-up")
        await add_event(streams, job, 10, stage="vision", status="started", progress="10")
        await add_event(streams, job, 11, stage="vision", status="completed", progress="25")

        async def both() -> dict[str, Any] | None:
            found = await client.get(f"/console/api/jobs/scan/{job}")
            body: dict[str, Any] = found.json()
            return body if found.status_code == 200 and len(body["history"]) == 2 else None

        view = await eventually(both, what="both events routed")

        assert (view["state"]["seq"], view["state"]["status"], view["state"]["progress"]) == (
            11,
            "completed",
            25,
        )
        assert [e["seq"] for e in view["history"]] == [10, 11]

    @pytest.mark.parametrize(
        ("path", "status"),
        [("scan/nobody-here", 404), ("billing/job-1", 404), ("scan/a%20b", 422)],
        ids=["unknown-job", "unknown-domain", "malformed-job-id"],
    )
    async def test_a_lookup_that_cannot_succeed_says_why(
        self, client: httpx.AsyncClient, path: str, status: int
    ) -> None:
        response = await client.get(f"/console/api/jobs/{path}")

        assert response.status_code == status
        assert response.json()["detail"]


async def _letters_of_entry(
    client: httpx.AsyncClient, job: str, entry_id: str
) -> list[dict[str, Any]]:
    return [x for x in await letters(client, q=job) if x["entry_id"] == entry_id]


def _letter_of(job: str, stream: str) -> dict[bytes, bytes]:
    """A dead letter, as the router writes one, of a valid event (its cause since fixed)."""
    return {
        b"stream": stream.encode(),
        b"id": b"1700000000000-0",
        b"reason": b"max_deliveries",
        b"detail": b"delivered 5 times",
        b"deliveries": b"5",
        b"dead_at_ms": b"1700000000000",
        b"field:job_id": job.encode(),
        b"field:seq": b"7",
        b"field:stage": b"vision",
        b"field:status": b"completed",
        b"field:progress": b"25",
    }
