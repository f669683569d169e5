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

import asyncio
import functools
import logging
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Self

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from fastbus._core import Outbox, Publisher, RespPump, key_slot, resp_scan
from fastbus.errors import FastbusError, PublishTimeout

log = logging.getLogger("fastbus.redis")

__all__ = ["AsyncBufferedListProducer", "AsyncBufferedPublisher", "BufferedListProducer", "BufferedPublisher",
           "PublishError", "PublishTimeout"]

WINDOW_BYTES = 4 << 20       # written and not yet answered, at most (with a backlog)
COALESCE_BYTES = 2 << 20   # with a backlog, batches are joined into writes of about this size
_NETWORK_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)


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
    if _is_cluster(target):
        # Plain PUBLISH: any node reaches the whole cluster.
        return target.get_default_node().redis_connection.connection_pool, False
    raise TypeError(f"expected a Redis URL, redis.Redis or redis.ConnectionPool, not {type(target).__name__}")


class _Link:
    """One connection taken from a pool for the life of a publisher or
    subscriber, used through its raw socket (fastbus does its own pipelining
    and parsing); redis-py still connects it (AUTH, SELECT, TLS)."""

    def __init__(self, target: Any, command: str) -> None:
        self.pool, self._own_pool = _pool_from(target)
        self._command = command
        self._conn = None

    def socket(self):
        """The connected socket (connecting first if needed)."""
        if self._conn is None:
            try:
                self._conn = self.pool.get_connection()          # redis-py >= 5.3
            except TypeError:
                self._conn = self.pool.get_connection(self._command)
        self._conn.connect()
        sock = getattr(self._conn, "_sock", None)
        if sock is None:
            raise redis.ConnectionError("no socket after connect")
        return sock

    def disconnect(self) -> None:
        if self._conn is not None:
            self._conn.disconnect()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.disconnect()
            self.pool.release(self._conn)
            self._conn = None
        if self._own_pool:
            self.pool.disconnect()


def _is_cluster(target: Any) -> bool:
    try:
        from redis.cluster import RedisCluster
    except ImportError:                 # pragma: no cover - redis-py always has it
        return False
    return isinstance(target, RedisCluster)


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


class _Batch:
    """A pipeline written to the server and the replies read for it so far."""

    __slots__ = ("data", "done", "errs", "first", "n", "receivers")

    def __init__(self, data, n: int) -> None:
        self.data = data            # a Batch (buffer) of n commands
        self.n = n
        self.done = 0               # replies read
        self.errs: list[int] = []   # indexes of error replies
        self.first: str | None = None
        self.receivers = 0


