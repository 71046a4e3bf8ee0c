"""What one request may send to the gateway (`EVENT_ROUTER_HTTP_MAX_*`), named apart from the
rules that enforce it (`request_bounds.py`) so the settings load without them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may send: its head (request line and headers, `max_head_bytes` in
    all) and its body, which must arrive whole within `body_timeout_s` of the head."""

    max_head_bytes: int = 32 * 1024
    max_request_line_bytes: int = 8 * 1024
    max_headers: int = 100
    max_body_bytes: int = 64 * 1024
    body_timeout_s: float = 10.0
