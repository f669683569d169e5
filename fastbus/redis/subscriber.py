"""A Redis pub/sub subscriber that decodes many messages per call.

redis-py's ``PubSub.get_message()`` parses one reply per call and builds its
dict in Python.  ``Subscriber`` reads whatever the socket holds and decodes
all complete messages in one C call, into redis-py-shaped dicts
(``get_message``/``listen``) or into ``(channel, data)`` tuples
(``get_batch``).  After a server restart or a broken connection it
reconnects with backoff, subscribes again to everything, and tells the
caller with a ``gap`` notice: Redis keeps nothing for absent subscribers, so
what was published meanwhile is lost, and the notice says when.

    with Subscriber(url) as sub:
        sub.subscribe("news")
        sub.psubscribe("market.*")
        for msg in sub.listen():
            ...
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Self

import redis

from fastbus._core import resp_pubsub_decode
from fastbus.redis.publisher import _Link

log = logging.getLogger("fastbus.redis")

__all__ = ["Subscriber"]

_CONFIRMS = ("subscribe", "psubscribe", "unsubscribe", "punsubscribe")
READ_SIZE = 1 << 18


def _command(*args) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(parts)


def _name(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"channels and patterns are bytes or str, not {type(value).__name__}")


class Subscriber:
    """Subscribe to Redis channels (``subscribe``) and glob patterns
    (``psubscribe``, Redis's own matching).  ``redis`` is a URL, a
    ``redis.Redis`` or a pool; None uses fastbus's embedded server.

    Messages are dicts as redis-py's: ``type`` (``subscribe``, ``message``,
    ``pmessage``, ...), ``pattern``, ``channel``, ``data``; plus ``gap``
    notices after a reconnect (``data``: ``{"down_s": seconds without a
    connection}``; messages published meanwhile were not received).
    ``decode_responses=True`` gives str.  Not thread-safe: one reader."""

    def __init__(self, redis: Any = None, *, decode_responses: bool = False,
                 ignore_subscribe_messages: bool = False, reconnect_max_delay: float = 2.0) -> None:
        if not 0 < reconnect_max_delay <= 60:
            raise ValueError("reconnect_max_delay must be between 0 and 60 seconds")
        self._link = _Link(redis, "SUBSCRIBE")
        self.decode_responses = decode_responses
        self.ignore_subscribe_messages = ignore_subscribe_messages
        self._max_delay = reconnect_max_delay
        self.channels: set[bytes] = set()
        self.patterns: set[bytes] = set()
        self._sock = None
        self._buf = bytearray()
        self._dicts: deque = deque()       # get_message(): everything, in order
        self._pairs: deque = deque()       # get_batch(): data messages
        self._notices: deque = deque()     # get_batch(): the others, for get_message()
        self._closed = False
        self.reconnects = 0

    # -- subscriptions -----------------------------------------------------

    def subscribe(self, *channels) -> None:
        if not channels:
            raise ValueError("subscribe() needs at least one channel")
        names = [_name(c) for c in channels]
        self._send(_command(b"SUBSCRIBE", *names))
        self.channels.update(names)

    def psubscribe(self, *patterns) -> None:
        if not patterns:
            raise ValueError("psubscribe() needs at least one pattern")
        names = [_name(p) for p in patterns]
        self._send(_command(b"PSUBSCRIBE", *names))
        self.patterns.update(names)

    def unsubscribe(self, *channels) -> None:
        """Unsubscribe from channels (all without arguments)."""
        names = [_name(c) for c in channels] or list(self.channels)
        if names:
            self._send(_command(b"UNSUBSCRIBE", *names))
            self.channels.difference_update(names)

    def punsubscribe(self, *patterns) -> None:
        names = [_name(p) for p in patterns] or list(self.patterns)
        if names:
            self._send(_command(b"PUNSUBSCRIBE", *names))
            self.patterns.difference_update(names)

    @property
    def subscribed(self) -> bool:
        return bool(self.channels or self.patterns)

    # -- receiving ---------------------------------------------------------

    def get_message(self, ignore_subscribe_messages: bool = False, timeout: float | None = 0.0) -> dict | None:
        """The next message or notice, or None if none comes within
        ``timeout`` seconds (None: wait for ever)."""
        ignore = ignore_subscribe_messages or self.ignore_subscribe_messages
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while self._notices or self._pairs:      # left by get_batch(): notices first
                if self._notices:
                    m = self._notices.popleft()
                else:
                    c, d = self._pairs.popleft()
                    m = {"type": "message", "pattern": None, "channel": c, "data": d}
                if not (ignore and m["type"] in _CONFIRMS):
                    return m
            while self._dicts:
                m = self._dicts.popleft()
                if not (ignore and m["type"] in _CONFIRMS):
                    return m
            if not self._read(deadline, as_dicts=True):
                return None

    def listen(self) -> Iterator[dict]:
        """Messages for ever (until close())."""
        while not self._closed:
            m = self.get_message(timeout=None)
            if m is not None:
                yield m

    def get_batch(self, timeout: float | None = None, max_messages: int | None = None) -> list:
        """Data messages as ``(channel, data)`` tuples, all that have arrived
        (at least one, unless ``timeout`` passes first: then []).
        Confirmations and notices wait for get_message()."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._dicts:
            for m in self._dicts:
                (self._pairs.append((m["channel"], m["data"])) if m["type"] in ("message", "pmessage")
                 else self._notices.append(m))
            self._dicts.clear()
        while not self._pairs:
            if not self._read(deadline, as_dicts=False):
                return []
        if max_messages is None or max_messages >= len(self._pairs):
            out = list(self._pairs)
            self._pairs.clear()
            return out
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        return [self._pairs.popleft() for _ in range(max_messages)]

    # -- the connection ----------------------------------------------------

    def _connect(self) -> None:
        self._sock = self._link.socket()
        self._buf.clear()

    def _send(self, data: bytes) -> None:
        if self._closed:
            raise redis.ConnectionError("subscriber is closed")
        if self._sock is None:
            self._connect()
        try:
            self._sock.sendall(data)
        except OSError:
            self._reconnect()        # resends every subscription, this one included

    def _read(self, deadline: float | None, as_dicts: bool) -> bool:
        """Wait for data and decode what arrived; False on timeout."""
        if self._closed:
            return False
        if self._sock is None:
            if not self.subscribed:
                return False
            self._connect()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self._sock.settimeout(left)
        try:
            chunk = self._sock.recv(READ_SIZE)
        except TimeoutError:
            return False
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._reconnect()
            return True
        buf = self._buf
        buf += chunk
        used, items, notices = resp_pubsub_decode(buf, 0, -1, as_dicts, self.decode_responses)
        del buf[:used]
        if as_dicts:
            self._dicts.extend(items)
        else:
            self._pairs.extend(items)
            self._notices.extend(notices)
        return True

    def _reconnect(self) -> None:
        """Connect again (with backoff) and resubscribe; a gap notice says
        how long this subscriber was away."""
        down_since = time.monotonic()
        delay = 0.05
        while not self._closed:
            try:
                self._link.disconnect()
                self._connect()
                if self.channels:
                    self._sock.sendall(_command(b"SUBSCRIBE", *self.channels))
                if self.patterns:
                    self._sock.sendall(_command(b"PSUBSCRIBE", *self.patterns))
                break
            except (OSError, redis.ConnectionError, redis.TimeoutError) as exc:
                log.info("fastbus: Redis subscriber reconnecting in %.2f s: %s", delay, exc)
                time.sleep(delay)
                delay = min(delay * 2, self._max_delay)
        self.reconnects += 1
        notice = {"type": "gap", "pattern": None, "channel": None,
                  "data": {"down_s": round(time.monotonic() - down_since, 3)}}
        self._dicts.append(notice)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._link.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
