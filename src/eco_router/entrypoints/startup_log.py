"""The first log line of `worker` and `serve`: which servers, families, group and name."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from eco_router.adapters.redaction import redact_url

if TYPE_CHECKING:
    from eco_router.entrypoints.settings import Settings

log = logging.getLogger("eco_router")


def log_start(command: str, settings: Settings) -> None:
    log.info(
        "%s: streams %s, pubsub %s, families %s, group %s, consumer %s",
        command,
        redact_url(settings.redis_streams_url),
        redact_url(settings.pubsub_url),
        ",".join(f"{f.prefix}={f.shards}" for f in settings.streams),
        settings.consumer_group,
        settings.consumer_name,
    )
    if settings.order_wait_ms is not None:
        log.warning(
            "EVENT_ROUTER_ORDER_WAIT_MS is no longer used: each shard has one holder at a "
            "time (leases), which keeps every job's events in stream order"
        )
