"""Configuration from the environment, validated at startup."""

from __future__ import annotations

import dataclasses
import difflib
import os
import socket
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from eco_router.adapters.jwt_secret import MAX_TOKEN_BYTES, MIN_SECRET_BYTES
from eco_router.adapters.redaction import redact_query, redact_url
from eco_router.adapters.redis.connections.topology import ClusterSeeds, parse_redis_url
from eco_router.domain.control import MAX_CONTROL_BODY_BYTES, ControlLimits
from eco_router.domain.event_size import (
    DEFAULT_HISTORY_MAX_BYTES,
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    EventSizeLimits,
)
from eco_router.domain.streams import StreamFamily
from eco_router.domain.text import DEFAULT_TEXT_MAX_BYTES
from eco_router.entrypoints.event_loop import EventLoopChoice, loop_factory
from eco_router.entrypoints.http.origins import parse_origins
from eco_router.entrypoints.http.parser_choice import HttpParserChoice
from eco_router.entrypoints.http.request_limits import RequestLimits
from eco_router.producer_variables import DOMAIN_VARIABLE, SHARDS_VARIABLE

_ENV_PREFIX = "EVENT_ROUTER_"
# Read by the producer SDK, not by the router: a shared environment may well hold them.
_PRODUCER_VARIABLES = frozenset({DOMAIN_VARIABLE, SHARDS_VARIABLE})
_REQUEST_LIMITS = RequestLimits()
_CONTROL_LIMITS = ControlLimits()


