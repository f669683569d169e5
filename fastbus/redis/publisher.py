"""Buffered writers to Redis: PUBLISH (and SPUBLISH), RPUSH and LPUSH in
pipelines, at the speed of the server rather than of the Python client.

Seed 000's ``BufferedRedis`` queued redis-py pipeline calls and flushed every
1000 messages or 200 ms from a thread.  Here ``publish()`` encodes the
command straight into a C buffer (fastbus's outbox in RESP mode: no Python
object per message), a flush thread writes each batch on one connection in a
single ``sendall`` and counts the replies with a C scanner, and failures are
retried and, if they persist, reported: never dropped silently.

    with BufferedPublisher("redis://127.0.0.1:6379") as pub:
        pub.publish("news", "hello")          # returns at once
        pub.flush()                           # everything is on the server

Delivery: in order per publisher.  When a connection breaks mid-batch, the
commands whose replies arrived are done and the rest are sent again (redis-py
``Retry`` with backoff): a command the server executed but whose reply was
lost with the connection is executed twice.  That window is one batch at
most; to Redis subscribers it shows as a duplicate, never as a gap.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from fastbus._core import Outbox, Publisher, resp_scan
from fastbus.errors import FastbusError

log = logging.getLogger("fastbus.redis")

__all__ = ["BufferedPublisher", "BufferedListProducer", "PublishError"]

_NETWORK_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError, socket.timeout)


class PublishError(FastbusError):
    """Messages that were not written.  ``failed`` holds them as
    ``(channel_or_key, payload)`` pairs (bytes), ``count`` how many, and
    ``reason`` the server's error or the network error that ended the retries."""

    def __init__(self, message: str, failed: list[tuple[bytes, bytes]], reason: str) -> None:
        super().__init__(message)
        self.failed = failed
        self.count = len(failed)
        self.reason = reason


def _pool_from(target: Any) -> tuple[redis.ConnectionPool, bool]:
    """A connection pool for a URL, Redis client or pool; True if ours to close."""
    if target is None:
        from fastbus.redis.server import resolve_url
        target = resolve_url(None)
    if isinstance(target, str):
        if not target.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"not a Redis URL: {target!r} (redis://, rediss:// or unix://)")
        return redis.ConnectionPool.from_url(target), True
    if isinstance(target, redis.ConnectionPool):
        return target, False
    if isinstance(target, redis.Redis):
        return target.connection_pool, False
    if type(target).__name__ == "RedisCluster":
        raise TypeError("Redis Cluster is not supported by BufferedPublisher yet: pass one node's URL "
                        "(PUBLISH reaches the whole cluster from any node)")
    raise TypeError(f"expected a Redis URL, redis.Redis or redis.ConnectionPool, not {type(target).__name__}")


def _parse_commands(pipeline, first: int, indexes: set[int] | None = None) -> list[tuple[bytes, bytes]]:
    """(arg1, arg2) of the 3-argument commands of a pipeline from number
    ``first`` on (only those in ``indexes``, counted from 0, if given).  The
    rare failure path only."""
    data = bytes(pipeline)
    out = []
    pos = 0
    i = 0

    def bulk(p: int) -> tuple[bytes, int]:
        e = data.index(b"\r\n", p)
        n = int(data[p + 1:e])
        return data[e + 2:e + 2 + n], e + 4 + n

    while pos < len(data):
        pos = data.index(b"\r\n", pos) + 2          # *3
        _verb, pos = bulk(pos)
        a, pos = bulk(pos)
        b, pos = bulk(pos)
        if i >= first and (indexes is None or i in indexes):
            out.append((a, b))
        i += 1
    return out


