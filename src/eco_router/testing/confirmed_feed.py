"""The Pub/Sub adapter's fan-out without its Redis connection, for tests and benchmarks of
what happens between a message and its viewers."""

from __future__ import annotations

from eco_router.adapters.redis.gateway.channel_viewers import ChannelViewers, Viewer
from eco_router.application.ports import EventFeed, FeedSubscription


class ConfirmedFeed(EventFeed):
    """The Pub/Sub adapter's viewers, each channel confirmed as it is subscribed: hand a
    message to `viewers.deliver` as the adapter's reader would."""

    def __init__(self, viewers: ChannelViewers) -> None:
        self.viewers = viewers

    async def subscribe(self, domain: str, job_id: str) -> FeedSubscription:
        viewer, first = self.viewers.join(self._leave, f"events:{job_id}", domain)
        if first:
            self.viewers.subscribed(f"events:{job_id}")
        return viewer

    async def _leave(self, viewer: Viewer) -> None:
        self.viewers.leave(viewer)

    def close_viewers(self) -> None:
        self.viewers.close_all()
