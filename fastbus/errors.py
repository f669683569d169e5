"""Exceptions raised by fastbus.

Every error fastbus raises on purpose derives from :class:`FastbusError`, and
also from the built-in exception a Python user would expect (``KeyError`` for
removing what was never added, ``ValueError`` for malformed input), so either
can be caught.

The errors about a Redis server (:class:`RedisServerError` and its
subclasses :class:`ServerUnavailable`, :class:`NotARedisServer`,
:class:`ServerTimeout`, :class:`PayloadTooLarge`, :class:`ServerRefused`,
:class:`ServerOutOfMemory`) also derive from redis-py's exception classes,
so they are defined in :mod:`fastbus.redis._errors` and imported from here
on first use (importing this module does not import redis-py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["AddressInUse", "BatchError", "BrokerTimeout", "BrokerUnavailable", "ConnectionClosed", "FastbusError",
           "FlushTimeout", "ForwarderError", "InvalidEndpoint", "InvalidKey", "KeyRefused", "ListenError",
           "MessagesRejected", "MonitorBindError", "NoHandlerError", "NotARedisServer", "NotSubscribedError", "PayloadTooLarge",
           "PublishTimeout", "RedisServerError", "ServerOutOfMemory", "ServerRefused", "ServerTimeout",
           "ServerUnavailable"]

# Defined with redis-py's classes among their bases (fastbus.redis._errors).
_REDIS_ERRORS = frozenset({"NotARedisServer", "PayloadTooLarge", "RedisServerError", "ServerOutOfMemory",
                           "ServerRefused", "ServerTimeout", "ServerUnavailable"})


if TYPE_CHECKING:       # what __getattr__ hands out, for type checkers
    from fastbus.redis._errors import (NotARedisServer, PayloadTooLarge, RedisServerError, ServerOutOfMemory,
                                       ServerRefused, ServerTimeout, ServerUnavailable)


def __getattr__(name: str) -> type[FastbusError]:
    if name in _REDIS_ERRORS:
        from fastbus.redis import _errors
        return getattr(_errors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


class FlushTimeout(FastbusError, TimeoutError):
    """flush() or close() waited its ``timeout`` and messages are still not
    answered; ``pending`` says how many.  After a flush() they stay queued
    (written or reported later); close() reports them as failed instead."""

    def __init__(self, message: str, pending: int = 0) -> None:
        super().__init__(message)
        self.pending = pending

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "flush timed out"


class ConnectionClosed(FastbusError):
    """The client or pubsub was closed."""


class NoHandlerError(FastbusError, RuntimeError):
    """PubSub.run_in_thread() with a channel or pattern that has no handler."""


class ForwarderError(FastbusError):
    """An event in :meth:`fastbus.Forwarder.apply` failed.

    The events before it were applied: ``diff`` holds their upstream diff,
    which the caller must still send, and ``index`` the position of the
    failing event.  The failure itself is ``__cause__``."""

    def __init__(self, message: str, diff: list[tuple[int, bytes, bool]], index: int) -> None:
        super().__init__(message)
        self.diff = diff
        self.index = index


class MessagesRejected(FastbusError, ValueError):
    """The broker dropped messages of this client (``count``), for example
    over its size limits; the message says why."""

    def __init__(self, message: str, count: int) -> None:
        super().__init__(message)
        self.count = count


class InvalidEndpoint(FastbusError, ValueError):
    """An endpoint that is not ``tcp://HOST:PORT``, ``ipc://PATH`` or
    ``inproc://NAME``; ``endpoint`` is what was given."""

    def __init__(self, message: str, endpoint: str = "") -> None:
        super().__init__(message)
        self.endpoint = endpoint


class InvalidKey(FastbusError, ValueError):
    """A CURVE key that is not 40 Z85 characters (a key file's name, say,
    where the key itself was expected)."""


class KeyRefused(FastbusError, PermissionError):
    """The broker at ``endpoint`` refused this client's CURVE handshake (its
    key is not among those the broker accepts, or the broker key given is
    wrong)."""

    def __init__(self, message: str, endpoint: str = "") -> None:
        super().__init__(message)
        self.endpoint = endpoint

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "CURVE key refused"


class BrokerTimeout(FastbusError, TimeoutError):
    """No broker answered at ``endpoint`` within the time asked (a stats
    query, a broker's counters)."""

    def __init__(self, message: str, endpoint: str = "") -> None:
        super().__init__(message)
        self.endpoint = endpoint

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no broker answered"


class BrokerUnavailable(FastbusError, ConnectionRefusedError, TimeoutError):
    """Nothing listens at the broker's TCP address (the connection was
    refused): said at once rather than after a timeout.  Also a
    ``TimeoutError``, what waiting for that broker would have raised."""

    def __init__(self, message: str, endpoint: str = "") -> None:
        super().__init__(message)
        self.endpoint = endpoint

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no broker"


class ListenError(FastbusError, OSError):
    """The broker cannot listen on ``endpoint`` (``errno`` says why)."""

    def __init__(self, message: str, endpoint: str = "", errno: int | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.errno = errno

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "cannot listen"


class AddressInUse(ListenError):
    """Another process (another broker?) already listens on ``endpoint``."""


class MonitorBindError(ListenError):
    """The monitoring HTTP server (``--http``) cannot listen on its address
    (in use, or not an address of this machine); the message says which."""
