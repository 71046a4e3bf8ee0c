"""The composition root: every adapter and use case, wired top-down."""

from __future__ import annotations

from dependency_injector import containers, providers
from prometheus_client import CollectorRegistry

from eco_router.adapters.json_codec import OrjsonEventDecoder, OrjsonEventEncoder
from eco_router.adapters.memory.broadcaster import InMemoryBroadcaster
from eco_router.adapters.memory.control_store import InMemoryControlStore
from eco_router.adapters.memory.dead_letter_archive import InMemoryDeadLetterArchive
from eco_router.adapters.memory.dead_letters import InMemoryDeadLetterSink
from eco_router.adapters.memory.event_feed import InMemoryEventFeed
from eco_router.adapters.memory.event_source import InMemoryEventSource
from eco_router.adapters.memory.leases import InMemoryLeaseStore
from eco_router.adapters.memory.presence_board import InMemoryPresenceBoard
from eco_router.adapters.memory.publisher import InMemoryStreamPublisher
from eco_router.adapters.memory.shard_progress import InMemoryShardProgress
from eco_router.adapters.memory.state_store import InMemoryStateStore
from eco_router.adapters.memory.streams import InMemoryStreams
from eco_router.adapters.prometheus.gateway_metrics import PrometheusGatewayMetrics
from eco_router.adapters.prometheus.health_metrics import PrometheusHealthMetrics
from eco_router.adapters.prometheus.readiness_metrics import PrometheusReadinessMetrics
from eco_router.adapters.prometheus.router_metrics import PrometheusRouterMetrics
from eco_router.adapters.redis.connections.connection import open_pinned_reader, open_redis
from eco_router.adapters.redis.connections.replica_wait import ReplicaWait
from eco_router.adapters.redis.control_store import RedisControlStore
from eco_router.adapters.redis.gateway.presence_board import RedisPresenceBoard
from eco_router.adapters.redis.producer.publisher import AsyncStreamPublisher
from eco_router.adapters.redis.router.dead_letters import (
    RedisDeadLetterArchive,
    RedisStreamDeadLetterSink,
)
from eco_router.adapters.redis.router.event_source import RedisStreamEventSource
from eco_router.adapters.redis.router.lease_store import RedisLeaseStore
from eco_router.adapters.redis.router.shard_progress import RedisShardProgress
from eco_router.adapters.redis.router.state_store import RedisLuaStateStore
from eco_router.adapters.system_clock import SystemClock
from eco_router.application.check_readiness import CheckReadiness
from eco_router.application.console_snapshot import ReadConsoleSnapshot
from eco_router.application.consume_loop import ConsumeLoop
from eco_router.application.control_inbox import ControlInbox
from eco_router.application.dead_letter_listing import ListDeadLetters
from eco_router.application.demo_jobs import RunDemoJobs, StartDemoJob
from eco_router.application.feed_health import FeedHealth
from eco_router.application.held_shards import HeldShards
from eco_router.application.job_lookup import ListJobControls, LookUpJob
from eco_router.application.keep_leases import KeepLeases
from eco_router.application.observe_shards import ObserveShards
from eco_router.application.presence import (
    LAPSE_AFTER_PERIODS,
    CountJobViewers,
    PostViewerCounts,
    ViewerTally,
)
from eco_router.application.reclaim_pending import ReclaimPending
from eco_router.application.replay_dead_letters import ReplayDeadLetters
from eco_router.application.route_batch import RouteBatch
from eco_router.application.router_health import RouterHealth
from eco_router.application.router_service import RouterService
from eco_router.application.send_control import SendControl
from eco_router.application.stream_job_events import StreamJobEvents, StreamLimits
from eco_router.application.stream_many_jobs import StreamManyJobs
from eco_router.entrypoints.factories import (
    demo_chat_producer_config,
    demo_producer_config,
    make_admin_authorizer,
    make_authorizer,
    make_broadcaster,
    open_event_feed,
)
from eco_router.entrypoints.settings import Settings


