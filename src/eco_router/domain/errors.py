"""Errors raised by domain rules."""


class DomainError(Exception):
    """Base of the errors the domain raises."""


class InvalidStreamName(DomainError):
    """A stream name that does not follow `{domain}:...:{shard}`."""
