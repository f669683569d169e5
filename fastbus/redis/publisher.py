"""Buffered writers to Redis: PUBLISH (and SPUBLISH), RPUSH and LPUSH in
pipelines, at the speed of the server rather than of the Python client.

Seed 000's ``BufferedRedis`` queued redis-py pipeline calls and flushed every
1000 messages or 200 ms from a thread.  Here ``publish()`` encodes the
command straight into a C buffer (fastbus's outbox in RESP mode: no Python
object per message), a flush thread writes the pipeline on one connection
and counts the replies in C, and failures are retried and, if they persist,
reported: never dropped silently.

Batches form by themselves: when the flush thread is idle, the first message
published wakes it and it writes what is queued at once; whatever is
published while a write is in flight (and its replies awaited) forms the
next write.  At a low rate a message leaves at once; under load the writes
grow, up to a few MiB.  ``max_delay`` is an optional linger (default None:
none) that holds a batch until it is full or that old.

    with BufferedPublisher("redis://127.0.0.1:6379") as pub:
        pub.publish("news", "hello")          # returns at once; on the server a moment later
        pub.flush()                           # everything is answered by the server

Delivery: in order per publisher.  When a connection breaks mid-batch, the
commands whose replies arrived are done and the rest are sent again (redis-py
``Retry`` with backoff): a command the server executed but whose reply was
lost with the connection is executed twice.  That window is one batch at
most; to Redis subscribers it shows as a duplicate, never as a gap.

Accounting: every message ``publish()`` accepted ends either answered by
the server (``stats()["published"]``) or reported failed (``on_error`` and
:class:`PublishError`), also when the server is unreachable from the start,
dies mid-stream, or ``close(timeout)`` runs out first.

On a Redis Cluster, commands that must reach a key's owner go through
``fastbus.redis.publisher_cluster``; the asyncio twins are in
``fastbus.redis.publisher_aio``.  (This file is over 700 lines because its
one class's flush thread, which writes, counts replies, retries and
reports, is one state machine: split, its parts would share every field.)
"""

from __future__ import annotations

import functools
import logging
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Self

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from fastbus._core import Outbox, RespPump, resp_scan
from fastbus._publisher import Publisher
from fastbus._types import ChannelT, EncodableT
from fastbus.errors import FastbusError, FlushTimeout, PublishError, PublishTimeout
from fastbus.redis.connection import Connection, is_asyncio, is_cluster
from fastbus.redis.errors import DEFAULT_MAX_BULK_LEN, not_redis, too_large, translate

log = logging.getLogger("fastbus.redis")

__all__ = ["BufferedListProducer", "BufferedPublisher", "PublishError", "PublishTimeout"]


def __getattr__(name: str) -> Any:
    # The asyncio twins live in fastbus.redis.publisher_aio (which imports
    # this module); their old import path here keeps working.
    if name in ("AsyncBufferedPublisher", "AsyncBufferedListProducer"):
        from fastbus.redis import publisher_aio
        return getattr(publisher_aio, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

WINDOW_BYTES = 4 << 20       # written and not yet answered, at most (with a backlog)
COALESCE_BYTES = 2 << 20   # with a backlog, batches are joined into writes of about this size
CLOSE_GRACE = 2.0          # close(timeout): at most this (and a tenth of the timeout) is kept to stop and report
_NETWORK_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)


def merged_errors(first: PublishError | None, second: PublishError | None) -> PublishError | None:
    """One PublishError holding the messages of both (either may be None)."""
    if first is None or second is None:
        return first or second
    every = first.failed + second.failed
    return PublishError(f"{len(every)} messages were not written: {first.reason}", every, first.reason,
                        first.error)


