"""Exceptions raised by fastbus.

Every error fastbus raises on purpose derives from :class:`FastbusError`, and
also from the built-in exception a Python user would expect (``KeyError`` for
removing what was never added, ``ValueError`` for malformed input), so either
can be caught.

This module is where every public exception of the package is defined (the
modules that raise them, and ``fastbus``, ``fastbus.queue``,
``fastbus.redis``, ``fastbus.spark``, import them from here; their old
import paths keep working).  tests/test_modules.py checks it.

The errors about a Redis server (:class:`RedisServerError` and its
subclasses :class:`ServerUnavailable`, :class:`NotARedisServer`,
:class:`ServerTimeout`, :class:`PayloadTooLarge`, :class:`ServerRefused`,
:class:`ServerOutOfMemory`) also derive from redis-py's exception classes,
so they are defined in :mod:`fastbus.redis.errors` and imported from here
on first use (importing this module does not import redis-py).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

__all__ = ["AddressInUse", "BatchError", "BrokerTimeout", "BrokerUnavailable", "ConnectionClosed", "DataPlaneUnavailable",
           "FastbusError",
           "DurableNameInUse", "FlushTimeout", "ForwarderError", "InvalidEndpoint", "InvalidKey", "JournalError", "KeyRefused", "ListenError",
           "MessageTooLarge", "MessagesRejected", "MonitorBindError", "NoHandlerError", "NotABroker", "NotARedisServer", "NotSubscribedError", "PayloadTooLarge",
           "PublishTimeout", "RedisServerError", "ServerOutOfMemory", "ServerRefused", "ServerTimeout",
           "ServerUnavailable"]
__all__ += ["HoldRefused", "NoResponders", "QueueFull", "RequestTimeout"]
__all__ += ["CommandFailed", "ConsumerGone", "ConsumerTagInUse", "EmbeddedServerError", "InvalidConfig", "InvalidURL", "OptionError",
            "PartialBatchError", "PastLastId", "ProtocolError", "PublishError", "QueueError", "ServerNotFoundError", "UsageError"]

# Defined with redis-py's classes among their bases (fastbus.redis.errors).
_REDIS_ERRORS = frozenset({"NotARedisServer", "PayloadTooLarge", "RedisServerError", "ServerOutOfMemory",
                           "ServerRefused", "ServerTimeout", "ServerUnavailable"})


if TYPE_CHECKING:       # what __getattr__ hands out, for type checkers
    from fastbus.redis.errors import (NotARedisServer, PayloadTooLarge, RedisServerError, ServerOutOfMemory,
                                       ServerRefused, ServerTimeout, ServerUnavailable)


def __getattr__(name: str) -> type[FastbusError]:
    if name in _REDIS_ERRORS:
        from fastbus.redis.errors import (NotARedisServer, PayloadTooLarge, RedisServerError, ServerOutOfMemory,
                                           ServerRefused, ServerTimeout, ServerUnavailable)
        classes = (NotARedisServer, PayloadTooLarge, RedisServerError, ServerOutOfMemory, ServerRefused,
                   ServerTimeout, ServerUnavailable)
        return {c.__name__: c for c in classes}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class FastbusError(Exception):
    """Base class of fastbus's own errors."""

    def __init__(self, *args: object) -> None:
        if _redis_pending and "redis.exceptions" in sys.modules:
            adopt_redis_bases()
        super().__init__(*args)

    #: (redis-py's RedisError, a base of some once redis-py is imported,
    #: reads these in its repr and its retries; its __init__ is not run.)
    error_type = None
    status_code = None

    def __repr__(self) -> str:
        return BaseException.__repr__(self)


#: fastbus's errors of a broker's connection that are also redis-py's (the
#: class redis-py raises for the same failure, redis.exceptions.<value>),
#: so that ``except redis.ConnectionError`` around code ported from
#: redis-py catches them.  Importing fastbus does not import redis-py (it
#: would double the import's time): the bases are added once redis-py is
#: imported, checked when such an error is made, so before any ``except``
#: clause (which needs redis imported) can look at one; and at once when
#: fastbus.errors is imported after redis-py, or a fastbus module imports it.
_REDIS_BASES = {"BrokerUnavailable": "ConnectionError", "ConnectionClosed": "ConnectionError",
                "BrokerTimeout": "TimeoutError", "FlushTimeout": "TimeoutError", "PublishTimeout": "TimeoutError"}
