"""Secrets taken out of what the program prints: URL passwords, query-string tokens, and
whatever a client puts in a request line (the access log)."""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote, unquote_plus

HIDDEN = "***"
# A JWT (or JWE) in any text: a base64url JSON object (`{` encodes as `e`, then `y` or `w`),
# a dot, a payload, a dot.
_JWT = re.compile(r"e[wy][A-Za-z0-9_+/=-]{10,}\.[A-Za-z0-9_+/=-]+\.")
# A path segment longer than any job id (128 characters) is not one of ours: it may hold an
# opaque token.
_MAX_SHOWN_SEGMENT = 128
# A parameter name shown as it was meant (decoded); anything else (long, odd characters, a
# token sent as a name) is hidden.
_SHOWN_NAME = re.compile(r"[A-Za-z0-9_.\[\]-]{1,32}")
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


def redact_request_target(target: str) -> str:
    """A request's path and query as an access log shows them.

    - No query value is shown, whatever its name: `?job=***&last_event_id=***`. A token can
      be sent in any parameter, under a name encoded to look like another (`tok%65n`).
    - Parameter names are shown decoded (`tok%65n` as `token`), or hidden when they are not
      short plain names (a token sent as a name, control characters).
    - A path segment is hidden when, decoded, it holds something shaped like a JWT or is
      longer than any job id; the others are shown as they came.
    """
    path, question, query = target.partition("?")
    shown = "/".join(HIDDEN if _may_hold_token(unquote(s)) else s for s in path.split("/"))
    if not question:
        return shown
    return f"{shown}?{'&'.join(_parameter_shown(p) for p in query.split('&'))}"


def _may_hold_token(text: str) -> bool:
    return len(text) > _MAX_SHOWN_SEGMENT or _JWT.search(text) is not None


def _parameter_shown(parameter: str) -> str:
    """`name=***` (or `name` alone), the name decoded as a server reads it."""
    raw_name, equals, _ = parameter.partition("=")
    name = unquote_plus(raw_name)
    if name and (_SHOWN_NAME.fullmatch(name) is None or _JWT.search(name) is not None):
        name = HIDDEN
    return f"{name}{equals}{HIDDEN if equals else ''}"


class QueryTokenFilter(logging.Filter):
    """Hides what may be a token in the request lines of an access log: uvicorn logs the
    path (re-encoded) and the query string as the client sent them
    (`redact_request_target`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_arg(arg) for arg in record.args)
        if isinstance(record.msg, str):
            record.msg = redact_query(record.msg)
        return True


def _redact_arg(arg: object) -> object:
    if not isinstance(arg, str):
        return arg
    # uvicorn's request target is the only argument that starts with a slash.
    return redact_request_target(arg) if arg.startswith("/") else redact_query(arg)


def hide_access_log_tokens(logger_name: str = "uvicorn.access") -> None:
    """Install `QueryTokenFilter` on the access logger, once."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, QueryTokenFilter) for f in logger.filters):
        logger.addFilter(QueryTokenFilter())
