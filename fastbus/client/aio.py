"""asyncio clients, with the API of redis-py's ``redis.asyncio`` pub/sub.

(This file is over 700 lines because it holds the asyncio twins of
``Client`` and ``PubSub`` and the loop driver that takes the keeper's place:
each twin only changes how it waits, and they sit together so that any other
difference shows.)

    client = fastbus.aio.Client()
    await client.publish("news", "hello")
    p = client.pubsub()
    await p.subscribe("news")
    async for msg in p.listen():
        ...

The asyncio twins change only how they wait: the sockets, batching, filters
and reconnects are those of :class:`fastbus.Client`.  Their connections are
driven by the event loop that first uses them (it serves a connection when
the connection's native reader hands it something: the reader also pings
the broker), so a message reaches a coroutine without a thread hand-over,
and nothing here blocks the loop.
Batches form by themselves: what the running task publishes before it next
yields to the loop leaves as one batch (a full batch leaves at once); what
the socket does not take then, the client's native sender sends as room
comes.  Use a twin from its loop's thread only.

Each twin is a subclass of its sync class that changes only how it waits:
it uses the sync class's public hooks (``session``, ``closed``,
``read_nowait()``, ``ready_message()``, ``ready_batch()``, ``subscribe_nowait()``,
``psubscribe_nowait()``, ``shutdown()``,
``driven_by_loop``), and its methods carry the sync ones' docstrings
(:func:`fastbus._twins.twin_of`).
"""

from __future__ import annotations

import asyncio
import heapq
import inspect
import logging
import math
import os
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from fastbus import protocol as P
from fastbus._messages import PubSubMessage
from fastbus._twins import event_setter, twin_of, wait_event as _wait
from fastbus._types import ChannelT, EncodableT
from fastbus.client._client import CLOSE_TIMEOUT
from fastbus.client._client import Client as _SyncClient
from fastbus.client._endpoint import AbsenceProbe
from fastbus.client._connections import Connections
from fastbus.client._pubsub import Handler
from fastbus.client._pubsub import PubSub as _SyncPubSub
from fastbus.client._requests import InboxMixin
from fastbus.client._session import Session
from fastbus.client._subsession import ConfirmWait
from fastbus._core import REPLY_WAITING
from fastbus.errors import BrokerTimeout, ConnectionClosed, FlushTimeout, KeyRefused, MessagesRejected, NoResponders

__all__ = ["Client", "PubSub"]

log = logging.getLogger("fastbus.client")


class _LoopDriver:
    """Drives a session from an asyncio loop instead of the keeper thread:
    serves it when its native reader (or sender) hands it something (a
    byte on the driver's pipe), and when its due_in() says.  The reader
    reads while the loop is busy: a PubSub's takes what arrives (up to
    max_inbox_bytes), so the broker is not held back; the publishing
    connection's applies and acknowledges the broker's WANTs itself; both
    ping the broker.  Without the native engine, the loop watches the
    socket's ZMQ_FD instead, and pings on a timer."""

    def __init__(self, session: Session, loop: asyncio.AbstractEventLoop, changed: asyncio.Event) -> None:
        self.session = session
        self.loop = loop
        self.changed = changed
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        loop.add_reader(self._wake_r, self._woken)
        # The keeper leaves it alone from now on; input the session reads
        # while letting go of its lock (which wakes nobody) sets ``changed``.
        session.drive_from(loop, self._wake_w, on_input=event_setter(loop, changed))
        self._zmq_fd = session.fd if session.reader is None else -1
        if self._zmq_fd >= 0:
            loop.add_reader(self._zmq_fd, self.serve)
        self._timer: asyncio.TimerHandle | None = None
        self._scheduled = False
        self.serve()                          # what arrived before

    def _woken(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except OSError:
            pass
        self.serve()

    def serve(self) -> None:
        s = self.session
        self._scheduled = False
        if s.closed:
            return
        with s.attempt() as held:
            if held:
                s.serve(time.monotonic())
        if not held:
            # Another thread has it for a moment (a close, a cross-thread call).
            self._again(0.0005)
            return
        self.changed.set()
        due = s.due_in(time.monotonic())
        if due is not None:
            self._again(due)

    def _again(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay, self.serve) if delay > 0 else None
        if delay <= 0 and not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self.serve)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for fd in (self._zmq_fd, self._wake_r):
            if fd >= 0:
                try:
                    self.loop.remove_reader(fd)
                except (RuntimeError, ValueError, OSError):
                    pass      # the loop is closed
        # (a native thread writes to a copy of its own: closing ours is safe)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1