def default_consumer_name() -> str:
    """`POD_NAME` in Kubernetes, else hostname-pid: unique per process, stable per pod."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def parse_families(spec: str) -> tuple[StreamFamily, ...]:
    """`scan:events=4,chat:events=4` → the two families."""
    families: list[StreamFamily] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        prefix, sep, count = part.rpartition("=")
        if not sep or not prefix or not count.strip().isdigit():
            raise ValueError(f"{part!r} is not PREFIX=SHARDS (e.g. scan:events=4)")
        shards = int(count)
        if not 1 <= shards <= 1024:
            raise ValueError(f"{part!r}: shard count must be 1-1024")
        if any(c in prefix for c in " {}*?[]"):
            raise ValueError(f"{part!r}: prefix may not contain spaces, braces or glob characters")
        families.append(StreamFamily(prefix.strip(), shards))
    if not families:
        raise ValueError("no stream family given")
    domains = [f.domain for f in families]
    if len(set(domains)) != len(domains):
        raise ValueError(f"two families share a domain (first segment): {domains}")
    return tuple(families)


def check_redis_url(url: str) -> None:
    """Raise `ValueError` saying what is wrong unless `url` names a topology this router runs on."""
    parse_redis_url(url)


def is_cluster_url(url: str) -> bool:
    return isinstance(parse_redis_url(url), ClusterSeeds)


class Settings(BaseSettings):
    """Every setting of the router; env names as documented in docs/CONFIGURATION.md."""

    model_config = SettingsConfigDict(
        env_prefix=_ENV_PREFIX, extra="forbid", frozen=True, populate_by_name=True
    )

    redis_streams_url: str = Field(
        "redis://localhost:6379/0", validation_alias=AliasChoices("REDIS_STREAMS_URL")
    )
    redis_pubsub_url: str | None = Field(None, validation_alias=AliasChoices("REDIS_PUBSUB_URL"))
    # `tagged` names every shard and its jobs' keys with a hash tag (one slot per shard);
    # `auto` picks it on a Redis Cluster, where nothing else works.
    key_layout: Literal["auto", "plain", "tagged"] = "auto"
    streams: Annotated[tuple[StreamFamily, ...], NoDecode] = Field(
        parse_families("scan:events=4,chat:events=4"), validate_default=True
    )
    consumer_group: str = Field("eventrouter", min_length=1)
    consumer_name: str = Field(default_factory=default_consumer_name, min_length=1)
    read_count: int = Field(100, ge=1, le=10_000)
    read_block_ms: int = Field(5000, ge=1, le=60_000)
    # Kept so existing configurations still load; order across routers is by shard leases now.
    order_wait_ms: int | None = Field(None, ge=0, le=60_000)
    # Opt-in durability across a streams failover: a batch is published only once this many
    # replicas have its state writes (and so the entries, replicated before them).
    wait_replicas: int = Field(0, ge=0, le=100)
    wait_timeout_ms: int = Field(500, ge=1, le=60_000)
    lease_ttl_ms: int = Field(4000, ge=100, le=600_000)
    lease_renew_ms: int = Field(1000, ge=10, le=200_000)
    state_ttl_s: int = Field(3600, ge=1)
    published_ttl_s: int = Field(7200, ge=1)
    reclaim_min_idle_ms: int = Field(300_000, ge=1)
    reclaim_interval_s: float = Field(60, gt=0)
    max_deliveries: int = Field(5, ge=1)
    history_size: int = Field(100, ge=1, le=10_000)
    # Jobs whose records a router keeps in memory (docs/ARCHITECTURE.md#held-records).
    held_jobs: int = Field(50_000, ge=0, le=10_000_000)
    channel_prefix: str = Field("sse:events", min_length=1)
    # The operator console (/console on `serve`): off unless asked for.
    console: bool = False
    # /docs, /redoc and /openapi.json on `serve`: off unless asked for; never the console's API.
    api_docs: bool = False
    console_refresh_s: float = Field(2, gt=0, le=300)
    max_field_bytes: int = Field(64 * 1024, ge=1)
    max_event_bytes: int = Field(DEFAULT_MAX_EVENT_BYTES, ge=256)
    max_result_bytes: int = Field(DEFAULT_MAX_RESULT_BYTES, ge=256)
    history_max_bytes: int = Field(DEFAULT_HISTORY_MAX_BYTES, ge=1024)
    # A job's answer text, kept whole for viewers that resume; past it, the attempt's later
    # tokens are not routed and the job's end marks the text truncated.
    text_max_bytes: int = Field(DEFAULT_TEXT_MAX_BYTES, ge=1024, le=512 * 1024 * 1024)
    stats_interval_s: float = Field(5, gt=0)
    # Bounds on one job's control messages (docs/CONTROL.md#bounds); a cancel passes them all.
    control_max_waiting: int = Field(_CONTROL_LIMITS.max_waiting, ge=1, le=100_000)
    control_max_waiting_bytes: int = Field(
        _CONTROL_LIMITS.max_waiting_bytes, ge=MAX_CONTROL_BODY_BYTES, le=64 * 1024 * 1024
    )
    control_max_messages: int = Field(_CONTROL_LIMITS.max_messages, ge=1, le=1_000_000)
    control_rate_per_s: float = Field(_CONTROL_LIMITS.rate_per_s, gt=0, le=100_000)
    control_burst: int = Field(_CONTROL_LIMITS.burst, ge=1, le=100_000)
    jwt_secret: SecretStr | None = None
    jwt_require_exp: bool = True
    # Longer tokens get 401 before any decoding: a token's cost grows with its size.
    jwt_max_bytes: int = Field(MAX_TOKEN_BYTES, ge=512, le=1024 * 1024)
    cors_origins: Annotated[tuple[str, ...], NoDecode] = ()
    jwt_cookie: str = Field("eco_router_token", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    sse_keepalive_s: float = Field(15, gt=0)
    sse_max_wait_s: float = Field(300, gt=0)
    # A job with no event for this long and no end is idle (its end lost, or abandoned): its
    # streams end with `event: error` (`idle`) and a resuming client gets 204.
    sse_job_idle_s: float = Field(600, gt=0)
    # A stream that heard nothing of its job for this long reads the job's state again, so an
    # end lost on its way from Redis still ends it.
    sse_recheck_s: float = Field(60, gt=0)
    sse_queue_size: int = Field(256, ge=2, le=100_000)
    # Bounds on clients of `serve` (slow, idle or too many connections).
    sse_max_per_client: int = Field(32, ge=1, le=100_000)
    # Jobs on one `GET /api/v1/streams` connection; its Last-Event-ID grows 14 bytes a job.
    sse_max_jobs_per_stream: int = Field(50, ge=1, le=500)
    http_max_connections: int = Field(1000, ge=1, le=1_000_000)
    http_header_timeout_s: float = Field(10, gt=0, le=3600)
    http_idle_timeout_s: int = Field(5, ge=1, le=3600)
    http_shutdown_timeout_s: float = Field(10, gt=0, le=3600)
    http_parser: HttpParserChoice = "httptools"
    # 0: no cap per address (behind a proxy that is not in FORWARDED_ALLOW_IPS).
    http_max_connections_per_client: int = Field(64, ge=0, le=1_000_000)
    # What one request may send (the request line counts toward the header bytes).
    http_max_header_bytes: int = Field(_REQUEST_LIMITS.max_head_bytes, ge=1024, le=16 * 2**20)
    http_max_headers: int = Field(_REQUEST_LIMITS.max_headers, ge=8, le=10_000)
    http_max_request_line_bytes: int = Field(
        _REQUEST_LIMITS.max_request_line_bytes, ge=256, le=16 * 2**20
    )
    http_max_body_bytes: int = Field(_REQUEST_LIMITS.max_body_bytes, ge=1024, le=2**30)
    http_body_timeout_s: float = Field(_REQUEST_LIMITS.body_timeout_s, gt=0, le=3600)
    # Pods need every interface so the kubelet's probes and Prometheus reach the worker's port;
    # it serves only /health, /ready and /metrics, never job data.
    http_host: str = "0.0.0.0"
    http_port: int = Field(8001, ge=0, le=65_535)
    gateway_metrics: bool = False
    # Slow enough that a person can drop the connection mid-job on the demo page.
    demo_events_per_s: float = Field(1.5, gt=0, le=10_000)
    log_level: str = "INFO"
    event_loop: EventLoopChoice = "auto"
    # Failing loud and recovering: quarantined shards, supervised tasks.
    quarantine_retry_s: float = Field(10, gt=0, le=3600)
    task_max_restarts: int = Field(5, ge=0, le=1000)
    task_restart_window_s: float = Field(60, gt=0, le=86_400)
    # How often a gateway posts its viewer counts for the console (sooner after a change);
    # they lapse after three of these without a post.
    presence_interval_s: float = Field(5, gt=0, le=300)

    @field_validator("streams", mode="before")
    @classmethod
    def _parse_streams(cls, value: object) -> object:
        return parse_families(value) if isinstance(value, str) else value

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _parse_origins(cls, value: object) -> object:
        return parse_origins(value) if isinstance(value, str) else value

    @field_validator("streams")
    @classmethod
    def _lay_out_streams(
        cls, value: tuple[StreamFamily, ...], info: ValidationInfo
    ) -> tuple[StreamFamily, ...]:
        layout = info.data.get("key_layout")
        url = info.data.get("redis_streams_url")
        tagged = layout == "tagged" or (
            layout == "auto" and url is not None and is_cluster_url(url)
        )
        return tuple(dataclasses.replace(f, tagged=tagged) for f in value)

    @field_validator("redis_streams_url", "redis_pubsub_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None:
            check_redis_url(value)
        return value

    @field_validator("channel_prefix")
    @classmethod
    def _check_channel_prefix(cls, value: str) -> str:
        # The prefix names the viewer counts' hash tag, and on sharded Pub/Sub a brace would
        # pin every job's channel to one slot.
        if "{" in value or "}" in value:
            raise ValueError("must not contain { or }")
        return value

    @field_validator("jwt_secret")
    @classmethod
    def _check_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value():
            raise ValueError("must not be empty (unset it to run without authorization)")
        if value is not None and len(value.get_secret_value().encode()) < MIN_SECRET_BYTES:
            raise ValueError(
                f"must be at least {MIN_SECRET_BYTES} bytes for HS256 "
                "(e.g. the output of `openssl rand -base64 32`)"
            )
        return value

    @field_validator("event_loop")
    @classmethod
    def _check_loop(cls, value: EventLoopChoice) -> EventLoopChoice:
        # Only `uvloop` can be refused (`auto` falls back to asyncio's loop): the other
        # choices are not checked by importing uvloop, which every command would pay for.
        if value == "uvloop":
            loop_factory(value)
        return value

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return level

    @model_validator(mode="after")
    def _check_layout(self) -> Settings:
        if self.key_layout == "plain" and is_cluster_url(self.redis_streams_url):
            raise ValueError(
                "EVENT_ROUTER_KEY_LAYOUT=plain cannot run on a Redis Cluster (REDIS_STREAMS_URL "
                "is redis+cluster://): a batch's keys would span slots; use auto or tagged"
            )
        return self

    @model_validator(mode="after")
    def _check_ttls(self) -> Settings:
        if self.published_ttl_s < self.state_ttl_s:
            raise ValueError(
                "EVENT_ROUTER_PUBLISHED_TTL_S must be at least EVENT_ROUTER_STATE_TTL_S, or a "
                "redelivered old event could be applied over a newer state"
            )
        return self

    @model_validator(mode="after")
    def _check_leases(self) -> Settings:
        if self.lease_renew_ms * 3 > self.lease_ttl_ms:
            raise ValueError(
                "EVENT_ROUTER_LEASE_RENEW_MS must be at most a third of EVENT_ROUTER_LEASE_TTL_MS, "
                "so one late heartbeat does not lose a router its shards"
            )
        return self

    @model_validator(mode="after")
    def _check_sizes(self) -> Settings:
        if not self.max_event_bytes <= self.max_result_bytes <= self.history_max_bytes:
            raise ValueError(
                "EVENT_ROUTER_MAX_EVENT_BYTES <= EVENT_ROUTER_MAX_RESULT_BYTES <= "
                "EVENT_ROUTER_HISTORY_MAX_BYTES must hold, so every routed event fits a history"
            )
        return self

    @model_validator(mode="after")
    def _check_connections_per_client(self) -> Settings:
        cap = self.http_max_connections_per_client
        if cap and cap < self.sse_max_per_client:
            raise ValueError(
                "EVENT_ROUTER_HTTP_MAX_CONNECTIONS_PER_CLIENT must be 0 (no cap) or at least "
                "EVENT_ROUTER_SSE_MAX_PER_CLIENT: each stream holds a connection"
            )
        return self

    @property
    def history_trimmed_above_bytes(self) -> int:
        """A history trimmed by bytes keeps more than the cap less its largest event."""
        return self.history_max_bytes - self.max_result_bytes

    @property
    def request_limits(self) -> RequestLimits:
        return RequestLimits(
            max_head_bytes=self.http_max_header_bytes,
            max_request_line_bytes=self.http_max_request_line_bytes,
            max_headers=self.http_max_headers,
            max_body_bytes=self.http_max_body_bytes,
            body_timeout_s=self.http_body_timeout_s,
        )

    @property
    def control_limits(self) -> ControlLimits:
        return ControlLimits(
            max_waiting=self.control_max_waiting,
            max_waiting_bytes=self.control_max_waiting_bytes,
            max_messages=self.control_max_messages,
            rate_per_s=self.control_rate_per_s,
            burst=self.control_burst,
        )

    @property
    def event_size_limits(self) -> EventSizeLimits:
        return EventSizeLimits(self.max_event_bytes, self.max_result_bytes)

    @property
    def domains(self) -> tuple[str, ...]:
        return tuple(f.domain for f in self.streams)

    @property
    def pubsub_url(self) -> str:
        return self.redis_pubsub_url or self.redis_streams_url

    @property
    def lease_renew_s(self) -> float:
        return self.lease_renew_ms / 1000

    @property
    def streams_socket_timeout_s(self) -> float:
        """Longer than a blocking read, so a quiet stream is not mistaken for a dead server."""
        return self.read_block_ms / 1000 + 5.0


class ConfigError(Exception):
    """The environment holds an invalid setting; the message names the variable."""


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment (and overrides), or `ConfigError` naming what is wrong."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as error:
        raise ConfigError(describe(error)) from error


def describe(error: ValidationError) -> str:
    """One line per problem, naming the variable; never a password or a secret."""
    lines = []
    for problem in error.errors():
        location = str(problem["loc"][0]) if problem["loc"] else ""
        message = _message(problem)
        if not location:
            # A rule across settings: its input is the whole environment, secrets included.
            lines.append(f"invalid configuration: {message}")
            continue
        shown = _shown(location, problem)
        lines.append(f"invalid configuration: {_env_name(location)}: {message} ({shown})")
    return "\n".join(lines)


def _message(problem: Any) -> str:
    """pydantic's message without the "Value error, " it puts before a validator's own."""
    message = str(problem["msg"])
    if problem.get("type") == "value_error":
        return message.removeprefix("Value error, ")
    return message


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each `EVENT_ROUTER_*` variable no setting reads (a typo, most likely)."""
    known = [
        name.upper()
        for name, field in Settings.model_fields.items()
        if field.validation_alias is None
    ]
    warnings = []
    for name in sorted(environ):
        suffix = name.removeprefix(_ENV_PREFIX)
        if suffix == name or suffix in known or name in _PRODUCER_VARIABLES:
            continue
        # Matched without the shared prefix, which would make every name look close.
        close = difflib.get_close_matches(suffix, known, n=1)
        hint = f" (did you mean {_ENV_PREFIX}{close[0]}?)" if close else ""
        warnings.append(f"{name} is not a setting and is ignored{hint}")
    return warnings


def _shown(field: str, problem: Any) -> str:
    value = problem.get("input")
    if field.lower() in _SECRET_FIELDS:
        return "value hidden"
    if isinstance(value, str) and field.lower() in _URL_FIELDS:
        return f"got {redact_url(value)!r}"
    return f"got {redact_query(value) if isinstance(value, str) else value!r}"


_SECRET_FIELDS = frozenset({"jwt_secret"})
_URL_FIELDS = frozenset({"redis_streams_url", "redis_pubsub_url"})


def _env_name(field: str) -> str:
    if field.isupper():
        return field
    return f"{_ENV_PREFIX}{field.upper()}"
