"""Configuration from the environment, validated at startup."""

from __future__ import annotations

import os
import socket
from typing import Annotated

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from eco_router.domain.streams import StreamFamily

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


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


class Settings(BaseSettings):
    """Every setting of the router; env names as documented in the README."""

    model_config = SettingsConfigDict(
        env_prefix="EVENT_ROUTER_", extra="forbid", frozen=True, populate_by_name=True
    )

    redis_streams_url: str = Field(
        "redis://localhost:6379/0", validation_alias=AliasChoices("REDIS_STREAMS_URL")
    )
    redis_pubsub_url: str | None = Field(None, validation_alias=AliasChoices("REDIS_PUBSUB_URL"))
    streams: Annotated[tuple[StreamFamily, ...], NoDecode] = parse_families("scan:events=4")
    consumer_group: str = Field("eventrouter", min_length=1)
    consumer_name: str = Field(default_factory=default_consumer_name, min_length=1)
    read_count: int = Field(100, ge=1, le=10_000)
    read_block_ms: int = Field(5000, ge=1, le=60_000)
    # Kept so existing configurations still load; order across routers is by shard leases now.
    order_wait_ms: int | None = Field(None, ge=0, le=60_000)
    lease_ttl_ms: int = Field(4000, ge=100, le=600_000)
    lease_renew_ms: int = Field(1000, ge=10, le=200_000)
    state_ttl_s: int = Field(3600, ge=1)
    published_ttl_s: int = Field(7200, ge=1)
    reclaim_min_idle_ms: int = Field(300_000, ge=1)
    reclaim_interval_s: float = Field(60, gt=0)
    max_deliveries: int = Field(5, ge=1)
    history_size: int = Field(100, ge=1, le=10_000)
    channel_prefix: str = Field("sse:events", min_length=1)
    max_field_bytes: int = Field(64 * 1024, ge=1)
    stats_interval_s: float = Field(5, gt=0)
    jwt_secret: SecretStr | None = None
    jwt_cookie: str = Field("eco_router_token", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    sse_keepalive_s: float = Field(15, gt=0)
    sse_max_wait_s: float = Field(300, gt=0)
    sse_queue_size: int = Field(256, ge=2, le=100_000)
    # Pods need every interface so the kubelet's probes and Prometheus reach the worker's port;
    # it serves only /health, /ready and /metrics, never job data.
    http_host: str = "0.0.0.0"
    http_port: int = Field(8001, ge=0, le=65_535)
    gateway_metrics: bool = False
    # Slow enough that a person can drop the connection mid-job on the demo page.
    demo_events_per_s: float = Field(1.5, gt=0, le=10_000)
    log_level: str = "INFO"

    @field_validator("streams", mode="before")
    @classmethod
    def _parse_streams(cls, value: object) -> object:
        return parse_families(value) if isinstance(value, str) else value

    @field_validator("redis_streams_url", "redis_pubsub_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(_REDIS_SCHEMES):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @field_validator("jwt_secret")
    @classmethod
    def _check_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value():
            raise ValueError("must not be empty (unset it to run without authorization)")
        return value

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return level

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
    lines = []
    for problem in error.errors():
        location = problem["loc"][0] if problem["loc"] else ""
        name = _env_name(str(location)) if location else "settings"
        lines.append(f"{name}: {problem['msg']} (got {problem.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _env_name(field: str) -> str:
    if field.isupper():
        return field
    return f"EVENT_ROUTER_{field.upper()}"