class BufferedPublisher:
    """Publish to Redis in pipelines.

    ``redis`` is a URL (``redis://``, ``rediss://``, ``unix://``), a
    ``redis.Redis`` or a ``redis.ConnectionPool``; None starts fastbus's
    embedded server (see :mod:`fastbus.redis.server`).  A batch is written
    when it holds ``max_messages`` messages or ``max_bytes`` bytes, and at
    most ``max_delay`` seconds after its oldest message.  ``sharded=True``
    uses SPUBLISH (Redis 7 sharded pub/sub).

    A batch that fails on the network is retried with ``retry`` (redis-py
    ``Retry``; by default 6 attempts with exponential backoff up to 1 s).
    Messages that still fail, or that the server refuses, are handed to
    ``on_error(error, failed)`` if given, counted in ``stats()["errors"]``,
    and the next ``publish()``, ``flush()`` or ``close()`` raises
    :class:`PublishError` with them.  Thread-safe.
    """

    _COMMAND = "PUBLISH"

    def __init__(self, redis: Any = None, *, max_messages: int = 1000, max_bytes: int = 1 << 20,
                 max_delay: float = 0.2, sharded: bool = False, retry: Retry | None = None,
                 on_error: Callable[[PublishError, list], None] | None = None,
                 socket_timeout: float = 10.0) -> None:
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        if not 0 < max_delay <= 60:
            raise ValueError("max_delay must be between 0 and 60 seconds")
        if not 0 < socket_timeout <= 3600:
            raise ValueError("socket_timeout must be between 0 and 3600 seconds")
        command = "SPUBLISH" if sharded and self._COMMAND == "PUBLISH" else self._COMMAND
        self._pool, self._own_pool = _pool_from(redis)
        self._retry = retry if retry is not None else Retry(ExponentialBackoff(cap=1.0, base=0.02), 5)
        self._on_error = on_error
        self._timeout = socket_timeout
        self._outbox = Outbox(max_messages=max_messages, max_bytes=max_bytes, max_delay=max_delay,
                              command=command)
        self._wake = threading.Event()
        self._pub = Publisher(self._outbox, self._wake.set)
        self._pub.closed_error = PublishError
        self._cond = threading.Condition()
        self._done = 0                    # messages answered (written or failed)
        self._flush_wanted = False
        self._closing = False
        self._conn = None
        self._buf = bytearray(1 << 16)
        self._stats = {"published": 0, "batches": 0, "bytes": 0, "errors": 0, "retries": 0,
                       "receivers": 0}
        self._thread = threading.Thread(target=self._run, name=f"fastbus-{command.lower()}", daemon=True)
        self._thread.start()
        self.publish = self._pub.publish          # the hot path: one C call, no Python frame

    # -- the user's side -----------------------------------------------------

    def publish(self, channel, message) -> int:  # replaced per instance by the C fast path
        """Queue a message (bytes or str); returns 1 at once.  Raises
        :class:`PublishError` for messages of earlier batches that failed
        (this call's message is then not queued)."""
        return self._pub.publish(channel, message)

    def flush(self, timeout: float | None = 30.0) -> None:
        """Block until every message queued before the call is answered by
        the server; raise :class:`PublishError` if some failed, TimeoutError
        if that takes longer than ``timeout`` seconds."""
        target = self._outbox.accepted
        with self._cond:
            self._flush_wanted = True
        self._wake.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._done < target:
                if not self._thread.is_alive():
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"flush: {target - self._done} messages not answered within {timeout} s")
                self._cond.wait(left)
        self._raise_pending()

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush, stop the flush thread and release the connection.  Raises
        :class:`PublishError` if messages failed and were not reported yet."""
        if self._closing:
            return
        try:
            self.flush(timeout)
        finally:
            self._closing = True
            self._pub.closed = True
            self._wake.set()
            self._thread.join(timeout)
            if self._conn is not None:
                self._conn.disconnect()
                self._pool.release(self._conn)
                self._conn = None
            if self._own_pool:
                self._pool.disconnect()

    def __enter__(self) -> BufferedPublisher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict:
        """Counters: ``published`` (answered OK), ``batches``, ``bytes``
        written, ``errors`` (messages that failed), ``retries``,
        ``receivers`` (sum of PUBLISH replies: subscribers reached),
        ``buffered`` (queued, not yet written)."""
        with self._cond:
            out = dict(self._stats)
        out["buffered"] = len(self._outbox)
        return out

    def _raise_pending(self) -> None:
        err, self._pub.pending_error = self._pub.pending_error, None
        if err is not None:
            raise err

    # -- the flush thread ----------------------------------------------------

    def _run(self) -> None:
        box = self._outbox
        while True:
            d = box.deadline_ns()
            timeout = 1.0 if d is None else max(0.0, (d - time.monotonic_ns()) / 1e9)
            self._wake.wait(timeout)
            self._wake.clear()
            with self._cond:
                force = self._flush_wanted or self._closing
                self._flush_wanted = False
            while (force and len(box)) or box.due():
                batch, n = box.take_counted()
                if batch is None:
                    break
                try:
                    self._write(batch, n)
                except Exception as exc:             # a bug: never lose the batch silently
                    log.exception("fastbus: publishing a batch failed unexpectedly")
                    self._fail(batch, n, 0, None, f"internal error: {exc!r}")
            if self._closing and not len(box):
                return

    def _connection(self):
        if self._conn is None:
            self._conn = self._pool.get_connection(self._outbox_command())
        self._conn.connect()
        sock = getattr(self._conn, "_sock", None)
        if sock is None:
            raise redis.ConnectionError("no socket after connect")
        sock.settimeout(self._timeout)
        return sock

    def _outbox_command(self) -> str:
        return self._COMMAND

    def _write(self, batch, n: int) -> None:
        """Write one pipeline of n commands and read its n replies,
        resending what was not answered after a network error."""
        state = {"done": 0, "errs": [], "first": None, "sum": 0}

        def attempt() -> None:
            try:
                send_and_read()
            except socket.timeout as exc:
                raise redis.TimeoutError(f"Redis did not answer within {self._timeout} s") from exc
            except OSError as exc:
                raise redis.ConnectionError(str(exc)) from exc

        def send_and_read() -> None:
            sock = self._connection()
            done = state["done"]
            view = memoryview(batch)
            offset = resp_scan(batch, 0, -1, done)[1] if done else 0
            sock.sendall(view[offset:])
            buf = self._buf
            have = 0
            while state["done"] < n:
                if have == len(buf):
                    buf.extend(bytes(len(buf)))       # one reply larger than the buffer
                    self._buf = buf
                got = sock.recv_into(memoryview(buf)[have:])
                if got == 0:
                    raise redis.ConnectionError("connection closed by the server")
                have += got
                replies, used, isum, errs, first = resp_scan(buf, 0, have, n - state["done"])
                if errs:
                    state["errs"].extend(state["done"] + i for i in errs)
                    if state["first"] is None:
                        state["first"] = first.decode("utf-8", "replace")
                state["done"] += replies
                state["sum"] += isum
                if used:
                    buf[:have - used] = buf[used:have]
                    have -= used

        def failed_attempt(error: Exception) -> None:
            with self._cond:
                self._stats["retries"] += 1
            log.warning("fastbus: writing to Redis failed (%s); retrying %d unanswered messages",
                        error, n - state["done"])
            if self._conn is not None:
                self._conn.disconnect()

        try:
            self._retry.call_with_retry(attempt, failed_attempt)
        except _NETWORK_ERRORS as exc:
            if self._conn is not None:
                self._conn.disconnect()
            self._fail(batch, n, state["done"], state["errs"], f"{type(exc).__name__}: {exc}",
                       answered_sum=state["sum"])
            return
        except ValueError as exc:          # the server sent bytes that are not RESP
            if self._conn is not None:
                self._conn.disconnect()
            self._fail(batch, n, state["done"], state["errs"], f"protocol error: {exc}",
                       answered_sum=state["sum"])
            return
        errs = state["errs"]
        with self._cond:
            self._stats["batches"] += 1
            self._stats["bytes"] += len(batch)
            self._stats["published"] += n - len(errs)
            self._stats["receivers"] += state["sum"]
            if not errs:
                self._done += n
                self._cond.notify_all()
                return
        self._report(_parse_commands(batch, 0, set(errs)), f"server error: {state['first']}", n)

    def _fail(self, batch, n: int, done: int, errs, reason: str, answered_sum: int = 0) -> None:
        """The commands from number ``done`` on were not answered; those in
        ``errs`` were refused."""
        failed = _parse_commands(batch, 0, set(errs or ()) | set(range(done, n)))
        with self._cond:
            self._stats["published"] += done - len(errs or ())
            self._stats["receivers"] += answered_sum
        self._report(failed, reason, n)

    def _report(self, failed: list, reason: str, n: int) -> None:
        err = PublishError(f"{len(failed)} messages were not written: {reason}", failed, reason)
        with self._cond:
            self._stats["errors"] += len(failed)
            # The next publish()/flush()/close() raises one error holding
            # every failure not raised yet.  If publish() raises the older
            # one meanwhile, its messages are reported twice, never lost.
            older = self._pub.pending_error
            if older is not None:
                every = older.failed + failed
                err_next = PublishError(f"{len(every)} messages were not written: {older.reason}", every,
                                        older.reason)
            else:
                err_next = err
            self._pub.pending_error = err_next
            self._done += n
            self._cond.notify_all()
        log.error("fastbus: %d messages were not written: %s", len(failed), reason)
        if self._on_error is not None:
            try:
                self._on_error(err, failed)
            except Exception:
                log.exception("fastbus: on_error callback failed")


class BufferedListProducer(BufferedPublisher):
    """Push to Redis lists in pipelines: ``push(key, value)`` queues an
    RPUSH (``left=True``: LPUSH) and returns at once; the same flushing,
    retries, errors and counters as :class:`BufferedPublisher`."""

    def __init__(self, redis: Any = None, *, left: bool = False, **kwargs) -> None:
        self._COMMAND = "LPUSH" if left else "RPUSH"
        super().__init__(redis, **kwargs)
        self.push = self._pub.publish

    def push(self, key, value) -> int:  # replaced per instance by the C fast path
        """Queue one value for the list ``key``; returns 1 at once."""
        return self._pub.publish(key, value)