class BufferedPublisher:
    """Publish to Redis in pipelines.

    ``redis`` is a URL (``redis://``, ``rediss://``, ``unix://``), a
    ``redis.Redis`` or a ``redis.ConnectionPool``; None starts fastbus's
    embedded server (see :mod:`fastbus.redis.server`).  A batch is written
    when it holds ``max_messages`` messages or ``max_bytes`` bytes, and at
    most ``max_delay`` seconds after its oldest message.  ``sharded=True``
    uses SPUBLISH (Redis 7 sharded pub/sub).

    At most ``max_buffer_bytes`` wait to be written (say while the server is
    unreachable and batches are retried); then ``publish()`` blocks until
    there is room, at most ``block_timeout`` seconds (None: no limit), and
    raises :class:`PublishTimeout` without queuing the message.

    A batch that fails on the network is retried with ``retry`` (redis-py
    ``Retry``; by default 6 attempts with exponential backoff up to 1 s).
    Messages that still fail, or that the server refuses, are handed to
    ``on_error(error, failed)`` if given, counted in ``stats()["errors"]``,
    and the next ``publish()``, ``flush()`` or ``close()`` raises
    :class:`PublishError` with them.  Thread-safe.
    """

    _COMMAND = "PUBLISH"

    def __new__(cls, redis: Any = None, *args, sharded: bool = False, **kwargs):
        if _is_cluster(redis) and (sharded or cls._COMMAND != "PUBLISH"):
            # Commands that must reach a key's owner: one publisher per
            # primary, chosen by hash slot.
            return _ClusterRouter(redis, cls, sharded=sharded, **kwargs)
        return super().__new__(cls)

    def __init__(self, redis: Any = None, *, max_messages: int = 1000, max_bytes: int = 1 << 20,
                 max_delay: float = 0.2, sharded: bool = False, retry: Retry | None = None,
                 on_error: Callable[[PublishError, list], None] | None = None,
                 socket_timeout: float = 10.0, max_buffer_bytes: int = 64 * 1024 * 1024,
                 block_timeout: float | None = 60.0) -> None:
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        if not 0 < max_delay <= 60:
            raise ValueError("max_delay must be between 0 and 60 seconds")
        if not 0 < socket_timeout <= 3600:
            raise ValueError("socket_timeout must be between 0 and 3600 seconds")
        if max_buffer_bytes < max_bytes:
            raise ValueError("max_buffer_bytes must be at least max_bytes")
        if block_timeout is not None and block_timeout < 0:
            raise ValueError("block_timeout must be >= 0 seconds, or None to wait for ever")
        if on_error is not None and not callable(on_error):
            raise TypeError("on_error must be callable: on_error(error, failed_messages)")
        command = "SPUBLISH" if sharded and self._COMMAND == "PUBLISH" else self._COMMAND
        self._link = _Link(redis, command)
        self._retry = retry if retry is not None else Retry(ExponentialBackoff(cap=1.0, base=0.02), 5)
        self._on_error = on_error
        self._timeout = socket_timeout
        self._outbox = Outbox(max_messages=max_messages, max_bytes=max_bytes, max_delay=max_delay,
                              command=command)
        self._wake = threading.Event()
        self._pub = Publisher(self._outbox, self._wake.set)
        self._pub.closed_error = lambda message: PublishError(message, [], "closed")
        self._pub.closed_message = "publisher is closed"
        self._pub.max_buffer_bytes = max_buffer_bytes
        self._pub.block_timeout = block_timeout
        self._pub.block_reason = lambda: "Redis is not taking them (is the server reachable?)"
        self._cond = threading.Condition()
        self._done = 0                    # messages answered (written or failed)
        self._flush_wanted = False
        self._closing = False
        self._buf = bytearray(1 << 16)
        self._rp = RespPump()
        self._redirect: Callable[[list], None] | None = None     # set by the cluster router
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
            self._link.close()

    def __enter__(self) -> Self:
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
        out["buffered"] = self._pub.queued
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
            inflight: deque[_Batch] = deque()
            try:
                self._retry.call_with_retry(functools.partial(self._pump, inflight, force),
                                            self._network_failed)
            except _NETWORK_ERRORS as exc:
                self._give_up(inflight, f"{type(exc).__name__}: {exc}")
            except ValueError as exc:                # the server sent bytes that are not RESP
                self._give_up(inflight, f"protocol error: {exc}")
            except Exception as exc:                 # a bug: never lose a batch silently
                log.exception("fastbus: publishing failed unexpectedly")
                self._give_up(inflight, f"internal error: {exc!r}")
            if self._closing and not self._pub.queued:
                return

    def _connection(self):
        sock = self._link.socket()
        sock.settimeout(self._timeout)
        return sock

    def _pump(self, inflight: deque, force: bool) -> None:
        """Write batches and read their replies until nothing is due: up to
        WINDOW_BYTES of batches are in flight, so the server always has the
        next one while this thread reads replies.  After a network error
        (call_with_retry calls this again) the commands not answered yet are
        written again first, in order."""
        try:
            self._pump_once(inflight, force)
        except TimeoutError as exc:
            raise redis.TimeoutError(f"Redis did not answer within {self._timeout} s") from exc
        except OSError as exc:
            raise redis.ConnectionError(str(exc)) from exc

    def _pump_once(self, inflight: deque, force: bool) -> None:
        sock = self._connection()
        if isinstance(sock, ssl.SSLSocket) or not hasattr(socket, "AF_UNIX"):
            self._pump_python(sock, inflight, force)
        else:
            self._pump_c(sock, inflight, force)

    def _take_window(self, force: bool):
        """The next batch, or with a backlog several joined (a write the
        size of COALESCE_BYTES costs this thread far less than many small
        ones); (None, 0) when nothing is due."""
        item = self._pub.take(force)
        if item is None:
            return None, 0
        data, n = item
        if self._pub.has_sealed():
            parts = [data]
            size = len(data)
            while size < COALESCE_BYTES and self._pub.has_sealed() and \
                    (more := self._pub.take(force)) is not None:
                parts.append(more[0])
                size += len(more[0])
                n += more[1]
            if len(parts) > 1:
                data = b"".join(parts)
        return data, n

    def _pump_c(self, sock, inflight: deque, force: bool) -> None:
        """The pipeline in C with the GIL released (RespPump): one call per
        window writes it while reading the replies of the one before, so
        the server has the next window while this thread waits for the GIL
        (a publishing thread holds it up to the switch interval, 5 ms)."""
        pump = self._rp.pump
        fd = sock.fileno()
        if inflight:                                 # a retry: resend what is unanswered
            self._rp.reset()
            for b in inflight:
                offset = resp_scan(b.data, 0, -1, b.done)[1] if b.done else 0
                self._account(inflight, *pump(fd, memoryview(b.data)[offset:], 0, self._timeout))
        while True:
            data, n = self._take_window(force)
            outstanding = sum(b.n - b.done for b in inflight)
            if data is None:
                if not inflight:
                    return
            else:
                inflight.append(_Batch(data, n))
            self._account(inflight, *pump(fd, data, outstanding, self._timeout))

    def _account(self, inflight: deque, replies: int, isum: int, errs: list, first, error) -> None:
        """Give the replies a pump read to the batches in flight, oldest first."""
        k = 0
        while replies and inflight:
            b = inflight[0]
            take = min(replies, b.n - b.done)
            while k < len(errs) and errs[k] < take:
                b.errs.append(b.done + errs[k])
                k += 1
            errs = [e - take for e in errs[k:]]
            k = 0
            if b.errs and b.first is None:
                b.first = (first or b"?").decode("utf-8", "replace")
            b.done += take
            b.receivers += isum
            isum = 0
            replies -= take
            if b.done == b.n:
                inflight.popleft()
                self._finished(b)
        if error is not None:
            raise error

    def _pump_python(self, sock, inflight: deque, force: bool) -> None:
        """The same with Python socket calls (TLS)."""
        for b in inflight:                           # a retry: resend what is unanswered
            offset = resp_scan(b.data, 0, -1, b.done)[1] if b.done else 0
            sock.sendall(memoryview(b.data)[offset:])
        flying = sum(len(b.data) for b in inflight)
        buf = self._buf
        have = 0
        while True:
            while flying < WINDOW_BYTES:
                data, n = self._take_window(force)
                if data is None:
                    break
                b = _Batch(data, n)
                inflight.append(b)
                flying += len(b.data)
                sock.sendall(b.data)
            if not inflight:
                return
            if have == len(buf):
                buf.extend(bytes(len(buf)))          # one reply larger than the buffer
                self._buf = buf
            got = sock.recv_into(memoryview(buf)[have:])
            if got == 0:
                raise redis.ConnectionError("connection closed by the server")
            have += got
            start = 0
            while inflight and start < have:
                b = inflight[0]
                replies, used, isum, errs, first = resp_scan(buf, start, have, b.n - b.done)
                if errs:
                    b.errs.extend(b.done + i for i in errs)
                    if b.first is None:
                        b.first = first.decode("utf-8", "replace")
                b.done += replies
                b.receivers += isum
                start += used
                if b.done < b.n:
                    break                            # the rest of its replies is still coming
                inflight.popleft()
                flying -= len(b.data)
                self._finished(b)
            if start:
                buf[:have - start] = buf[start:have]
                have -= start

    def _network_failed(self, error: Exception) -> None:
        with self._cond:
            self._stats["retries"] += 1
        log.warning("fastbus: writing to Redis failed (%s); retrying", error)
        self._link.disconnect()

    def _finished(self, b: _Batch) -> None:
        """Every reply of a batch is in."""
        with self._cond:
            self._stats["batches"] += 1
            self._stats["bytes"] += len(b.data)
            self._stats["published"] += b.n - len(b.errs)
            self._stats["receivers"] += b.receivers
            if not b.errs:
                self._done += b.n
                self._cond.notify_all()              # flush()
                return
        failed = _parse_commands(b.data, 0, set(b.errs))
        if self._redirect is not None and b.first and b.first.startswith(("MOVED ", "ASK ")):
            # Redis Cluster moved these slots: the router sends them again
            # to their new owner (an error there is reported from there).
            # Queued at the owner before this batch counts as done, so a
            # flush() that returns has seen them moved.
            self._redirect(failed)
            with self._cond:
                self._stats["redirected"] = self._stats.get("redirected", 0) + len(failed)
                self._done += b.n
                self._cond.notify_all()
            return
        self._report(failed, f"server error: {b.first}", b.n)

    def _give_up(self, inflight: deque, reason: str) -> None:
        """The retries are spent: what is in flight and unanswered failed."""
        self._link.disconnect()
        while inflight:
            b = inflight.popleft()
            self._fail(b.data, b.n, b.done, b.errs, reason, answered_sum=b.receivers)

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
        log.error("fastbus: %d messages were not written: %s", len(failed), reason)
        # The callback runs before flush() can return or raise for these.
        if self._on_error is not None:
            try:
                self._on_error(err, failed)
            except Exception:
                log.exception("fastbus: on_error callback failed")
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