def deadline_after(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def stop_part(timeout: float | None) -> float:
    """Of close(timeout), the seconds kept to stop the flush thread and
    report what is left: a tenth, at most CLOSE_GRACE."""
    return 0.0 if timeout is None else min(CLOSE_GRACE, max(0.0, timeout) / 10)


def flush_part(timeout: float | None) -> float | None:
    """Of close(timeout), the seconds the flush may take."""
    return None if timeout is None else max(0.0, timeout - stop_part(timeout))


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


def check_options(max_messages: int = 1000, max_bytes: int = 1 << 20, max_delay: float | None = None,
                   socket_timeout: float = 10.0, max_buffer_bytes: int = 64 * 1024 * 1024,
                   block_timeout: float | None = 60.0, on_error: Any = None, **_other) -> None:
    """Raise ValueError/TypeError for a bad option of BufferedPublisher (the
    cluster router checks them too, before it makes any publisher)."""
    if max_messages < 1:
        raise ValueError(f"max_messages must be at least 1, not {max_messages!r}")
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be at least 1, not {max_bytes!r}")
    if max_delay is not None:
        if isinstance(max_delay, bool) or not isinstance(max_delay, (int, float)):
            raise TypeError(f"max_delay must be None (no linger) or seconds (a number), "
                            f"not {type(max_delay).__name__} {max_delay!r}")
        if not 0 < max_delay <= 60:
            raise ValueError(f"max_delay must be None (no linger: a message leaves as soon as the "
                             f"writer is idle) or a linger of 0 < seconds <= 60, not {max_delay!r}")
    if not 0 < socket_timeout <= 3600:
        raise ValueError(f"socket_timeout must be between 0 and 3600 seconds, not {socket_timeout!r}")
    if max_buffer_bytes < max_bytes:
        raise ValueError(f"max_buffer_bytes must be at least max_bytes ({max_bytes}), not {max_buffer_bytes!r}")
    if block_timeout is not None and block_timeout < 0:
        raise ValueError(f"block_timeout must be >= 0 seconds, or None to wait for ever, not {block_timeout!r}")
    if on_error is not None and not callable(on_error):
        raise TypeError("on_error must be callable: on_error(error, failed_messages)")


class _InFlight:
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
    embedded server (see :mod:`fastbus.redis.server`).  ``sharded=True``
    uses SPUBLISH (Redis 7 sharded pub/sub).

    Batches form by themselves: ``publish()`` returns at once, and when the
    flush thread is idle the message is written at once (a message
    published at a low rate reaches the server within a fraction of a
    millisecond).  What is published while a write is in flight and its
    replies are awaited forms the next write, so under load the pipelines
    grow by themselves (batches of ``max_messages`` messages or
    ``max_bytes`` bytes, several joined into one write).

    ``max_delay`` is an optional linger, default None (none).  Set to
    seconds (0 < max_delay <= 60), a batch waits until it holds
    ``max_messages`` messages or ``max_bytes`` bytes, or its oldest message
    is ``max_delay`` old, whichever comes first (fewer, larger writes at a
    low rate, each message up to ``max_delay`` later).  ``flush()`` and
    ``close()`` write at once either way.

    At most ``max_buffer_bytes`` wait to be written (say while the server is
    unreachable and batches are retried); then ``publish()`` blocks until
    there is room, at most ``block_timeout`` seconds (None: no limit), and
    raises :class:`PublishTimeout` without queuing the message.

    A batch that fails on the network is retried with ``retry`` (redis-py
    ``Retry``; by default 6 attempts with exponential backoff up to 1 s).
    When the retries are spent (the server unreachable all that time), the
    batch in flight and every message still waiting fail.  Messages that
    fail, that the server refuses, or that are longer than the server's
    ``proto-max-bulk-len`` are handed to ``on_error(error, failed)`` if
    given, counted in ``stats()["errors"]``, and the next ``publish()``,
    ``flush()`` or ``close()`` raises :class:`PublishError` with them (its
    ``reason`` says what failed, against which ``host:port``).

    ``close(timeout)`` returns or raises within about ``timeout``: what is
    not answered by then is reported failed the same way.  So every message
    ``publish()`` accepted ends answered or reported.  Thread-safe.
    """

    _COMMAND = "PUBLISH"
    #: The asyncio twin (fastbus.redis.publisher_aio) sets it: its publish()
    #: is a coroutine, so the per-instance C fast path is not installed.
    driven_by_loop = False

    def __new__(cls, redis: Any = None, *args: Any, sharded: bool = False, **kwargs: Any) -> Any:
        if is_cluster(redis) and not is_asyncio(redis) and (sharded or cls._COMMAND != "PUBLISH"):
            # Commands that must reach a key's owner: one publisher per
            # primary, chosen by hash slot.
            from fastbus.redis.publisher_cluster import ClusterRouter
            return ClusterRouter(redis, cls, sharded=sharded, **kwargs)
        return super().__new__(cls)

    def __init__(self, redis: Any = None, *, max_messages: int = 1000, max_bytes: int = 1 << 20,
                 max_delay: float | None = None, sharded: bool = False, retry: Retry | None = None,
                 on_error: Callable[[PublishError, list], None] | None = None,
                 socket_timeout: float = 10.0, max_buffer_bytes: int = 64 * 1024 * 1024,
                 block_timeout: float | None = 60.0) -> None:
        check_options(max_messages, max_bytes, max_delay, socket_timeout, max_buffer_bytes, block_timeout,
                       on_error)
        command = "SPUBLISH" if sharded and self._COMMAND == "PUBLISH" else self._COMMAND
        self._command = command
        self._conn = Connection(redis, command)
        self._retry = retry if retry is not None else Retry(ExponentialBackoff(cap=1.0, base=0.02), 5)
        self._abort = threading.Event()           # close() ran out of time: fail what is left
        self._abort_reason = ""
        self._last_error: BaseException | None = None
        self._on_error = on_error
        self._timeout = socket_timeout
        self._linger = max_delay                  # None: write as soon as the thread is idle
        self._outbox = Outbox(max_messages=max_messages, max_bytes=max_bytes, max_delay=max_delay,
                              command=command)
        self._wake = threading.Event()
        self._pub = Publisher(self._outbox, self._wake.set, max_buffer_bytes=max_buffer_bytes,
                              block_timeout=block_timeout,
                              block_reason=lambda: "Redis is not taking them (is the server reachable?)",
                              closed_error=lambda message: PublishError(message, [], "closed"),
                              closed_message="publisher is closed")
        self._cond = threading.Condition()
        self._done = 0                    # messages answered (written or failed)
        self._flush_wanted = False
        self._closing = False
        self._close_deadline: float | None = None  # connection attempts end by then (close())
        self._buf = bytearray(1 << 16)
        self._rp = RespPump()
        self._redirect: Callable[[list], None] | None = None     # set by the cluster router
        self._stats = {"published": 0, "batches": 0, "bytes": 0, "errors": 0, "retries": 0,
                       "receivers": 0}
        #: Called in the flush thread whenever a waiter may go on (messages
        #: answered or failed, room freed, the thread ending): how the
        #: asyncio twin's event loop hears of it.  Threads wait on _cond.
        self.on_progress: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name=f"fastbus-{command.lower()}", daemon=True)
        self._thread.start()
        if not self.driven_by_loop:
            self.publish = self._pub.publish      # the hot path: one C call, no Python frame

    # -- the user's side -----------------------------------------------------

    def publish(self, channel: ChannelT, message: EncodableT) -> int:  # replaced per instance by the C fast path
        """Queue a message (bytes or str); returns 1 at once.  Raises
        :class:`PublishError` for messages of earlier batches that failed
        (this call's message is then not queued)."""
        return self._pub.publish(channel, message)

    def has_room(self) -> bool:
        """Would publish() queue without waiting for room (fewer than
        ``max_buffer_bytes`` wait to be written)?"""
        return self._pub.has_room()

    def wait_for_room(self) -> None:
        """Block until publish() can queue without waiting: at most
        ``block_timeout`` seconds, then :class:`PublishTimeout`;
        :class:`PublishError` if the publisher closes meanwhile."""
        self._pub.wait_for_room()

    def room_check(self, deadline: float | None) -> bool:
        """wait_for_room() as one step, for a driver that waits its own way
        (the asyncio twin, woken by ``on_progress``): True if there is
        room; False if not yet (the flush thread is woken); the same
        errors, ``deadline`` being ``time.monotonic()`` + ``block_timeout``."""
        return self._pub.room_check(deadline)

    @property
    def room_deadline(self) -> float | None:
        """When a wait for room that starts now gives up (None: never)."""
        return self._pub.room_deadline

    def flush(self, timeout: float | None = 30.0) -> None:
        """Block until every message queued before the call is answered by
        the server; raise :class:`PublishError` if some failed, TimeoutError
        if that takes longer than ``timeout`` seconds."""
        target = self.start_flush()
        deadline = deadline_after(timeout)
        while not self.flush_done(target, timeout, deadline):
            with self._cond:
                if self._done < target and self._thread.is_alive():
                    self._cond.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def start_flush(self) -> int:
        """flush() in steps, for a driver that waits its own way (the
        asyncio twin): have the flush thread write what is queued now, and
        return the count ``flush_done()`` waits for."""
        target = self._pub.accepted
        with self._cond:
            self._flush_wanted = True
        self._wake.set()
        return target

    def flush_done(self, target: int, timeout: float | None, deadline: float | None) -> bool:
        """Are the messages up to ``target`` (``start_flush()``) answered?
        Raises as flush() does: PublishError for those that failed,
        FlushTimeout once ``deadline`` (time.monotonic()) has passed."""
        with self._cond:
            done = self._done >= target or not self._thread.is_alive()
            if not done and deadline is not None and time.monotonic() >= deadline:
                pending = target - self._done
                last = f" (last error: {self._last_error})" if self._last_error is not None else ""
                raise FlushTimeout(f"flush: {pending} messages not answered by Redis at "
                                   f"{self._conn.address} within {timeout} s{last}; they stay "
                                   f"queued", pending)
        if done:
            self._raise_pending()
        return done

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush, stop the flush thread and release the connection, within
        about ``timeout`` seconds (None: no limit): one deadline for every
        step.  The flush gets the time but the last tenth (at most
        CLOSE_GRACE seconds), kept to stop the thread and report what is not
        answered by then: to ``on_error``, and raised here as
        :class:`PublishError` with every failure not raised yet.  If the
        thread is still busy at the deadline (in ``on_error``, or a connection
        attempt), :class:`FlushTimeout` is raised; the thread reports the rest
        when it gets there."""
        if self._closing:
            return
        deadline = deadline_after(timeout)
        error: BaseException | None = None
        timed_out = False
        try:
            self.flush(flush_part(timeout))
        except FlushTimeout:
            timed_out = True                         # what is left fails below
        except BaseException as exc:                 # PublishError; KeyboardInterrupt: close anyway
            error = exc
        for wait in self.stop_steps(deadline, timeout, timed_out, error):
            self._thread.join(wait)

    @property
    def closing(self) -> bool:
        """Has close() started?"""
        return self._closing

    @property
    def stopped(self) -> bool:
        """Has the flush thread ended (after close())?"""
        return not self._thread.is_alive()

    def stop_steps(self, deadline: float | None, timeout: float | None, timed_out: bool,
                   error: BaseException | None) -> Iterator[float | None]:
        """close() after its flush, as the waits it needs, for a driver that
        waits its own way (close() joins the flush thread for each; the
        asyncio twin awaits ``stopped``, woken by ``on_progress``): yields
        how long to wait for the thread to end (None: for ever), then
        releases the connection and raises what close() raises.
        ``timed_out``: the flush ran out of time; ``error``: what it raised."""
        self._stop_begin(deadline, timeout, timed_out)
        yield from self._stop_end(deadline, timeout, error)

    def _stop_begin(self, deadline: float | None, timeout: float | None, abort: bool) -> None:
        """close(), first half: no more publishes; the thread writes what
        raced close() and stops, or with ``abort`` (the flush ran out of
        time) gives up at once and reports what is left."""
        self._closing = True
        self._close_deadline = deadline
        self._pub.closed = True
        self._wake.set()
        if abort:
            self._abort_now(timeout)

    def _abort_now(self, timeout: float | None) -> None:
        """Stop the retries and the write in progress; the thread reports
        what is left and stops."""
        if self._abort.is_set():
            return
        last = f"; last error: {self._last_error}" if self._last_error is not None else ""
        self._abort_reason = (f"not answered by Redis at {self._conn.address} before close(timeout="
                              f"{timeout}) ran out (those in flight may have been written){last}")
        self._abort.set()
        self._conn.interrupt()
        self._wake.set()

    def _stop_end(self, deadline: float | None, timeout: float | None,
                  error: BaseException | None) -> Iterator[float | None]:
        """close(), second half: wait for the thread until the deadline
        (aborting it if it is still writing when only the part kept for
        stopping is left), then release the connection and raise.  Each
        wait is yielded (stop_steps)."""
        if deadline is not None and not self._abort.is_set():
            yield max(0.0, deadline - stop_part(timeout) - time.monotonic())
        else:
            yield None if deadline is None else max(0.0, deadline - time.monotonic())
        if self._thread.is_alive() and deadline is not None:
            if self._pub.accepted == self._done:
                yield 0.2                            # nothing left: only its wake-up to come
            if self._thread.is_alive():
                self._abort_now(timeout)
                yield max(0.0, deadline - time.monotonic())
        if self._thread.is_alive():
            # Still in a connection attempt or in on_error: it reports the
            # rest when that returns; nothing is dropped.
            left = self._pub.accepted - self._done
            raise FlushTimeout(f"close: the flush thread of the publisher to Redis at {self._conn.address} "
                               f"did not stop within {timeout} s; its {left} unanswered messages go to "
                               f"on_error when it does", left) from error
        self._fail_queued("publisher closed")        # a publish() that raced close()
        self._conn.close()
        pending, self._pub.pending_error = self._pub.pending_error, None
        if isinstance(error, PublishError) or error is None:
            error = merged_errors(error, pending)
        if error is not None:
            raise error

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, int]:
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
        """Sleep until woken, then write until nothing is left to write.

        The C Publisher calls ``wake`` when a message starts a batch (the
        outbox was empty) and when a batch becomes due by count or size;
        ``flush()``, ``close()`` and a publisher blocked for room wake it
        too.  With no linger every wake writes what is queued, so the
        thread sleeps with no timeout: no poll on the message path.  With
        a linger it sleeps until the oldest message's deadline at most."""
        try:
            self._serve()
        finally:
            self._progressed()                       # a close() waiting for the thread's end

    def _progressed(self) -> None:
        """A waiter may go on (called in the flush thread, _cond held or not)."""
        hook = self.on_progress
        if hook is not None:
            hook()

    def _serve(self) -> None:
        box = self._outbox
        pub = self._pub
        eager = self._linger is None
        while True:
            timeout = None
            if pub.has_sealed() or (eager and pub.queued):
                timeout = 0.0          # due already (its wake was used by a pump that then failed)
            elif not eager and (d := box.deadline_ns()) is not None:
                timeout = max(0.0, (d - time.monotonic_ns()) / 1e9)
            self._wake.wait(timeout)
            self._wake.clear()
            with self._cond:
                force = eager or self._flush_wanted or self._closing
                self._flush_wanted = False
            inflight: deque[_InFlight] = deque()
            try:
                self._with_retry(functools.partial(self._pump, inflight, force))
            except (*_NETWORK_ERRORS, redis.RedisError) as exc:     # RedisError: InvalidResponse, AUTH...
                self._give_up(inflight, self._translated(exc))
            except ValueError as exc:                # the server sent bytes that are not RESP
                self._give_up(inflight, not_redis(str(exc), self._conn.address, self._command))
            except Exception as exc:                 # a bug: never lose a batch silently
                log.exception("publishing failed unexpectedly")
                self._give_up(inflight, FastbusError(f"internal error publishing to Redis at "
                                                     f"{self._conn.address}: {exc!r}"))
            if self._abort.is_set():
                self._give_up(deque(), None)         # close() ran out of time: the rest fails
                return
            if self._closing and not self._pub.queued:
                return

    def _with_retry(self, do: Callable[[], None]) -> None:
        """``do()`` with ``retry``'s attempts and backoff, as redis-py's
        ``Retry.call_with_retry``, but its sleeps end when close() gives up."""
        retry = self._retry
        backoff = getattr(retry, "_backoff", None)
        supported = getattr(retry, "_supported_errors", None)
        if backoff is None or supported is None or not hasattr(retry, "get_retries"):
            retry.call_with_retry(do, self._network_failed)   # a Retry of another kind
            return
        retries = retry.get_retries()
        backoff.reset()
        failures = 0
        while True:
            try:
                return do()
            except supported as error:
                failures += 1
                self._network_failed(error)
                if self._abort.is_set() or (retries >= 0 and failures > retries):
                    raise
                delay = backoff.compute(failures)
                if delay > 0 and self._abort.wait(delay):
                    raise

    def _translated(self, exc: BaseException) -> BaseException:
        """The fastbus error for a failure of this publisher's connection."""
        return translate(exc, self._conn.address, self._command)

    def _connection(self):
        if self._abort.is_set():
            raise redis.ConnectionError("publisher closed")
        # A new connection's attempt is bounded by socket_timeout, and
        # during close() by its deadline.
        bound = self._timeout
        if self._close_deadline is not None:
            bound = min(bound, max(0.001, self._close_deadline - time.monotonic()))
        sock = self._conn.socket(bound)
        if self._conn.max_bulk_len is None:
            self._conn.read_max_bulk_len()
        sock.settimeout(self._timeout)
        return sock

    def _checked(self, data, n: int):
        """A window without the commands whose channel/key or payload is over
        the server's proto-max-bulk-len: Redis would refuse them and close the
        connection, failing the whole window.  Those are reported; the rest
        goes.  Only a window longer than the limit can hold one."""
        limit = self._conn.max_bulk_len or DEFAULT_MAX_BULK_LEN
        if data is None or len(data) <= limit:
            return data, n
        pairs = _parse_commands(data, 0)
        big = [(a, b) for a, b in pairs if len(a) > limit or len(b) > limit]
        if not big:
            return data, n
        size = max(max(len(a), len(b)) for a, b in big)
        self._report(big, too_large(size, limit, self._conn.address, self._command), len(big))
        rest = [(a, b) for a, b in pairs if len(a) <= limit and len(b) <= limit]
        if not rest:
            return None, 0
        verb = self._command.encode()
        head = b"*3\r\n$%d\r\n%s\r\n" % (len(verb), verb)
        return b"".join(head + b"$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(a), a, len(b), b)
                        for a, b in rest), len(rest)

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
        ones): full (sealed) batches oldest first, then with ``force`` the
        batch being filled.  (None, 0) when nothing is due."""
        pub = self._pub
        item = pub.take(force)
        if item is None:
            return None, 0
        if self.on_progress is not None and pub.max_buffer_bytes:
            self._progressed()                       # room freed: a twin's publish may wait for it
        data, n = item
        if pub.has_sealed() or (force and pub.queued):
            parts = [data]
            size = len(data)
            while size < COALESCE_BYTES and (pub.has_sealed() or (force and pub.queued)) and \
                    (more := pub.take(force)) is not None:
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
        (a publishing thread holds it up to the switch interval, 5 ms).
        What is published during a call forms the next window; the loop
        ends when nothing is due and every reply is in."""
        fd = sock.fileno()
        if inflight:                                 # a retry: resend what is unanswered
            self._rp.reset()
            for b in inflight:
                offset = resp_scan(b.data, 0, -1, b.done)[1] if b.done else 0
                self._pump_call(inflight, fd, memoryview(b.data)[offset:], 0)
        while True:
            data, n = self._checked(*self._take_window(force))
            outstanding = sum(b.n - b.done for b in inflight)
            if data is None:
                if not inflight:
                    return
            else:
                inflight.append(_InFlight(data, n))
            self._pump_call(inflight, fd, data, outstanding)

    def _pump_call(self, inflight: deque, fd: int, data, need: int) -> None:
        """One RespPump call; the replies it read count even when it raises."""
        try:
            self._rp.pump(fd, data, need, self._timeout)
        finally:
            self._account(inflight, *self._rp.last)

    def _account(self, inflight: deque, replies: int, isum: int, errs: list, first) -> None:
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
                # A batch still being filled is taken (force) only when at
                # most one window is unanswered, as in _pump_c: meanwhile
                # it grows, rather than leaving in many small writes.
                data, n = self._checked(*self._take_window(force and len(inflight) < 2))
                if data is None:
                    break
                b = _InFlight(data, n)
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
        if not self._abort.is_set():                 # (an abort's own interruption is no news)
            translated = self._translated(error)
            with self._cond:
                self._stats["retries"] += 1
                self._last_error = translated
            log.warning("%s; retrying", translated)
        self._conn.disconnect()

    def _finished(self, b: _InFlight) -> None:
        """Every reply of a batch is in."""
        with self._cond:
            self._stats["batches"] += 1
            self._stats["bytes"] += len(b.data)
            self._stats["published"] += b.n - len(b.errs)
            self._stats["receivers"] += b.receivers
            if not b.errs:
                self._done += b.n
                self._cond.notify_all()              # flush()
                self._progressed()
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
                self._progressed()
            return
        self._report(failed, translate(redis.ResponseError(b.first or "error"), self._conn.address,
                                       self._command), b.n)

    def _give_up(self, inflight: deque, error: BaseException | None) -> None:
        """The retries are spent (or close() ran out of time, ``error``
        None): what is in flight and unanswered fails, and so does every
        message still waiting: they would meet the same server."""
        self._conn.disconnect()
        reason: BaseException | str = error if error is not None else self._abort_reason
        if self._abort.is_set() and self._abort_reason:
            # The failure seen is the abort's own interruption: name the last real one.
            reason, error = self._abort_reason, self._last_error
        failed: list = []
        n = 0
        while inflight:
            b = inflight.popleft()
            failed += _parse_commands(b.data, 0, set(b.errs) | set(range(b.done, b.n)))
            with self._cond:
                self._stats["published"] += b.done - len(b.errs)
                self._stats["receivers"] += b.receivers
            n += b.n
        more, k = self._take_queued()
        failed += more
        n += k
        if n:
            self._report(failed, reason, n, error)

    def _take_queued(self) -> tuple[list, int]:
        """Take every message waiting (as many as were queued at the call:
        publishers may go on meanwhile) as (channel, payload) pairs."""
        left = self._pub.queued
        failed: list = []
        taken = 0
        while taken < left:
            item = self._pub.take(True)
            if item is None:
                break
            data, n = item
            failed += _parse_commands(data, 0)
            taken += n
        return failed, taken

    def _fail_queued(self, reason: str) -> None:
        """Report what is still queued (close(): a publish() that raced it)."""
        failed, n = self._take_queued()
        if n:
            self._report(failed, reason, n)

    def _report(self, failed: list, reason: BaseException | str, n: int, error: BaseException | None = None) -> None:
        if isinstance(reason, BaseException):
            error = error if error is not None else reason
            reason = str(reason)
        err = PublishError(f"{len(failed)} messages were not written: {reason}", failed, reason, error)
        log.error("%d messages were not written: %s", len(failed), reason)
        # The callback runs before flush() can return or raise for these.
        if self._on_error is not None:
            try:
                self._on_error(err, failed)
            except Exception:
                log.exception("on_error callback failed")
        with self._cond:
            self._stats["errors"] += len(failed)
            # The next publish()/flush()/close() raises one error holding
            # every failure not raised yet.  If publish() raises the older
            # one meanwhile, its messages are reported twice, never lost.
            self._pub.pending_error = merged_errors(self._pub.pending_error, err)
            self._done += n
            self._cond.notify_all()
            self._progressed()


class BufferedListProducer(BufferedPublisher):
    """Push to Redis lists in pipelines: ``push(key, value)`` queues an
    RPUSH (``left=True``: LPUSH) and returns at once; the same batching,
    retries, errors and counters as :class:`BufferedPublisher`: when the
    flush thread is idle the value is pushed at once, what is pushed while
    a write is in flight forms the next one, and ``max_delay`` (default
    None) is an optional linger."""

    _COMMAND = "RPUSH"

    def __init__(self, redis: Any = None, *, left: bool = False, **kwargs: Any) -> None:
        self._COMMAND = "LPUSH" if left else "RPUSH"
        super().__init__(redis, **kwargs)
        if not self.driven_by_loop:
            self.push = self._pub.publish

    def push(self, key: ChannelT, value: EncodableT) -> int:  # replaced per instance by the C fast path
        """Queue one value for the list ``key``; returns 1 at once."""
        return self._pub.publish(key, value)
