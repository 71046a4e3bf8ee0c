"""One publisher per (client, config), kept on the client itself."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from eco_router.adapters.progress_entries import ProducerConfig

Client = TypeVar("Client")
Publisher = TypeVar("Publisher")


class PublisherCache(Generic[Client, Publisher]):
    """Publishers made once per client and config: a call then costs no script registration
    (and its SHA1). They live in the client's own attributes, not in a table of ours: a
    publisher holds its client, so any table would keep every client alive; this way they
    go together when the caller drops the client."""

    def __init__(self, name: str, make: Callable[[Client, ProducerConfig], Publisher]) -> None:
        self._attribute = f"_eco_router_{name}"
        self._make = make
        # Celery thread pools call from many threads: one publisher per client and config.
        self._lock = threading.Lock()

    def get(self, client: Client, config: ProducerConfig) -> Publisher:
        with self._lock:
            publishers: dict[ProducerConfig, Publisher] = self._of(client)
            publisher = publishers.get(config)
            if publisher is None:
                publisher = publishers[config] = self._make(client, config)
            return publisher

    def count(self, client: Client) -> int:
        """How many publishers `client` holds (one per layout it was called with)."""
        with self._lock:
            return len(self._of(client))

    def _of(self, client: Client) -> dict[ProducerConfig, Any]:
        attributes: dict[str, Any] = vars(client)
        found: dict[ProducerConfig, Any] = attributes.setdefault(self._attribute, {})
        return found
