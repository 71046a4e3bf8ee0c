"""The origins `EVENT_ROUTER_CORS_ORIGINS` lists, parsed as browsers send them (no web stack
imported: the settings use it, and the CLI loads the settings)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(\.{_LABEL})*|\[[0-9a-f:.]+\]")


def parse_origins(spec: str) -> tuple[str, ...]:
    """`https://app.example.com,http://localhost:3000` → the origins as browsers send them."""
    origins: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if part:
            origins.append(_origin(part))
    return tuple(dict.fromkeys(origins))


def _origin(text: str) -> str:
    if text == "*" or "*" in text:
        raise ValueError(
            f"{text!r}: wildcards are not allowed; credentials (the token cookie) need exact "
            "origins, e.g. https://app.example.com"
        )
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ValueError(f"{text!r} is not an origin (scheme://host[:port])") from None
    scheme, host = parts.scheme.lower(), (parts.hostname or "")
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"{text!r}: an origin starts with http:// or https://")
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(
            f"{text!r}: an origin is scheme://host[:port] only, no path, query or trailing /"
        )
    if ":" in host:
        host = f"[{host}]"
    if not _HOST.fullmatch(host):
        raise ValueError(f"{text!r}: {host!r} is not a host name")
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"
