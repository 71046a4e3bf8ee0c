"""Secrets taken out of what the program prints: URL passwords and query-string tokens."""

from __future__ import annotations

import logging
import re

HIDDEN = "***"
# Query parameters that carry credentials (tokens, passwords, secrets, keys), prefixed or not:
# `sentinel_password`, `access_token`.
_SECRET_PARAM = re.compile(
    r"(?i)(?P<name>(?:^|[?&;\s\"'])"
    r"[a-z0-9_.-]*(?:token|password|passwd|pass|secret|jwt|api[_-]?key|auth|authorization)=)"
    r"(?P<value>[^&;#\s\"']*)"
)


def redact_url(url: str) -> str:
    """`url` without its password, in the user-info part and in any `password=` parameter."""
    scheme, sep, rest = url.partition("://")
    location, query_sep, query = rest.partition("?")
    if sep and "@" in location:
        credentials, _, host = location.rpartition("@")
        user, colon, _ = credentials.partition(":")
        # Without a colon the one word may be a password written where the user goes.
        location = f"{user}:{HIDDEN}@{host}" if colon and user else f"{HIDDEN}@{host}"
    return redact_query(f"{scheme}{sep}{location}{query_sep}{query}")


def redact_query(text: str) -> str:
    """`text` with the value of every credential-carrying `name=value` parameter hidden."""
    if "=" not in text:
        return text
    return _SECRET_PARAM.sub(lambda m: m["name"] + HIDDEN, text)


class QueryTokenFilter(logging.Filter):
    """Hides tokens in the request lines of an access log (uvicorn logs the query string)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                redact_query(arg) if isinstance(arg, str) else arg for arg in record.args
            )
        if isinstance(record.msg, str):
            record.msg = redact_query(record.msg)
        return True


def hide_access_log_tokens(logger_name: str = "uvicorn.access") -> None:
    """Install `QueryTokenFilter` on the access logger, once."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, QueryTokenFilter) for f in logger.filters):
        logger.addFilter(QueryTokenFilter())
