"""The process's exit statuses, as documented in docs/RUNNING.md."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What `eco-router` exits with; Kubernetes and scripts tell the causes apart by it."""

    OK = 0  # a clean stop (SIGTERM, SIGINT, or a command that did its work)
    ERROR = 1  # an unexpected error, or a command's own "not found"
    CONFIGURATION = 2  # an invalid setting or argument, credentials or a database a server refused
    UNREACHABLE = 3  # a dependency (a Redis server, the listening port) unavailable at startup
    TASK_KEPT_FAILING = 4  # a router task died too often (RouterService's supervisor gave up)
    BROKEN_PIPE = 141  # stdout closed by its reader (`| head`): 128 + SIGPIPE, as other tools
