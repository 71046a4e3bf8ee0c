"""Errors that adapters raise through the ports."""


class PortError(Exception):
    """Base of the errors a port may raise."""


class TransientError(PortError):
    """The infrastructure behind a port is unreachable or timed out: retry later, ack nothing."""


class ReplicasBehind(TransientError):
    """Fewer replicas than asked acknowledged a write in time; the write itself is done."""


class BroadcastFailed(TransientError):
    """A broadcast did not reach the Pub/Sub server; the events it carried are owed one."""


class Unauthorized(PortError):
    """No valid credentials were presented."""


class Forbidden(PortError):
    """The credentials are valid but do not grant access to this job."""


class PermanentError(PortError):
    """The server refused a command for a reason retrying alone will not fix (a key of the
    wrong type, a missing permission): `key` is broken until an operator fixes it."""

    def __init__(self, key: str, cause: str) -> None:
        super().__init__(f"{key}: {cause}" if key else cause)
        self.key = key
        self.cause = cause


class JobEnded(PortError):
    """A control message for a job that has already ended (its `done`, or a failure)."""


class UnknownJob(PortError):
    """A control message for a job that has no event yet (never started, or expired)."""


class RequestIdConflict(PortError):
    """A request id its sender used before for another kind of control message."""


class ControlLimited(PortError):
    """A control message refused by a bound that waiting lifts (messages waiting for the
    worker, the sender's rate): retry after `retry_after_s`."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ControlExhausted(PortError):
    """A control message past the number a job may be sent in its lifetime."""