#: How soon a coroutine that found its connection's lock taken tries
#: again.  The holder is a native thread for a moment (the reader reading a
#: WANT or a lease PONG, which it handles itself without waking the loop;
#: the sender sending a batch), or another thread closing: none tells the loop when it
#: lets go, and waiting for the next event instead stalled a flush for
#: a second (then the loop's ping timer, now never).
RETRY_TAKEN = 0.0005


#: How often a publish() waiting for room, or a flush() waiting for its
#: batches to leave, looks again (the native sender sends without telling
#: the loop).
ROOM_LOOK = 0.01


def _look_again_by(delay: float, until: float | None) -> float:
    """``until``, or sooner: ``delay`` from now."""
    soon = time.monotonic() + delay
    return soon if until is None or until > soon else until


def _retry_by(until: float | None) -> float:
    """``until``, or sooner: when to look again at a lock found taken."""
    return _look_again_by(RETRY_TAKEN, until)


@twin_of(_SyncClient)
class Client(_SyncClient):
    """asyncio twin of :class:`fastbus.Client`; same arguments.  Its methods
    that talk to the broker are coroutines; ``pubsub()``, ``stats()``,
    ``is_wanted()`` and ``shutdown()`` are plain calls."""

    driven_by_loop = True

    # Bound to the event loop that first uses the client (_bind).
    _loop: asyncio.AbstractEventLoop | None = None
    _changed: asyncio.Event | None = None
    _driver: _LoopDriver | None = None
    _send_scheduled = False

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return loop
        if self._loop is not None:
            raise RuntimeError("a fastbus.aio.Client is used from one event loop only")
        if self.closed:
            raise ConnectionClosed("client is closed")
        self._loop = loop
        self._changed = asyncio.Event()
        self.session.publisher.send_now = self._send_soon
        self._driver = _LoopDriver(self.session, loop, self._changed)
        return loop

    def _send_soon(self, full: bool) -> None:
        """The publisher's call (in the loop's thread): a full batch leaves
        now; a starting one when the running task yields (the task's turn
        is the batch)."""
        if full:
            self._send_pending()
        elif not self._send_scheduled:
            self._send_scheduled = True
            s = self.session
            wait = s.publisher.linger_left(s.linger_ns)
            if wait:
                self._loop.call_later(wait, self._send_pending)
            else:
                self._loop.call_soon(self._send_pending)

    def _send_pending(self) -> None:
        self._send_scheduled = False
        s = self.session
        if s.closed:
            return
        with s.attempt() as held:
            if not held:
                self._send_scheduled = True
                self._loop.call_later(RETRY_TAKEN, self._send_pending)
                return
            s.pump(force=s.linger_over())  # (what the socket refuses, the native sender sends as room comes)
        if self._changed is not None:
            self._changed.set()
        if s.publisher.queued and not s.flow_paused and not s.blocked:
            self._send_soon(False)        # more than one burst: the rest next turn

    async def publish(self, channel: ChannelT, message: EncodableT,
                      headers: Mapping[str, str | bytes] | None = None) -> int:
        """Waits (without blocking the loop) while the buffer is full, at
        most ``block_timeout``."""
        if self._loop is None:
            self._bind()
        pub = self.session.publisher
        if not pub.has_room():
            await self._wait_for_room()
        if self._tracing is not None:     # (OpenTelemetry configured: a span, its context in the headers)
            with self._tracing.span(channel, message):
                return pub.publish(channel, message, self._tracing.headers(headers))
        return pub.publish(channel, message, headers)

    async def publish_many(self, messages: Iterable[tuple[ChannelT, EncodableT]]) -> int:
        if self._loop is None:
            self._bind()
        n = 0
        for channel, message, headers in self.session.publisher.check_many(messages):   # all checked first
            n += await self.publish(channel, message, headers)
        return n

    async def _wait_for_room(self) -> None:
        pub = self.session.publisher
        deadline = pub.room_deadline
        while True:
            self._changed.clear()
            self._send_pending()
            if pub.room_check(deadline):      # (raises as the sync wait does; else wakes the sender)
                return
            # The sender frees room without telling the loop: look again
            # soon, as the sync wait does (only a full buffer waits here).
            await _wait(self._changed, _look_again_by(ROOM_LOOK, deadline))

    async def ping(self, timeout: float | None = 10.0) -> bool:
        await self.flush(timeout)
        return True

    async def flush(self, timeout: float | None = 10.0) -> None:
        if self.closed:
            raise ConnectionClosed("client is closed")
        self._bind()
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        s = self.session
        f = None
        probe = None if timeout is None else AbsenceProbe(self.endpoint, start)
        while True:
            self._changed.clear()
            with s.attempt() as held:
                if held:
                    if f is None:
                        f = s.start_flush()
                    done = s.flush_step(f)
                    if not done and probe is not None:
                        probe.check_handshake(s)
            if held and done:
                notice = s.take_notice()
                if notice is not None:
                    raise notice
                return
            if probe is not None and not s.instance and time.monotonic() >= probe.next:
                # (the probe connects a socket: not in the event loop's thread)
                await asyncio.get_running_loop().run_in_executor(None, probe.check, s, s.publisher.queued)
            until = deadline if probe is None else probe.wake_by(s, deadline)
            if not held:
                until = _retry_by(until)
            elif f is not None and not f.pinged:
                # Batches it covers are still going out (a full socket):
                # the native sender sends them without telling the loop.
                until = _look_again_by(ROOM_LOOK, until)
            if not await _wait(self._changed, until) and (deadline is not None and time.monotonic() >= deadline):
                queued = s.publisher.queued
                raise FlushTimeout(f"the broker at {self.endpoint} did not confirm the flush within {timeout:g} s "
                                   f"({queued} message(s) stay queued for it)", queued)

    async def broker_stats(self, timeout: float = 5.0) -> dict:
        if self.closed:
            raise ConnectionClosed("client is closed")
        self._bind()
        deadline = time.monotonic() + timeout
        s = self.session
        asked = False
        while True:
            self._changed.clear()
            with s.attempt() as held:
                if held:
                    if not asked:
                        s.stats_replies.clear()
                        s.send([P.STATS])
                        asked = True
                    s.read()
                    if s.stats_replies:
                        return s.stats_replies.pop(0)
            if not await _wait(self._changed, deadline if held else _retry_by(deadline)) and \
                    time.monotonic() >= deadline:
                raise BrokerTimeout(f"no answer from the broker at {self.endpoint} within {timeout:g} s",
                                    self.endpoint)

    async def request(self, channel: ChannelT, data: EncodableT, timeout: float = 1.0,
                      headers: Mapping[str, str | bytes] | None = None) -> PubSubMessage:
        """A responder answers with ``await message.respond(data)``."""
        inbox = await self._async_inbox()
        return await self._ask_async(inbox, channel, data, timeout, headers, None, inbox._outcome)

    async def _async_inbox(self) -> _AsyncInbox:
        if self.closed:
            raise ConnectionClosed("client is closed")
        self._bind()
        return self._inbox or await self._open_async_inbox()

    async def _ask_async(self, inbox: _AsyncInbox, channel: ChannelT, data: EncodableT, timeout: float,
                         headers: Mapping[str, str | bytes] | None, hold: int | None, outcome: Any) -> Any:
        """A request (``hold``: to a held group) and what ``outcome`` makes
        of its answer."""
        rid = inbox.replies.open(True)
        try:
            if not self._send_request(self.session.publisher, channel, data, inbox.reply_channel(rid), headers,
                                      hold):
                raise NoResponders(channel)
            await inbox.wait(rid, timeout)
        except BaseException:
            inbox.replies.close(rid)
            raise
        return outcome(channel, rid, timeout)

    async def hold(self, channel: ChannelT, queue: str | bytes, expiry: float = 60.0) -> None:
        """As the sync Client's; awaited."""
        await self._hold(channel, queue, expiry, False)

    async def release(self, channel: ChannelT, queue: str | bytes) -> None:
        """As the sync Client's; awaited."""
        await self._hold(channel, queue, 1.0, True)

    async def bind(self, source: ChannelT, channel: ChannelT, queue: str | bytes, life: float = 86400.0,
                   capacity: int = 0) -> None:
        """As the sync Client's; awaited."""
        await self._hold_op(lambda inbox: inbox.bind_nowait(source, channel, queue, life, capacity))

    async def unbind(self, source: ChannelT, channel: ChannelT, queue: str | bytes) -> None:
        """As the sync Client's; awaited."""
        await self._hold_op(lambda inbox: inbox.bind_nowait(source, channel, queue, 1.0, 0, True))

    async def _hold(self, channel: ChannelT, queue: str | bytes, expiry: float, release: bool) -> None:
        await self._hold_op(lambda inbox: inbox.hold_nowait(channel, queue, expiry, release))

    async def _hold_op(self, send: Any) -> None:
        inbox = await self._async_inbox()
        seq = send(inbox)
        inbox._drive()
        try:
            await inbox.wait_confirmed(seq)
        finally:
            inbox.hold_outcome(seq)

    async def enqueue(self, channel: ChannelT, data: EncodableT, capacity: int = 0, timeout: float = 1.0,
                      headers: Mapping[str, str | bytes] | None = None) -> bool:
        """As the sync Client's; awaited."""
        inbox = await self._async_inbox()
        return bool(await self._ask_async(inbox, channel, data, timeout, headers, capacity, inbox.held_outcome))

    async def _open_async_inbox(self) -> _AsyncInbox:
        if self._inbox_opening is None:
            self._inbox_opening = asyncio.ensure_future(self._make_inbox())
        # (shielded: one request cancelled must not cancel the others' inbox)
        return await asyncio.shield(self._inbox_opening)

    async def _make_inbox(self) -> _AsyncInbox:
        inbox = _AsyncInbox(self.connections)
        inbox.responder = self
        try:
            await inbox.psubscribe(inbox.prefix + "*")   # confirmed: in effect for every publisher
        except BaseException:
            inbox.shutdown(1.0)
            self._inbox_opening = None
            raise
        self._inbox = inbox
        return inbox

    _inbox_opening: asyncio.Future | None = None

    def pubsub(self, ignore_subscribe_messages: bool = False, durable: str | None = None) -> PubSub:
        """Call it in the loop that uses the PubSub (``durable``: as the
        sync Client's)."""
        if self.closed:
            raise ConnectionClosed("client is closed")
        ps = PubSub(self.connections, ignore_subscribe_messages=ignore_subscribe_messages, durable=durable)
        ps.responder = self                      # (a received request's respond() is awaited)
        return ps

    def shutdown(self, timeout: float = 5.0) -> None:
        """The event loop stops driving the connections first."""
        if self.closed:
            return
        if self._driver is not None:
            self._driver.stop()
        super().shutdown(timeout)

    async def close(self, timeout: float | None = None) -> int:
        if self.closed:
            return 0
        wait = CLOSE_TIMEOUT if timeout is None else timeout
        failure: Exception | None = None
        try:
            await self.flush(wait)
        except (TimeoutError, ConnectionClosed, KeyRefused, MessagesRejected) as exc:
            failure = exc
        undelivered = self._undelivered() if failure is not None else 0
        self.shutdown(wait)
        return self._closed_with(failure, undelivered, timeout is None)

    aclose = close

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            await self.close()
            return
        try:
            await self.close()
        except (FlushTimeout, MessagesRejected) as lost:
            log.warning("%s", lost)


