"""Which Redis a URL names: one server, a Sentinel group, or a Cluster.

    redis://[user:pass@]host:6379/0            one server (also rediss://, unix://)
    redis+sentinel://[user:pass@]h1:26379,h2:26379/<master-name>/<db>
    redis+cluster://[user:pass@]h1:7000,h2:7001   any reachable seed nodes

`rediss+sentinel://` and `rediss+cluster://` speak TLS. The user and password are the data
nodes' (master, replicas, cluster nodes); sentinels take theirs from the query
(`sentinel_username`, `sentinel_password`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_SENTINEL_PORT = 26379
DEFAULT_REDIS_PORT = 6379

_STANDALONE_SCHEMES = ("redis", "rediss", "unix")
_SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
_CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
_TLS_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password", "sentinel_ssl")
_CERT_REQS = ("none", "optional", "required")
_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


@dataclass(frozen=True, slots=True)
class Standalone:
    """One Redis server, connected to with redis-py's own URL parser."""

    url: str


@dataclass(frozen=True, slots=True)
class Credentials:
    """What every data node of a group is connected with."""

    username: str | None = None
    password: str | None = None
    tls: bool = False
    tls_options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SentinelGroup:
    """A master found through its sentinels, followed across failovers."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int
    credentials: Credentials
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    sentinel_tls: bool = False


@dataclass(frozen=True, slots=True)
class ClusterSeeds:
    """A Redis Cluster, discovered from any of its reachable nodes."""

    nodes: tuple[tuple[str, int], ...]
    credentials: Credentials


RedisTopology = Standalone | SentinelGroup | ClusterSeeds


def parse_redis_url(url: str) -> RedisTopology:
    """The topology `url` names, or `ValueError` saying in one line what is wrong with it.

    redis-py itself fails late on some mistakes (a traceback for a bad port) and silently
    ignores others (`/abc` as the database becomes database 0).
    """
    try:
        parts = urlsplit(url)
    except ValueError as error:
        raise ValueError(f"is not a valid URL ({error})") from None
    scheme = parts.scheme
    if scheme in _STANDALONE_SCHEMES:
        _check_standalone(url)
        return Standalone(url)
    if scheme not in (*_SENTINEL_SCHEMES, *_CLUSTER_SCHEMES):
        raise ValueError(
            "must start with redis://, rediss://, unix://, redis+sentinel://, "
            "rediss+sentinel://, redis+cluster:// or rediss+cluster://"
        )
    credentials_part, _, hosts_part = parts.netloc.rpartition("@")
    options = _options(parts.query)
    tls = scheme.startswith("rediss")
    username, password = _user_and_password(credentials_part)
    credentials = Credentials(username, password, tls, _tls_options(options, tls))
    if scheme in _SENTINEL_SCHEMES:
        master_name, db = _master_and_db(parts.path)
        sentinel_tls = _flag(options.pop("sentinel_ssl", None), default=tls, name="sentinel_ssl")
        _no_unknown(options, (*_TLS_OPTIONS, "sentinel_username", "sentinel_password"))
        return SentinelGroup(
            sentinels=_addresses(hosts_part, DEFAULT_SENTINEL_PORT),
            master_name=master_name,
            db=db,
            credentials=credentials,
            sentinel_username=options.get("sentinel_username"),
            sentinel_password=options.get("sentinel_password"),
            sentinel_tls=sentinel_tls,
        )
    if parts.path not in ("", "/", "/0"):
        raise ValueError("Redis Cluster has only database 0 (drop the path, or use /0)")
    _no_unknown(options, _TLS_OPTIONS)
    return ClusterSeeds(_addresses(hosts_part, DEFAULT_REDIS_PORT), credentials)


def _check_standalone(url: str) -> None:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise ValueError("port must be a number from 1 to 65535") from None
    databases = parse_qs(parts.query).get("db", [])
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("names no socket path (unix:///path/to/redis.sock)")
    else:
        if not parts.hostname:
            raise ValueError("names no host (redis://HOST:PORT/DB)")
        if port == 0:
            raise ValueError("port must be a number from 1 to 65535")
        if parts.path not in ("", "/"):
            databases.insert(0, parts.path[1:])
    for database in databases:
        if not (database.isascii() and database.isdigit()):
            raise ValueError(f"database {database!r} is not a number (e.g. /0)")


def _user_and_password(credentials: str) -> tuple[str | None, str | None]:
    if not credentials:
        return None, None
    user, colon, password = credentials.partition(":")
    if not colon:
        # `redis://secret@host` is the password alone, as redis-py reads it.
        return None, unquote(user)
    return unquote(user) or None, unquote(password) or None


def _addresses(hosts: str, default_port: int) -> tuple[tuple[str, int], ...]:
    """`h1:26379,[::1]:26380,h3` → ((h1, 26379), (::1, 26380), (h3, default))."""
    found = []
    for item in hosts.split(","):
        item = item.strip()
        if not item:
            raise ValueError("names an empty host (HOST:PORT,HOST:PORT,...)")
        if item.startswith("["):
            host, bracket, rest = item[1:].partition("]")
            if not bracket or (rest and not rest.startswith(":")):
                raise ValueError(f"host {item!r} is not [IPv6]:PORT")
            port_text = rest[1:]
        else:
            host, _, port_text = item.partition(":")
        if not host:
            raise ValueError(f"host {item!r} names no host")
        port = default_port
        if port_text:
            digits = port_text.isascii() and port_text.isdigit()
            if not digits or not 1 <= int(port_text) <= 65535:
                raise ValueError(f"port of {item!r} must be a number from 1 to 65535")
            port = int(port_text)
        found.append((host, port))
    return tuple(found)


def _master_and_db(path: str) -> tuple[str, int]:
    segments = [unquote(s) for s in path.split("/")[1:]]
    if not segments or not segments[0]:
        raise ValueError("names no master (redis+sentinel://HOST:26379,HOST:26379/MASTER-NAME/DB)")
    if len(segments) > 2:
        raise ValueError("path must be /MASTER-NAME or /MASTER-NAME/DB")
    db = segments[1] if len(segments) == 2 and segments[1] else "0"
    if not (db.isascii() and db.isdigit()):
        raise ValueError(f"database {db!r} is not a number (e.g. /mymaster/0)")
    return segments[0], int(db)


def _options(query: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for name, values in parse_qs(query, keep_blank_values=True).items():
        if len(values) > 1:
            raise ValueError(f"option {name!r} is given twice")
        options[name] = values[0]
    return options


def _tls_options(options: dict[str, str], tls: bool) -> dict[str, str]:
    chosen = {name: options[name] for name in _TLS_OPTIONS if name in options}
    if chosen and not tls:
        raise ValueError(
            f"{', '.join(chosen)} need TLS: use rediss+sentinel:// or rediss+cluster://"
        )
    reqs = chosen.get("ssl_cert_reqs")
    if reqs is not None and reqs not in _CERT_REQS:
        raise ValueError(f"ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}")
    return chosen


def _flag(value: str | None, *, default: bool, name: str) -> bool:
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"option {name} must be true or false")


def _no_unknown(options: Mapping[str, str], known: tuple[str, ...]) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} (known: {', '.join(known)})")