_redis_pending = True


def adopt_redis_bases() -> None:
    """Add redis-py's classes to the bases of the errors in _REDIS_BASES
    (redis-py imported: idempotent)."""
    global _redis_pending
    if not _redis_pending:
        return
    _redis_pending = False
    from redis import exceptions as rx
    for name, base in _REDIS_BASES.items():
        cls = globals()[name]
        extra = getattr(rx, base)
        if extra not in cls.__mro__:
            cls.__bases__ = (*cls.__bases__, extra)


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


class MessageTooLarge(FastbusError, ValueError):
    """``publish()`` refused a message over the broker's limits, before
    queueing it (nothing was sent): ``what`` is ``"payload"`` or ``"channel
    name"``, ``size`` its bytes, ``limit`` the broker's (``max_payload`` or
    ``max_topic``, which the broker says when the client connects)."""

    def __init__(self, message: str, what: str, size: int, limit: int) -> None:
        super().__init__(message)
        self.what = what
        self.size = size
        self.limit = limit


class InvalidEndpoint(FastbusError, ValueError):
    """An endpoint that is not ``tcp://HOST:PORT``, ``ipc://PATH`` or
    ``inproc://NAME`` (or, to listen on, not a loopback address without
    ``allow_remote``); ``endpoint`` is what was given, ``setting`` the
    :class:`~fastbus.BrokerConfig` field it was given in (``"bind"``,
    ``"upstream"``...), if any."""

    def __init__(self, message: str, endpoint: str = "", setting: str | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.setting = setting


class InvalidURL(FastbusError, ValueError):
    """A Redis URL that is not ``redis://``, ``rediss://`` or ``unix://``
    (from an argument, an option or ``$FASTBUS_REDIS_URL``: the message
    says which); ``url`` is what was given."""

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class InvalidConfig(FastbusError, ValueError):
    """A :class:`~fastbus.BrokerConfig` setting that cannot work (a negative
    size, an unknown policy...); the message names it."""


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


class DurableNameInUse(FastbusError, PermissionError):
    """The broker refused a durable subscriber's name (``name``): another
    live process holds it (one process at a time may), or the broker keeps
    no durable sessions.  The PubSub does not try again: close it."""

    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)
        self.name = name

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "durable name refused"


class BrokerTimeout(FastbusError, TimeoutError):
    """No broker answered at ``endpoint`` within the time asked (a stats
    query, a broker's counters)."""

    def __init__(self, message: str, endpoint: str = "") -> None:
        super().__init__(message)
        self.endpoint = endpoint

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no broker answered"


class NoResponders(FastbusError, LookupError):
    """A request (:meth:`Client.request`) that no subscriber of its channel
    could answer: the broker routed it to nobody (or the client's filter,
    the broker's view, says nobody wants the channel).  Said at once, not
    after the timeout."""

    def __init__(self, channel: Any) -> None:
        super().__init__(f"no responders: nobody subscribes to {channel!r}")
        self.channel = channel


class QueueFull(FastbusError, BufferError):
    """:meth:`Client.enqueue` to a held group that did not keep the
    message: the group holds as many as the call's ``capacity`` allows, or
    the broker's bound of what held groups keep (``max_held_bytes``) is
    reached.  Nothing was sent to anyone."""

    def __init__(self, channel: Any) -> None:
        super().__init__(f"queue full: the held group of {channel!r} keeps no more")
        self.channel = channel


class HoldRefused(FastbusError, RuntimeError):
    """:meth:`Client.hold` refused by the broker (its ``max_held_groups``,
    or a broker without held groups); the message says why."""


class RequestTimeout(FastbusError, TimeoutError):
    """A request (:meth:`Client.request`) whose reply did not come within
    its timeout (a subscriber got it but did not answer in time, or its
    answer was lost with a connection)."""

    def __init__(self, channel: Any, timeout: float) -> None:
        super().__init__(f"no reply to a request on {channel!r} within {timeout:g} s")
        self.channel = channel
        self.timeout = timeout


class BrokerUnavailable(FastbusError, ConnectionRefusedError, TimeoutError):
    """Nothing listens at the broker's TCP address (the connection was
    refused): said at once rather than after a timeout.  Also a
    ``TimeoutError``, what waiting for that broker would have raised."""

    def __init__(self, message: str, endpoint: str = "") -> None:
        super().__init__(message)
        self.endpoint = endpoint

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no broker"


