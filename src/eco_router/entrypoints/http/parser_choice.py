"""The HTTP/1.1 parsers the gateway can run on (`EVENT_ROUTER_HTTP_PARSER`), named apart from
the protocols that use them so the settings load without the web stack."""

from __future__ import annotations

from typing import Literal

HttpParserChoice = Literal["httptools", "h11"]
