"""A Redis pub/sub subscriber that decodes many messages per call.

redis-py's ``PubSub.get_message()`` parses one reply per call and builds its
dict in Python.  ``Subscriber`` reads whatever the socket holds and decodes
all complete messages in one C call, into redis-py-shaped dicts
(``get_message``/``listen``) or into ``(channel, data)`` tuples
(``get_batch``).  After a server restart or a broken connection it
reconnects with backoff, subscribes again to everything, and tells the
caller with a ``gap`` notice: Redis keeps nothing for absent subscribers, so
what was published meanwhile is lost, and the notice says for how long.
While the server is down, ``get_message`` and ``get_batch`` keep trying to
reconnect, and still return within their ``timeout``.

    with Subscriber(url) as sub:
        sub.subscribe("news")
        sub.psubscribe("market.*")
        for msg in sub.listen():
            ...
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any, Self

import redis

from fastbus import _messages as M
from fastbus._messages import MessageBuffer, PubSubMessage, resp_pubsub_decode, to_bytes
from fastbus.errors import BatchError
from fastbus.redis.connection import Connection
from fastbus.redis.errors import not_redis, translate

log = logging.getLogger("fastbus.redis")

__all__ = ["Subscriber"]

READ_SIZE = 1 << 18


def _command(*args) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(parts)


_name = to_bytes     # channels and patterns: one rule (fastbus._messages)


class Subscriber:
    """Subscribe to Redis channels (``subscribe``) and glob patterns
    (``psubscribe``, Redis's own matching).  ``redis`` is a URL, a
    ``redis.Redis`` or a pool; None uses fastbus's embedded server.

    Messages are dicts as redis-py's: ``type`` (``subscribe``, ``message``,
    ``pmessage``, ...), ``pattern``, ``channel``, ``data``; plus ``gap``
    notices after a reconnect (``data``: ``{"lost": None, "down_s": seconds
    without a subscription}``, the shape of every gap notice: messages
    published in that time were not received, and Redis does not count them).
    ``down_s`` runs from the last moment the subscriber knew its connection
    was open (a read that found it open, or the moment a read in progress
    saw it close) to the resubscription: exact when the subscriber was
    reading, an upper bound when it was not.

    The first connection is made by the first ``subscribe()``; if it fails,
    that call raises (:class:`fastbus.errors.ServerUnavailable`...).  Later,
    a lost connection is reconnected by the reads, within their timeout.
    ``decode_responses=True`` gives str.  Not thread-safe: one reader."""

    def __init__(self, redis: Any = None, *, decode_responses: bool = False,
                 ignore_subscribe_messages: bool = False, reconnect_max_delay: float = 2.0) -> None:
        if not 0 < reconnect_max_delay <= 60:
            raise ValueError("reconnect_max_delay must be between 0 and 60 seconds")
        self._conn = Connection(redis, "SUBSCRIBE")
        self.decode_responses = decode_responses
        self.ignore_subscribe_messages = ignore_subscribe_messages
        self._max_delay = reconnect_max_delay
        self.channels: set[bytes] = set()
        self.patterns: set[bytes] = set()
        self._sock = None
        self._buf = bytearray()
        # fastbus._messages.MessageBuffer: dicts (get_message(): everything,
        # in order), pairs (get_batch(): data messages), notices (the others,
        # read by get_batch(), for get_message()).
        self._queued = MessageBuffer()
        self._dicts = self._queued.dicts
        self._pairs = self._queued.pairs
        self._notices = self._queued.notices
        self._closed = False
        self.reconnects = 0
        self._alive_at = 0.0               # when the connection was last known open (monotonic)
        self._down_since: float | None = None    # lost: messages may be missed since then
        self._delay = 0.05                 # the next reconnect's backoff
        self._next_attempt = 0.0
        self.last_error: BaseException | None = None   # why the last reconnect attempt failed

    # -- subscriptions -----------------------------------------------------

    def subscribe(self, *channels) -> None:
        """Subscribe to channels (a list first, as redis-py takes)."""
        channels = M.names_given(channels)
        if not channels:
            raise ValueError("subscribe() needs at least one channel")
        names = [_name(c) for c in channels]
        self._send(_command(b"SUBSCRIBE", *names))
        self.channels.update(names)

    def psubscribe(self, *patterns) -> None:
        """Subscribe to glob patterns (a list first, as redis-py takes)."""
        patterns = M.names_given(patterns)
        if not patterns:
            raise ValueError("psubscribe() needs at least one pattern")
        names = [_name(p) for p in patterns]
        self._send(_command(b"PSUBSCRIBE", *names))
        self.patterns.update(names)

    def unsubscribe(self, *channels) -> None:
        """Unsubscribe from channels (all without arguments)."""
        names = [_name(c) for c in M.names_given(channels)] or list(self.channels)
        if names:
            self._send(_command(b"UNSUBSCRIBE", *names))
            self.channels.difference_update(names)

    def punsubscribe(self, *patterns) -> None:
        names = [_name(p) for p in M.names_given(patterns)] or list(self.patterns)
        if names:
            self._send(_command(b"PUNSUBSCRIBE", *names))
            self.patterns.difference_update(names)

    @property
    def subscribed(self) -> bool:
        return bool(self.channels or self.patterns)

    # -- receiving ---------------------------------------------------------

    def get_message(self, ignore_subscribe_messages: bool = False, timeout: float | None = 0.0) -> PubSubMessage | None:
        """The next message or notice, or None if none comes within
        ``timeout`` seconds (None: wait for ever)."""
        ignore = ignore_subscribe_messages or self.ignore_subscribe_messages
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            m = self._queued.next_message(ignore, M.message)
            if m is not None:
                return m
            if not self._read(deadline, as_dicts=True):
                return None

    def listen(self) -> Iterator[PubSubMessage]:
        """Messages for ever (until close())."""
        while not self._closed:
            m = self.get_message(timeout=None)
            if m is not None:
                yield m

    def get_batch(self, timeout: float | None = None, max_messages: int | None = None) -> list:
        """Data messages as ``(channel, data)`` tuples, all that have arrived
        (at least one, unless ``timeout`` passes first: then []).
        Confirmations and notices wait for get_message()."""
        if max_messages is not None and max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            out = self._queued.next_batch(max_messages)
            if out:
                return out
            if not self._read(deadline, as_dicts=False):
                return []

    # -- the connection ----------------------------------------------------

    def _connect(self, timeout: float | None = None) -> None:
        try:
            self._sock = self._conn.socket(timeout)
        except (redis.RedisError, OSError) as exc:
            self._sock = None
            error = translate(exc, self._conn.address, "SUBSCRIBE")
            if error is exc:
                raise
            raise error from None
        self._buf.clear()
        self._alive_at = time.monotonic()

    def _send(self, data: bytes) -> None:
        if self._closed:
            raise redis.ConnectionError("subscriber is closed")
        if self._sock is None:
            if self._down_since is not None:
                return               # reconnecting: every subscription is sent again then
            self._connect()          # the first connection: a failure raises
        try:
            self._sock.sendall(data)
        except OSError:
            self._lost(self._alive_at)   # the next read reconnects and sends every subscription

    def _read(self, deadline: float | None, as_dicts: bool) -> bool:
        """Wait for data and decode what arrived; False on timeout."""
        if self._closed:
            return False
        if self._sock is None:
            if self._down_since is not None:
                return self._reconnect(deadline, as_dicts)
            if not self.subscribed:
                return False
            self._connect()
        # First look without waiting: a connection found closed then closed
        # at some point since it was last seen open; one that closes while
        # this read waits closed now.  (Decided by what the socket says, not
        # by how long the read took: a busy machine makes any read slow.)
        waited = False
        chunk = self._recv(0.0)
        if chunk is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left == 0.0:
                self._alive_at = time.monotonic()    # still open
                return False
            waited = True
            chunk = self._recv(left)
            if chunk is None:
                self._alive_at = time.monotonic()    # still open
                return False
        if not chunk:
            self._lost(time.monotonic() if waited else self._alive_at)
            self._reconnect(deadline, as_dicts)
            return True
        self._alive_at = time.monotonic()
        buf = self._buf
        buf += chunk
        try:
            used, items, notices = resp_pubsub_decode(buf, 0, -1, as_dicts, self.decode_responses)
        except BatchError as exc:
            head = bytes(buf[:60])
            self._lost(self._alive_at)
            raise not_redis(repr(head), self._conn.address, "SUBSCRIBE", original=exc) from None
        del buf[:used]
        if as_dicts:
            self._dicts.extend(items)
        else:
            self._pairs.extend(items)
            self._notices.extend(notices)
        return True

    def _recv(self, timeout: float | None) -> bytes | None:
        """What the socket has within ``timeout`` seconds (0: at once):
        data, b"" once it is closed, None if nothing came."""
        self._sock.settimeout(timeout)
        try:
            return self._sock.recv(READ_SIZE)
        except (TimeoutError, BlockingIOError):
            return None
        except OSError:
            return b""

    def _lost(self, since: float) -> None:
        """The connection is gone; messages may be missed from ``since`` on."""
        if self._down_since is None:
            self._down_since = since
            self._delay = 0.05
            self._next_attempt = 0.0
        self._sock = None
        self._conn.disconnect()

    def _reconnect(self, deadline: float | None, as_dicts: bool) -> bool:
        """Connect again and resubscribe, with backoff, until ``deadline``
        (None: until it works or close()).  True once resubscribed: a gap
        notice then says how long this subscriber was away."""
        while not self._closed:
            now = time.monotonic()
            if now < self._next_attempt:
                if deadline is not None and self._next_attempt > deadline:
                    if deadline > now:
                        time.sleep(deadline - now)
                    return False
                time.sleep(self._next_attempt - now)
            try:
                self._conn.disconnect()
                left = None if deadline is None else max(0.05, deadline - time.monotonic())
                self._sock = self._conn.socket(left)
                self._buf.clear()
                if self.channels:
                    self._sock.sendall(_command(b"SUBSCRIBE", *self.channels))
                if self.patterns:
                    self._sock.sendall(_command(b"PSUBSCRIBE", *self.patterns))
            except (OSError, redis.RedisError) as exc:
                self._sock = None
                self.last_error = translate(exc, self._conn.address, "SUBSCRIBE")
                log.info("Redis subscriber reconnecting in %.2f s: %s", self._delay, self.last_error)
                self._next_attempt = time.monotonic() + self._delay
                self._delay = min(self._delay * 2, self._max_delay)
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                continue
            now = time.monotonic()
            self.reconnects += 1
            self._alive_at = now
            notice = M.gap(down_s=round(now - (self._down_since or now), 3))
            self._down_since = None
            (self._dicts if as_dicts else self._notices).append(notice)
            return True
        return False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