class NotABroker(BrokerUnavailable):
    """What listens at the client's endpoint is not a fastbus broker: it
    answered a Redis ``PING`` (a Redis server on its port), or HTTP, or
    spoke first in something that is not ZeroMQ.  Said within about a
    second instead of waiting out the timeout; ``what`` says what it is."""

    def __init__(self, message: str, endpoint: str = "", what: str = "") -> None:
        super().__init__(message, endpoint)
        self.what = what


class ProtocolError(FastbusError, ValueError):
    """A peer sent something that is not valid protocol."""


class PublishError(FastbusError):
    """Messages that were not written.  ``failed`` holds them as
    ``(channel_or_key, payload)`` pairs (bytes), ``count`` how many, and
    ``reason`` the server's error or the network error that ended the
    retries, in one line naming the server (``host:port``); ``error`` is that
    error as a :mod:`fastbus.errors` exception (``ServerUnavailable``,
    ``ServerOutOfMemory``, ``PayloadTooLarge``...) when there is one."""

    def __init__(self, message: str, failed: list[tuple[bytes, bytes]], reason: str,
                 error: BaseException | None = None) -> None:
        super().__init__(message)
        self.failed = failed
        self.count = len(failed)
        self.reason = reason
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.failed, self.reason))


class DataPlaneUnavailable(FastbusError, RuntimeError):
    """The broker, or a client's session, cannot start: its data plane (C
    code calling the libzmq that pyzmq loaded) cannot run in this process;
    the message says why and what to install."""


class EmbeddedServerError(FastbusError, RuntimeError):
    """The embedded server could not be started or used."""


class ServerNotFoundError(EmbeddedServerError):
    """No Redis-compatible server binary was found (the message says what to install)."""


class QueueError(FastbusError):
    """A queue operation the server refused (the message says why)."""


class ConsumerTagInUse(QueueError):
    """Another live consumer holds this consumer tag (its heartbeat has not expired)."""


class ConsumerGone(QueueError, LookupError):
    """The logical consumer of a topic that this instance serves is not
    registered (it was unregistered while the instance ran, or never was).
    The instance stops: its heartbeat ends and every later call raises this."""


class PastLastId(QueueError, ValueError):
    """``Topic.ack_upto(consumer, last)`` with ``last`` past the last id
    published on the topic: nothing was removed."""


class PartialBatchError(QueueError):
    """A ``put_many`` or ``publish_many`` of several script calls was written
    in part.  Each call is atomic; some were written, the others not (the
    server refused them, say out of memory, or the connection broke).

    ``written``: the positions, in the list given, of the payloads that were
    written; ``ids``: their ids, in the same order; ``unknown``: positions
    whose fate could not be found out (the server could not be asked after
    the failure; usually empty); ``total``: how many were given.  Every other
    payload was not written and never will be: retry exactly those.  The
    failure itself is ``__cause__``."""

    def __init__(self, message: str, written: list[int], ids: list[int], unknown: list[int], total: int) -> None:
        super().__init__(message)
        self.written = written
        self.ids = ids
        self.unknown = unknown
        self.total = total


class OptionError(FastbusError, ValueError):
    """A bad or missing ``format("fastbus")`` option."""


class UsageError(FastbusError, ValueError):
    """A ``fastbus`` command's arguments are wrong or do not fit together:
    the command line says so in one line and exits 2."""


class CommandFailed(FastbusError, RuntimeError):
    """A ``fastbus`` command could not do its work: the command line says
    so in one line and exits 1."""


class ListenError(FastbusError, OSError):
    """The broker cannot listen on ``endpoint`` (``errno`` says why)."""

    def __init__(self, message: str, endpoint: str = "", errno: int | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.errno = errno

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "cannot listen"


class JournalError(FastbusError, OSError):
    """The broker's journal (--journal DIR) cannot be read or written
    (``errno`` says why): said at start, before anything is served."""

    def __init__(self, message: str, path: str = "", errno: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "journal unusable"


class AddressInUse(ListenError):
    """Another process (another broker?) already listens on ``endpoint``."""


class MonitorBindError(ListenError):
    """The monitoring HTTP server (``--http``) cannot listen on its address
    (in use, or not an address of this machine); the message says which."""


if "redis.exceptions" in sys.modules:        # redis-py came first: its bases now
    adopt_redis_bases()