class _ClusterRouter:
    """BufferedPublisher / BufferedListProducer on a Redis Cluster for
    commands that must reach the primary that owns the key's hash slot
    (SPUBLISH, RPUSH, LPUSH): one buffered publisher per primary, the slot
    computed in C.  Messages of one channel or key keep their order (one
    slot, one primary).  After a MOVED reply the slot map is read again and
    the refused messages are sent to the new owner (their order relative to
    later messages of the same key is then not guaranteed)."""

    def __init__(self, cluster, kind: type, **kwargs) -> None:
        self._rc = cluster
        self._kind = kind
        self._kwargs = kwargs
        self._subs: dict[str, BufferedPublisher] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._table: list[str] = []
        self._refresh(initial=True)

    def _refresh(self, initial: bool = False) -> None:
        nm = self._rc.nodes_manager
        if not initial:
            nm.initialize()
        table = [""] * 16384
        for slot, nodes in nm.slots_cache.items():
            if nodes:
                table[slot] = nodes[0].name
        if "" in table:
            raise redis.ClusterDownError("the cluster does not cover every hash slot")
        self._table = table

    def _sub(self, name: str) -> BufferedPublisher:
        sub = self._subs.get(name)
        if sub is None:
            with self._lock:
                sub = self._subs.get(name)
                if sub is None:
                    node = self._rc.get_node(node_name=name)
                    kw = dict(self._kwargs)
                    if self._kind is BufferedListProducer:
                        kw.pop("sharded", None)
                    sub = self._kind(node.redis_connection.connection_pool, **kw)
                    sub._redirect = self._redirected
                    self._subs[name] = sub
        return sub

    def publish(self, channel, message) -> int:
        """Queue a message for the primary that owns its channel's slot."""
        if self._closed:
            raise PublishError("publisher is closed", [], "closed")
        return self._sub(self._table[key_slot(channel)]).publish(channel, message)

    push = publish

    def _redirected(self, messages: list) -> None:
        try:
            self._refresh()
        except Exception:
            log.exception("fastbus: reading the cluster's slot map failed")
        for channel, message in messages:
            self._sub(self._table[key_slot(channel)]).publish(channel, message)

    def flush(self, timeout: float | None = 30.0) -> None:
        """flush() every primary's publisher; again while redirects move
        messages between them."""
        for _ in range(5):
            before = sum(s.stats().get("redirected", 0) for s in list(self._subs.values()))
            errors = []
            for sub in list(self._subs.values()):
                try:
                    sub.flush(timeout)
                except PublishError as exc:
                    errors.append(exc)
            if errors:
                every = [m for e in errors for m in e.failed]
                raise PublishError(f"{len(every)} messages were not written: {errors[0].reason}", every,
                                   errors[0].reason)
            if sum(s.stats().get("redirected", 0) for s in list(self._subs.values())) == before:
                return

    def close(self, timeout: float | None = 30.0) -> None:
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            self._closed = True
            closed: set[str] = set()
            while len(closed) < len(self._subs):     # a redirect may add one meanwhile
                for name, sub in list(self._subs.items()):
                    if name not in closed:
                        closed.add(name)
                        sub.close(timeout)

    def stats(self) -> dict:
        """The sum of the primaries' counters, and ``nodes``."""
        out: dict = {"nodes": len(self._subs)}
        for sub in list(self._subs.values()):
            for k, v in sub.stats().items():
                out[k] = out.get(k, 0) + v
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BufferedListProducer(BufferedPublisher):
    """Push to Redis lists in pipelines: ``push(key, value)`` queues an
    RPUSH (``left=True``: LPUSH) and returns at once; the same flushing,
    retries, errors and counters as :class:`BufferedPublisher`."""

    _COMMAND = "RPUSH"

    def __init__(self, redis: Any = None, *, left: bool = False, **kwargs) -> None:
        self._COMMAND = "LPUSH" if left else "RPUSH"
        super().__init__(redis, **kwargs)
        self.push = self._pub.publish

    def push(self, key, value) -> int:  # replaced per instance by the C fast path
        """Queue one value for the list ``key``; returns 1 at once."""
        return self._pub.publish(key, value)