class Container(containers.DeclarativeContainer):
    """Redis adapters by default; `use_in_memory()` swaps in the in-memory ones."""

    settings = providers.Dependency(instance_of=Settings)

    clock = providers.Singleton(SystemClock)
    metrics_registry = providers.Singleton(CollectorRegistry)
    health_metrics = providers.Singleton(PrometheusHealthMetrics, registry=metrics_registry)
    metrics = providers.Singleton(
        PrometheusRouterMetrics, registry=metrics_registry, health=health_metrics
    )
    encoder = providers.Singleton(OrjsonEventEncoder)

    streams_redis = providers.Resource(
        open_redis,
        url=settings.provided.redis_streams_url,
        socket_timeout_s=settings.provided.streams_socket_timeout_s,
        client_name="eco-router-streams",
    )
    pubsub_redis = providers.Resource(
        open_redis,
        url=settings.provided.pubsub_url,
        socket_timeout_s=5.0,
        client_name="eco-router-pubsub",
    )

    # The router's blocking reads, on a connection of their own (None on a cluster).
    streams_reader = providers.Resource(
        open_pinned_reader,
        url=settings.provided.redis_streams_url,
        socket_timeout_s=settings.provided.streams_socket_timeout_s,
        client_name="eco-router-streams-reader",
    )
    event_source = providers.Singleton(
        RedisStreamEventSource,
        streams_redis,
        families=settings.provided.streams,
        group=settings.provided.consumer_group,
        consumer=settings.provided.consumer_name,
        reader=streams_reader,
    )
    lease_store = providers.Singleton(
        RedisLeaseStore,
        streams_redis,
        families=settings.provided.streams,
        group=settings.provided.consumer_group,
        ttl_ms=settings.provided.lease_ttl_ms,
    )
    state_store = providers.Singleton(
        RedisLuaStateStore,
        streams_redis,
        group=settings.provided.consumer_group,
        state_ttl_s=settings.provided.state_ttl_s,
        markers_ttl_s=settings.provided.published_ttl_s,
        history_size=settings.provided.history_size,
        history_max_bytes=settings.provided.history_max_bytes,
        text_max_bytes=settings.provided.text_max_bytes,
        held_jobs=settings.provided.held_jobs,
        families=settings.provided.streams,
        replica_wait=providers.Factory(
            ReplicaWait, settings.provided.wait_replicas, settings.provided.wait_timeout_ms
        ),
    )
    control_store = providers.Singleton(
        RedisControlStore,
        streams_redis,
        families=settings.provided.streams,
        state_ttl_s=settings.provided.state_ttl_s,
        clock=clock,
        replica_wait=providers.Factory(
            ReplicaWait, settings.provided.wait_replicas, settings.provided.wait_timeout_ms
        ),
    )
    send_control = providers.Singleton(
        SendControl,
        store=control_store,
        clock=clock,
        limits=settings.provided.control_limits,
    )
    broadcaster = providers.Singleton(
        make_broadcaster,
        pubsub_redis,
        channel_prefix=settings.provided.channel_prefix,
    )
    dead_letters = providers.Singleton(
        RedisStreamDeadLetterSink, streams_redis, marker_ttl_s=settings.provided.published_ttl_s
    )

    route_batch = providers.Singleton(
        RouteBatch,
        source=event_source,
        store=state_store,
        broadcaster=broadcaster,
        dead_letters=dead_letters,
        encoder=encoder,
        metrics=metrics,
        clock=clock,
        max_deliveries=settings.provided.max_deliveries,
        max_field_bytes=settings.provided.max_field_bytes,
        size_limits=settings.provided.event_size_limits,
    )
    held_shards = providers.Singleton(HeldShards)
    router_health = providers.Singleton(
        RouterHealth,
        clock=clock,
        metrics=metrics,
        families=settings.provided.streams,
        quarantine_retry_s=settings.provided.quarantine_retry_s,
    )
    keep_leases = providers.Singleton(
        KeepLeases,
        leases=lease_store,
        held=held_shards,
        router=settings.provided.consumer_name,
        families=settings.provided.streams,
        metrics=metrics,
        clock=clock,
        renew_s=settings.provided.lease_renew_s,
        health=router_health,
    )
    consume_loop = providers.Singleton(
        ConsumeLoop,
        source=event_source,
        route=route_batch,
        held=held_shards,
        metrics=metrics,
        clock=clock,
        read_count=settings.provided.read_count,
        block_ms=settings.provided.read_block_ms,
        health=router_health,
    )
    reclaim_pending = providers.Singleton(
        ReclaimPending,
        source=event_source,
        broadcaster=broadcaster,
        route=route_batch,
        held=held_shards,
        metrics=metrics,
        clock=clock,
        min_idle_ms=settings.provided.reclaim_min_idle_ms,
        page_size=settings.provided.read_count,
        health=router_health,
    )
    observe_shards = providers.Singleton(ObserveShards, source=event_source, metrics=metrics)
    router = providers.Singleton(
        RouterService,
        leases=keep_leases,
        consume=consume_loop,
        reclaim=reclaim_pending,
        observe=observe_shards,
        reclaim_interval_s=settings.provided.reclaim_interval_s,
        observe_interval_s=settings.provided.stats_interval_s,
        health=router_health,
        max_restarts=settings.provided.task_max_restarts,
        restart_window_s=settings.provided.task_restart_window_s,
    )
    feed_health = providers.Singleton(FeedHealth)
    # The gateway's own supervised tasks (the presence poster); none runs in a worker.
    gateway_health = providers.Singleton(
        RouterHealth, clock=clock, metrics=health_metrics, idle_check=None
    )
    readiness_metrics = providers.Singleton(PrometheusReadinessMetrics, registry=metrics_registry)
    check_readiness = providers.Singleton(
        CheckReadiness,
        source=event_source,
        broadcaster=broadcaster,
        router=router,
        feed=feed_health,
        metrics=readiness_metrics,
        tasks=gateway_health,
    )

    memory_streams = providers.Singleton(InMemoryStreams, clock=clock)

    decoder = providers.Singleton(OrjsonEventDecoder)
    # The job streams open in this process, counted as they open and close.
    viewer_tally = providers.Singleton(ViewerTally)
    gateway_metrics = providers.Singleton(
        PrometheusGatewayMetrics, registry=metrics_registry, viewers=viewer_tally
    )
    event_feed = providers.Resource(
        open_event_feed,
        pubsub_redis,
        channel_prefix=settings.provided.channel_prefix,
        decoder=decoder,
        metrics=gateway_metrics,
        queue_size=settings.provided.sse_queue_size,
        health=feed_health,
    )
    authorizer = providers.Singleton(
        make_authorizer,
        settings.provided.jwt_secret,
        settings.provided.jwt_require_exp,
        settings.provided.jwt_max_bytes,
    )
    stream_limits = providers.Singleton(
        StreamLimits,
        keepalive_s=settings.provided.sse_keepalive_s,
        max_wait_s=settings.provided.sse_max_wait_s,
        job_idle_s=settings.provided.sse_job_idle_s,
        recheck_s=settings.provided.sse_recheck_s,
        history_size=settings.provided.history_size,
        history_trimmed_above_bytes=settings.provided.history_trimmed_above_bytes,
    )
    stream_job_events = providers.Singleton(
        StreamJobEvents,
        feed=event_feed,
        store=state_store,
        decoder=decoder,
        clock=clock,
        metrics=gateway_metrics,
        limits=stream_limits,
        viewers=viewer_tally,
    )
    stream_many_jobs = providers.Singleton(
        StreamManyJobs, jobs=stream_job_events, keepalive_s=settings.provided.sse_keepalive_s
    )
    # Every gateway's viewer counts, on the Pub/Sub server (volatile, like the channels);
    # a gateway's lapse a few periods after its last post.
    presence_ttl_s = providers.Callable(
        lambda interval_s: LAPSE_AFTER_PERIODS * interval_s, settings.provided.presence_interval_s
    )
    presence_board = providers.Singleton(
        RedisPresenceBoard,
        pubsub_redis,
        namespace=settings.provided.channel_prefix,
        ttl_s=presence_ttl_s,
    )
    post_viewer_counts = providers.Singleton(
        PostViewerCounts,
        tally=viewer_tally,
        board=presence_board,
        gateway=settings.provided.consumer_name,
    )

    # The operator console: what `status`, `dlq` and `state` read, for the HTTP layer.
    admin_authorizer = providers.Singleton(
        make_admin_authorizer, settings.provided.jwt_secret, settings.provided.jwt_max_bytes
    )
    dead_letter_archive = providers.Singleton(RedisDeadLetterArchive, streams_redis)
    shard_progress = providers.Singleton(
        RedisShardProgress,
        streams_redis,
        families=settings.provided.streams,
        group=settings.provided.consumer_group,
    )
    console_snapshot = providers.Singleton(
        ReadConsoleSnapshot,
        leases=lease_store,
        source=event_source,
        progress=shard_progress,
        archive=dead_letter_archive,
        families=settings.provided.streams,
        group=settings.provided.consumer_group,
    )
    list_dead_letters = providers.Singleton(
        ListDeadLetters, archive=dead_letter_archive, families=settings.provided.streams
    )
    replay_dead_letters = providers.Singleton(
        ReplayDeadLetters, archive=dead_letter_archive, families=settings.provided.streams
    )
    look_up_job = providers.Singleton(
        LookUpJob, store=state_store, families=settings.provided.streams
    )
    list_job_controls = providers.Singleton(
        ListJobControls, store=control_store, families=settings.provided.streams
    )
    count_job_viewers = providers.Singleton(
        CountJobViewers, board=presence_board, families=settings.provided.streams
    )

    producer_config = providers.Singleton(demo_producer_config, settings)
    demo_publisher = providers.Singleton(AsyncStreamPublisher, streams_redis, producer_config)
    chat_producer_config = providers.Singleton(demo_chat_producer_config, settings)
    chat_demo_publisher = providers.Singleton(
        AsyncStreamPublisher, streams_redis, chat_producer_config
    )
    start_demo_job = providers.Singleton(
        StartDemoJob,
        run=providers.Singleton(
            RunDemoJobs,
            publisher=demo_publisher,
            chat_publisher=chat_demo_publisher,
            stages=producer_config.provided.plan.stages,
            rate=settings.provided.demo_events_per_s,
            controls=providers.Singleton(
                ControlInbox, control_store, chat_producer_config.provided.family.domain
            ),
        ),
    )