@twin_of(_SyncPubSub)
class PubSub(_SyncPubSub):
    """asyncio twin of :class:`fastbus.PubSub`: the (un)subscribe calls and
    the receiving calls are coroutines.  Create it in the loop that uses it.

    As redis.asyncio's: a handler may be a coroutine function (it is
    awaited); ``get_message()`` before any subscribe(), psubscribe(),
    ping() or connect() raises RuntimeError; ``run()`` passes messages to
    their handlers until cancelled; ``aclose()`` closes (``close()`` and
    ``reset()`` still do, with a DeprecationWarning, as there)."""

    awaits_handlers = True

    def __init__(self, conns: Connections, ignore_subscribe_messages: bool = False,
                 durable: str | None = None) -> None:
        loop = asyncio.get_running_loop()
        super().__init__(conns, ignore_subscribe_messages, durable)
        self._changed = asyncio.Event()
        self._loop = loop
        self._driver = _LoopDriver(self.session, loop, self._changed)
        self._connected = False           # redis.asyncio's "connection set": by a command, or connect()

    def _check_connected(self) -> None:
        if not self._connected and not self.closed:
            raise RuntimeError("pubsub connection not set: did you forget to call subscribe() or psubscribe()?")

    async def connect(self) -> None:
        """As redis.asyncio's: make sure the PubSub is connected (again,
        after aclose())."""
        self.open()
        self._drive()
        self._connected = True
        # Connecting is I/O for redis.asyncio, so it always lets the loop
        # run: a reconnect loop of connect() and listen() (which ends at
        # once when nothing is subscribed) must not starve the loop here.
        await asyncio.sleep(0)

    async def check_health(self) -> None:
        self._check_connected()
        super().check_health()

    async def _await_handled(self) -> None:
        """Await what handlers returned, in order."""
        handled = self.handled
        while handled:
            await handled.pop(0)

    def _drive(self) -> None:
        """After a subscribe() that connected again (after close()), the
        loop drives the new connection."""
        if self._driver.session is not self.session:
            self._driver = _LoopDriver(self.session, self._loop, self._changed)

    async def subscribe(self, *channels: Any, queue: str | bytes | None = None, **handlers: Handler) -> None:
        await self.wait_confirmed(self.subscribe_nowait(*channels, queue=queue, **handlers))

    async def psubscribe(self, *patterns: Any, queue: str | bytes | None = None, **handlers: Handler) -> None:
        await self.wait_confirmed(self.psubscribe_nowait(*patterns, queue=queue, **handlers))

    def subscribe_nowait(self, *channels: Any, queue: str | bytes | None = None, **handlers: Handler) -> int:
        seq = super().subscribe_nowait(*channels, queue=queue, **handlers)
        self._drive()
        self._connected = True
        return seq

    def psubscribe_nowait(self, *patterns: Any, queue: str | bytes | None = None, **handlers: Handler) -> int:
        seq = super().psubscribe_nowait(*patterns, queue=queue, **handlers)
        self._drive()
        self._connected = True
        return seq

    async def wait_confirmed(self, seq: int) -> None:
        if not seq:
            return
        s = self.session
        wait = ConfirmWait(s, seq)
        s.awaiting += 1
        try:
            while True:
                self._changed.clear()
                with s.attempt() as held:
                    if held and not wait.done():
                        wait.check(locked=True, probe=False)
                        s.read()
                if wait.done():
                    return
                wait.check(locked=False, probe=False)
                if not s.instance and time.monotonic() >= wait.probe.next:
                    # (the probe connects a socket: not in the event loop's thread)
                    await asyncio.get_running_loop().run_in_executor(None, wait.probe.check, s, 0)
                await _wait(self._changed, wait.wake_by() if held else _retry_by(wait.wake_by()))
        finally:
            s.awaiting -= 1

    async def ping(self, message: Any = None) -> None:
        super().ping(message)
        self._connected = True

    async def run(self, *, exception_handler: Callable[[BaseException, Any], Any] | None = None,
                  poll_timeout: float = 1.0) -> None:
        """redis.asyncio's: pass every message to its subscription's handler
        (awaited if it is a coroutine function) until cancelled
        (``task = asyncio.create_task(p.run()); ...; task.cancel()``).  Every
        channel and pattern needs a handler, else NoHandlerError.  An
        exception from a handler or a read goes to
        ``exception_handler(exc, pubsub)`` (awaited if it returns an
        awaitable), or ends the run.  It ends by itself when the PubSub is
        closed."""
        self.require_handlers("run")
        await self.connect()
        while True:
            try:
                await self.get_message(ignore_subscribe_messages=True, timeout=poll_timeout)
            except asyncio.CancelledError:
                raise
            except ConnectionClosed:
                return
            except Exception as exc:
                if exception_handler is None:
                    raise
                r = exception_handler(exc, self)
                if inspect.isawaitable(r):
                    await r
            await asyncio.sleep(0)        # other tasks run even when nothing had to be awaited

    async def run_in_thread(self, sleep_time: float = 0.0, daemon: bool = False,
                            exception_handler: Callable[[BaseException, Any, Any], None] | None = None
                            ) -> asyncio.Task:
        """Not a thread: a task of this loop that reads the PubSub; its
        ``stop()`` ends it and closes the PubSub (redis.asyncio's ``run()``
        as a task).  ``exception_handler(exc, pubsub, task)``; ``daemon`` is
        ignored."""
        self.require_handlers("run_in_thread")
        stopping = asyncio.Event()
        wait = sleep_time if sleep_time > 0 else 0.1

        async def run() -> None:
            try:
                while not stopping.is_set():
                    try:
                        await self.get_message(ignore_subscribe_messages=True, timeout=wait)
                    except ConnectionClosed:
                        break                     # stop(), or the PubSub or its client closed
                    except Exception as exc:
                        if exception_handler is None:
                            raise
                        exception_handler(exc, self, task)
            finally:
                await self.aclose()

        task = asyncio.ensure_future(run())
        task.stop = stopping.set  # type: ignore[attr-defined]
        return task

    async def unsubscribe(self, *channels) -> None:
        super().unsubscribe(*channels)
        self._connected = True

    def unsubscribe_nowait(self, *channels) -> int:
        seq = super().unsubscribe_nowait(*channels)
        self._drive()
        return seq

    async def punsubscribe(self, *patterns) -> None:
        super().punsubscribe(*patterns)
        self._connected = True

    async def _afill(self, deadline: float | None) -> bool:
        """Wait, without blocking the loop, until something arrived (True)
        or ``deadline`` passes (False)."""
        while True:
            self._changed.clear()
            if self.read_nowait():
                return True
            if not await _wait(self._changed, deadline):
                return False

    async def get_message(self, ignore_subscribe_messages: bool = False,
                          timeout: float | None = 0.0) -> PubSubMessage | None:
        self._check_connected()
        return await self._next_message_async(ignore_subscribe_messages, timeout, False)

    async def _next_message_async(self, ignore_subscribe_messages: bool, timeout: float | None,
                                  while_subscribed: bool) -> PubSubMessage | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            msg = self.ready_message(ignore_subscribe_messages)
            if self.handled:
                await self._await_handled()
                continue
            if msg is not None:
                return msg
            if while_subscribed and not self.subscribed:
                return None
            if not await self._afill(deadline):
                return None

    async def listen(self) -> AsyncIterator[PubSubMessage]:
        while self.subscribed or self.has_ready():   # (the last confirmations come together)
            try:
                msg = await self._next_message_async(False, None, True)
            except ConnectionClosed:
                return
            if msg is not None:
                yield msg

    async def get_batch(self, timeout: float | None = None, max_messages: int | None = None) -> list:
        if max_messages is not None and max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            out = self.ready_batch(max_messages)
            if self.handled:
                await self._await_handled()
            if out:
                return out
            if not await self._afill(deadline):
                return []

    def shutdown(self, timeout: float = 5.0) -> None:
        """The event loop stops driving the connection first, and a
        coroutine waiting for a message wakes (and sees it closed)."""
        if self.closed:
            return
        self._driver.stop()
        super().shutdown(timeout)
        self._changed.set()

    async def aclose(self) -> None:
        """Unsubscribe from everything and close this connection."""
        self.shutdown(5.0)
        self._connected = False

    async def close(self) -> None:
        """Deprecated, as in redis.asyncio: use aclose()."""
        warnings.warn("PubSub.close() is deprecated: use aclose()", DeprecationWarning, stacklevel=2)
        await self.aclose()

    async def reset(self) -> None:
        """Deprecated, as in redis.asyncio: use aclose()."""
        warnings.warn("PubSub.reset() is deprecated: use aclose()", DeprecationWarning, stacklevel=2)
        await self.aclose()

    async def __aenter__(self) -> PubSub:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class _AsyncInbox(InboxMixin, PubSub):
    """A client's replies in asyncio (fastbus.client._requests): requests
    wait on futures; one task reads the connection and ends the requests
    whose time is up (one timer for all: the earliest deadline); the
    loop's reads resolve the futures of the requests a batch completed."""

    def __init__(self, conns: Connections) -> None:
        self._open_inbox()
        super().__init__(conns, ignore_subscribe_messages=True)
        self._waiting: dict[int, asyncio.Future] = {}
        self._deadlines: list[tuple[float, int]] = []    # a heap; completed requests leave it lazily
        self._reader: asyncio.Task | None = None

    def shutdown(self, timeout: float = 5.0) -> None:
        super().shutdown(timeout)                 # (sets _changed: the reader sees it closed, and ends)
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()

    def _replied(self) -> None:
        for rid in self.replies.done():
            fut = self._waiting.get(rid)
            if fut is not None and not fut.done():
                fut.set_result(None)

    async def wait(self, rid: int, timeout: float) -> None:
        """Until request ``rid`` completed or ``timeout`` passed."""
        fut = self._loop.create_future()
        self._waiting[rid] = fut
        if self.replies.state(rid) != REPLY_WAITING:       # (completed before it was listed)
            fut.set_result(None)
        deadline = time.monotonic() + timeout
        heapq.heappush(self._deadlines, (deadline, rid))
        if self._reader is None or self._reader.done():
            self._reader = asyncio.ensure_future(self._read())
        elif deadline < self._sleeps_until:
            self._changed.set()                   # (the reader sleeps until a later deadline)
        try:
            await fut
        finally:
            del self._waiting[rid]

    async def _read(self) -> None:
        """Read the inbox (while nothing waits too: what comes late is
        taken, and dropped, not left to pile up); end the requests past
        their deadline."""
        deadlines = self._deadlines
        while not self.closed:
            self._changed.clear()
            try:
                if self.read_nowait():
                    self._take_control()
            except ConnectionClosed:
                return
            now = time.monotonic()
            while deadlines and (deadlines[0][0] <= now or deadlines[0][1] not in self._waiting):
                _, rid = heapq.heappop(deadlines)
                fut = self._waiting.get(rid)
                if fut is not None and not fut.done():
                    fut.set_result(None)          # (its outcome says it timed out)
            self._sleeps_until = deadlines[0][0] if deadlines else math.inf
            await _wait(self._changed, deadlines[0][0] if deadlines else None)

    _sleeps_until = math.inf
