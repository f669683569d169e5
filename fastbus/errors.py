"""Exceptions raised by fastbus.

Every error fastbus raises on purpose derives from :class:`FastbusError`, and
also from the built-in exception a Python user would expect (``KeyError`` for
removing what was never added, ``ValueError`` for malformed input), so either
can be caught.
"""

from __future__ import annotations

__all__ = ["BatchError", "FastbusError", "ForwarderError", "NotSubscribedError", "PublishTimeout"]


class FastbusError(Exception):
    """Base class of fastbus's own errors."""


class NotSubscribedError(FastbusError, KeyError):
    """Removing a (key, kind, subscriber) that is not held."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "not subscribed"


class BatchError(FastbusError, ValueError):
    """A batch is malformed, truncated, of an unknown version, over a limit or
    fails its checksum.  ``reason`` is one of ``"malformed"``, ``"truncated"``,
    ``"version"``, ``"limit"``, ``"checksum"``."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class PublishTimeout(FastbusError, TimeoutError):
    """publish() waited ``block_timeout`` seconds for room in a full buffer
    (the broker or the Redis server not taking messages, or publishers
    asked to pause); the message was not queued."""


class ForwarderError(FastbusError):
    """An event in :meth:`fastbus.Forwarder.apply` failed.

    The events before it were applied: ``diff`` holds their upstream diff,
    which the caller must still send, and ``index`` the position of the
    failing event.  The failure itself is ``__cause__``."""

    def __init__(self, message: str, diff: list, index: int) -> None:
        super().__init__(message)
        self.diff = diff
        self.index = index