def use_in_memory(container: Container) -> None:
    """Replace every Redis adapter with its in-memory twin (no sockets are opened)."""
    settings = container.settings
    container.streams_redis.override(providers.Object(None))
    container.streams_reader.override(providers.Object(None))
    container.pubsub_redis.override(providers.Object(None))
    container.event_source.override(
        providers.Singleton(
            InMemoryEventSource,
            container.memory_streams,
            families=settings.provided.streams,
            group=settings.provided.consumer_group,
            consumer=settings.provided.consumer_name,
        )
    )
    lease_table = providers.Callable(
        lambda streams, group: streams.lease_table(group),
        container.memory_streams,
        settings.provided.consumer_group,
    )
    container.lease_store.override(
        providers.Singleton(InMemoryLeaseStore, lease_table, ttl_ms=settings.provided.lease_ttl_ms)
    )
    container.state_store.override(
        providers.Singleton(
            InMemoryStateStore,
            clock=container.clock,
            streams=container.memory_streams,
            group=settings.provided.consumer_group,
            state_ttl_s=settings.provided.state_ttl_s,
            markers_ttl_s=settings.provided.published_ttl_s,
            history_size=settings.provided.history_size,
            history_max_bytes=settings.provided.history_max_bytes,
            text_max_bytes=settings.provided.text_max_bytes,
        )
    )
    container.control_store.override(
        providers.Singleton(
            InMemoryControlStore,
            streams=container.memory_streams,
            states=container.state_store,
            families=settings.provided.streams,
            state_ttl_s=settings.provided.state_ttl_s,
            clock=container.clock,
        )
    )
    container.broadcaster.override(
        providers.Singleton(InMemoryBroadcaster, channel_prefix=settings.provided.channel_prefix)
    )
    container.dead_letters.override(
        providers.Singleton(InMemoryDeadLetterSink, container.memory_streams)
    )
    container.event_feed.override(
        providers.Singleton(
            InMemoryEventFeed,
            container.broadcaster,
            decoder=container.decoder,
            metrics=container.gateway_metrics,
            queue_size=settings.provided.sse_queue_size,
        )
    )
    container.dead_letter_archive.override(
        providers.Singleton(InMemoryDeadLetterArchive, container.memory_streams)
    )
    container.presence_board.override(
        providers.Singleton(
            InMemoryPresenceBoard,
            clock=container.clock,
            ttl_s=container.presence_ttl_s,
        )
    )
    container.shard_progress.override(
        providers.Singleton(
            InMemoryShardProgress,
            container.memory_streams,
            families=settings.provided.streams,
            group=settings.provided.consumer_group,
        )
    )
    container.demo_publisher.override(
        providers.Singleton(
            InMemoryStreamPublisher, container.memory_streams, container.producer_config
        )
    )
    container.chat_demo_publisher.override(
        providers.Singleton(
            InMemoryStreamPublisher, container.memory_streams, container.chat_producer_config
        )
    )


def build_container(
    settings: Settings, *, in_memory: bool = False, route: bool = True
) -> Container:
    """A fresh container for `settings`; nothing is resolved yet.

    `route=False` is a process that serves SSE while worker processes route: its readiness
    does not ask for a router.
    """
    container = Container(settings=settings)
    if in_memory:
        use_in_memory(container)
    if not route:
        container.check_readiness.override(
            providers.Singleton(
                CheckReadiness,
                source=container.event_source,
                broadcaster=container.broadcaster,
                router=None,
                feed=container.feed_health,
                metrics=container.readiness_metrics,
                tasks=container.gateway_health,
            )
        )
    return container