class AsyncBufferedPublisher:
    """:class:`BufferedPublisher` for asyncio: ``publish`` queues at once
    (and awaits only when the buffer is full), ``flush``/``close`` await the
    flush thread without blocking the event loop; ``async with`` closes."""

    _SYNC = BufferedPublisher

    def __init__(self, redis: Any = None, **kwargs) -> None:
        self._sync = self._SYNC(redis, **kwargs)
        if isinstance(self._sync, _ClusterRouter):
            self._sync.close()
            raise TypeError("the asyncio publishers do not route by hash slot on Redis Cluster yet: "
                            "use BufferedPublisher / BufferedListProducer (thread-safe) there")

    async def publish(self, channel, message) -> int:
        """Queue a message; returns 1."""
        pub = self._sync._pub
        if pub.buffered_bytes >= pub.max_buffer_bytes:
            await asyncio.to_thread(pub.wait_for_room)
        return pub.publish(channel, message)

    async def flush(self, timeout: float | None = 30.0) -> None:
        """Wait until everything queued is answered (see BufferedPublisher.flush)."""
        await asyncio.to_thread(self._sync.flush, timeout)

    async def close(self, timeout: float | None = 30.0) -> None:
        await asyncio.to_thread(self._sync.close, timeout)

    def stats(self) -> dict:
        return self._sync.stats()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class AsyncBufferedListProducer(AsyncBufferedPublisher):
    """:class:`BufferedListProducer` for asyncio: ``await push(key, value)``."""

    _SYNC = BufferedListProducer

    async def push(self, key, value) -> int:
        """Queue one value for the list ``key``; returns 1."""
        return await self.publish(key, value)
