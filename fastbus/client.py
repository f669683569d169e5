"""fastbus clients, with the pub/sub API Python users know from redis-py.

    client = fastbus.Client()                 # the broker of `fastbus broker`
    client.publish("news", "hello")           # buffered, sent in batches
    p = client.pubsub()
    p.subscribe("news")
    p.psubscribe("market.*")                  # prefix patterns only
    for msg in p.listen():                    # {'type', 'pattern', 'channel', 'data'}
        ...

Each Client runs one I/O thread that owns its ZeroMQ sockets: one for
publishing, one per PubSub (so each PubSub's subscriptions and ordering are
its own).  Publishing appends to a C outbox: a batch goes out when it is
full, after ``max_delay`` (default 1 ms), on ``flush()`` and on ``close()``.
The broker tells each publisher which topics someone wants, and ``publish``
drops the others before they reach the network (``publish`` returns 0 then;
``stats()`` counts them).

After a broker restart or reconnect, the I/O thread introduces itself again
and resends every subscription; delivery resumes without user code.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator

import zmq

from fastbus import protocol as P
from fastbus._core import (
    SUBSCRIBE,
    UNSUBSCRIBE,
    Outbox,
    Publisher,
    Trie,
    decode,
    decode_messages,
)
from fastbus.errors import FastbusError, PublishTimeout  # noqa: F401  (PublishTimeout: re-exported)

log = logging.getLogger("fastbus.client")

GLOB_SPECIALS = set("*?[")
BATCH_MESSAGES = 8192     # get_batch(): about this many messages per call by default
SEND_BURST = 32           # batches the I/O thread sends before it reads the broker again


class ConnectionClosed(FastbusError):
    """The client or pubsub was closed."""


def _key(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (int, float)):        # redis-py accepts numbers as channel names
        return str(value).encode()
    raise TypeError(f"channels and messages are bytes or str, not {type(value).__name__}")


def pattern_prefix(pattern) -> bytes:
    """The prefix of a pattern ``prefix*``; any other glob is an error."""
    p = _key(pattern)
    if not p.endswith(b"*") or GLOB_SPECIALS & set(p[:-1].decode("latin-1")):
        raise ValueError(
            f"fastbus patterns are prefixes ending in '*' (like 'news.*'); {pattern!r} has "
            f"{'no trailing *' if not p.endswith(b'*') else 'another glob character'}")
    return p[:-1]


class _Conn:
    """One DEALER connection to the broker, owned by the I/O thread."""

    def __init__(self, kind: str, pubsub: PubSub | None = None) -> None:
        self.kind = kind                  # "pub" | "sub"
        self.pubsub = pubsub
        self.sock: zmq.Socket | None = None
        self.instance = b""               # the broker's, from WELCOME / PONG
        self.subs: set[tuple[bytes, bool]] = set()   # what the broker was told (sub conns)
        self.seq = 0
        self.paused = False               # inbox full: not reading the socket
        self.polling = False              # registered with the I/O thread's poller


class Client:
    """A connection to a fastbus broker (``tcp://host:port``, or
    ``endpoint=`` for ipc:// and inproc://).

    Publishing is buffered: at most ``max_messages`` records or ``max_bytes``
    bytes per batch, and a batch leaves at most ``max_delay`` seconds after
    its oldest message.  At most ``max_buffer_bytes`` wait to be sent; then
    ``publish()`` blocks until there is room, up to ``block_timeout``
    seconds (None: no limit), and raises :class:`PublishTimeout`.  The
    buffer fills when the broker is unreachable, or when it asks publishers
    to pause because a subscriber fell behind (flow control, see
    ``BrokerConfig.flow_pause_bytes``).  Each PubSub holds at most ``max_inbox_bytes`` of
    received batches not yet read; beyond that the client stops reading its
    socket, so a subscriber that falls behind pushes back on the broker
    (which then drops its oldest messages with a ``gap`` notice, or
    disconnects it, as configured) instead of growing without bound.  ``decode_responses=True`` gives str channels and
    payloads.  CURVE: pass the broker's public key and this client's key
    pair (Z85 strings).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = P.DEFAULT_PORT, *, endpoint: str | None = None,
                 decode_responses: bool = False, max_messages: int = 1000, max_bytes: int = 64 * 1024,
                 max_delay: float = 0.001, curve_server_key: str | None = None,
                 curve_public_key: str | None = None, curve_secret_key: str | None = None,
                 name: str | None = None, context: zmq.Context | None = None,
                 ping_interval: float = 1.0, max_inbox_bytes: int = 8 * 1024 * 1024,
                 max_buffer_bytes: int = 8 * 1024 * 1024, block_timeout: float | None = 60.0) -> None:
        if max_delay is None or not 0 < max_delay <= 10:
            raise ValueError("max_delay must be between 0 and 10 seconds")
        if not 0 < ping_interval <= 60:
            raise ValueError("ping_interval must be between 0 and 60 seconds")
        if max_inbox_bytes <= 0:
            raise ValueError("max_inbox_bytes must be positive")
        if max_buffer_bytes <= 0:
            raise ValueError("max_buffer_bytes must be positive")
        if block_timeout is not None and block_timeout < 0:
            raise ValueError("block_timeout must be >= 0 seconds, or None to wait for ever")
        self.max_inbox_bytes = max_inbox_bytes
        if (curve_server_key is None) != (curve_secret_key is None) or \
                (curve_public_key is None) != (curve_secret_key is None):
            raise ValueError("CURVE needs curve_server_key, curve_public_key and curve_secret_key together")
        self.endpoint = endpoint or f"tcp://{host}:{int(port)}"
        self.decode_responses = decode_responses
        self.name = name or f"client-{os.getpid()}-{id(self):x}"
        self._curve = (curve_server_key, curve_public_key, curve_secret_key) if curve_secret_key else None
        self._ctx = context or zmq.Context.instance()
        self._outbox = Outbox(max_messages=max_messages, max_bytes=max_bytes, max_delay=max_delay)
        self._ping_interval = ping_interval
        self._closed = False
        self._io = _IOThread(self)
        # The hot path, in C: filter, append, wake when a batch is due.
        self._publisher = Publisher(self._outbox, self._io.wake)
        self._publisher.closed_error = ConnectionClosed
        self._publisher.max_buffer_bytes = max_buffer_bytes
        self._publisher.block_timeout = block_timeout
        self._publisher.block_reason = self._block_reason
        self._flow_paused = False                # the broker asked publishers to pause
        self._flow_pauses = 0
        self.publish = self._publisher.publish
        self._io.start()
        self._pub = _Conn("pub")
        self._io.call("open", self._pub)

    # -- publishing --------------------------------------------------------

    @property
    def _wanted(self) -> Trie | None:
        """What subscribers want (the broker's view), None until it is known."""
        return self._publisher.wanted

    @_wanted.setter
    def _wanted(self, trie: Trie | None) -> None:
        self._publisher.wanted = trie

    def publish(self, channel, message) -> int:  # replaced per instance by Publisher.publish
        """Queue a message; returns 1, or 0 when no subscriber wants its
        channel (the broker said so), in which case it is not sent."""
        return self._publisher.publish(channel, message)

    def publish_many(self, messages) -> int:
        """Queue many ``(channel, message)`` pairs; returns how many were
        queued (the others nobody wanted)."""
        publish = self._publisher.publish
        return sum([publish(channel, message) for channel, message in messages])

    def _block_reason(self) -> str:
        """Why publish() timed out on a full buffer (PublishTimeout's text)."""
        if self._flow_paused:
            return "the broker asked publishers to pause (a subscriber is behind)"
        return f"the broker at {self.endpoint} is not taking them"

    def is_wanted(self, channel) -> bool:
        """Would publish() send this channel?  True until the broker has told
        this client what its subscribers want, then whether anyone does."""
        wanted = self._wanted
        return True if wanted is None else wanted.any_match(_key(channel))

    def flush(self, timeout: float | None = 10.0) -> None:
        """Send everything queued and wait until the broker has it (a ping
        that follows the batches comes back).  TimeoutError if it does not
        within ``timeout`` seconds (the messages stay queued for sending)."""
        if self._closed:
            raise ConnectionClosed("client is closed")
        done = threading.Event()
        self._io.call("flush", done)
        if not done.wait(timeout):
            raise TimeoutError(f"broker at {self.endpoint} did not confirm the flush within {timeout} s")

    # -- subscribing -------------------------------------------------------

    def pubsub(self, ignore_subscribe_messages: bool = False) -> PubSub:
        """A new subscriber with its own connection."""
        if self._closed:
            raise ConnectionClosed("client is closed")
        return PubSub(self, ignore_subscribe_messages=ignore_subscribe_messages)

    # -- information -------------------------------------------------------

    def stats(self) -> dict:
        """This client's counters: published, filtered (not sent: nobody
        wanted them), queued."""
        return {"published": self._outbox.accepted, "filtered": self._outbox.refused,
                "queued": self._publisher.queued, "queued_bytes": self._publisher.buffered_bytes,
                "filter_active": self._wanted is not None, "flow_paused": self._flow_paused,
                "flow_pauses": self._flow_pauses}

    def broker_stats(self, timeout: float = 5.0) -> dict:
        """The broker's counters (see ``fastbus stats``)."""
        box: queue.Queue = queue.Queue()
        self._io.call("stats", box)
        try:
            return box.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no answer from the broker at {self.endpoint}") from None

    # -- lifecycle ---------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Flush (waiting up to ``timeout`` for the broker), then close every
        connection of this client, its PubSubs included."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        except (TimeoutError, ConnectionClosed):
            log.warning("closing %s with messages the broker did not confirm", self.name)
        self._closed = True
        self._publisher.closed = True
        self._io.stop(timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self._io.stop(1.0)
            except Exception:
                pass


class PubSub:
    """Subscriptions and received messages, shaped like redis-py's PubSub.

    ``subscribe`` takes exact channels; ``psubscribe`` prefix patterns
    (``"news.*"``).  Messages are dicts ``{'type', 'pattern', 'channel',
    'data'}``: types ``subscribe``, ``psubscribe``, ``unsubscribe``,
    ``punsubscribe`` (confirmations, ``data`` = subscriptions held),
    ``message`` / ``pmessage``, and fastbus's ``gap`` (``data`` = messages
    lost because this subscriber fell behind) and ``reconnect`` (the
    subscriptions were resent to a restarted or reconnected broker).

    A message matching several subscriptions is delivered once: as
    ``message`` if a channel matches exactly, else as ``pmessage`` with the
    longest matching pattern.  ``get_batch()`` returns data messages many at
    a time as ``(channel, data)`` tuples, for high-throughput consumers.
    """

    def __init__(self, client: Client, ignore_subscribe_messages: bool = False) -> None:
        self._client = client
        self.ignore_subscribe_messages = ignore_subscribe_messages
        self.channels: dict = {}
        self.patterns: dict = {}
        self._local = Trie()                      # our subscriptions, id -> (key, prefix)
        self._ids: dict[tuple[bytes, bool], int] = {}
        self._byid: dict[int, tuple[bytes, bool]] = {}
        self._next_id = itertools.count(1)
        self._seq = 0
        self._confirms: dict[int, list] = {}      # seq -> confirmation dicts
        self._unsub_seqs: deque[int] = deque()    # seqs of unsubscribes not yet confirmed
        self._classes: dict = {}                  # channel -> (type, pattern) or None; reset on (un)subscribe
        self._cond = threading.Condition()
        self._inbox: deque = deque()              # filled by the I/O thread
        self._inbox_bytes = 0
        self._control: deque = deque()            # confirmations, gaps, reconnects for get_message
        self._pending: deque = deque()            # decoded (channel, data) not yet returned (get_batch)
        self._dicts: deque = deque()              # decoded message dicts not yet returned (get_message)
        self._closed = False
        self._wakers: list = []                   # called (I/O thread) on each delivery: asyncio, sharding
        self._conn = _Conn("sub", self)
        client._io.call("open", self._conn)

    # -- subscriptions -----------------------------------------------------

    def _change(self, op: int, entries: list[tuple[bytes, bool, str, object]]) -> None:
        if self._closed:
            raise ConnectionClosed("pubsub is closed")
        ops = []
        confirms = []
        for key, prefix, kind, name in entries:
            table = self.patterns if prefix else self.channels
            held = (key, prefix) in self._ids
            if op == SUBSCRIBE and not held:
                i = next(self._next_id)
                self._ids[key, prefix] = i
                self._byid[i] = (key, prefix)
                self._local.add(key, i, prefix=prefix)
                table[name] = None
                ops.append((SUBSCRIBE, key, prefix))
            elif op == UNSUBSCRIBE and held:
                i = self._ids.pop((key, prefix))
                del self._byid[i]
                self._local.remove(key, i, prefix=prefix)
                table.pop(name, None)
                ops.append((UNSUBSCRIBE, key, prefix))
            confirms.append({"type": kind, "pattern": None, "channel": self._out(name),
                             "data": len(self.channels) + len(self.patterns)})
        self._classes.clear()
        self._seq += 1
        seq = self._seq
        self._confirms[seq] = confirms
        if op == UNSUBSCRIBE and ops:
            self._unsub_seqs.append(seq)
        self._client._io.call("sub", self._conn, seq, ops)

    def _out(self, value):
        if self._client.decode_responses and isinstance(value, bytes):
            return value.decode("utf-8")
        return value

    def subscribe(self, *channels) -> None:
        """Subscribe to exact channels (bytes or str)."""
        if not channels:
            raise ValueError("subscribe() needs at least one channel")
        self._change(SUBSCRIBE, [(_key(c), False, "subscribe", _key(c)) for c in channels])

    def psubscribe(self, *patterns) -> None:
        """Subscribe to prefix patterns: ``"news.*"`` matches every channel
        starting with ``news.``; ``"*"`` matches all.  Other globs raise
        ValueError."""
        if not patterns:
            raise ValueError("psubscribe() needs at least one pattern")
        self._change(SUBSCRIBE, [(pattern_prefix(p), True, "psubscribe", _key(p)) for p in patterns])

    def unsubscribe(self, *channels) -> None:
        """Unsubscribe from channels (all of them without arguments)."""
        names = [_key(c) for c in channels] or list(self.channels)
        if names:
            self._change(UNSUBSCRIBE, [(n, False, "unsubscribe", n) for n in names])

    def punsubscribe(self, *patterns) -> None:
        """Unsubscribe from patterns (all of them without arguments)."""
        names = [_key(p) for p in patterns] or list(self.patterns)
        if names:
            self._change(UNSUBSCRIBE, [(pattern_prefix(n), True, "punsubscribe", n) for n in names])

    @property
    def subscribed(self) -> bool:
        return bool(self.channels or self.patterns)

    # -- receiving ---------------------------------------------------------

    def _wait_item(self, deadline: float | None):
        with self._cond:
            while not self._inbox:
                if self._closed:
                    raise ConnectionClosed("pubsub is closed")
                if deadline is None:
                    self._cond.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    self._cond.wait(left)
            item = self._inbox.popleft()
            if item[0] == "data":
                self._inbox_bytes -= len(item[2])
                if self._conn.paused and self._inbox_bytes <= self._client.max_inbox_bytes // 2:
                    self._conn.paused = False
                    self._client._io.call("resume", self._conn)
            return item

    def _take(self, deadline: float | None, as_dicts: bool = False, sink: list | None = None) -> bool:
        """Move one inbox item into ``sink`` or _pending (tuples), _dicts
        (message dicts) or _control; False on timeout."""
        item = self._wait_item(deadline)
        if item is None:
            return False
        kind = item[0]
        if kind == "data":
            _, acked, batch = item
            while self._unsub_seqs and self._unsub_seqs[0] <= acked:
                self._unsub_seqs.popleft()
            if as_dicts:
                # Classification also drops what no subscription matches.
                self._dicts.extend(decode_messages(batch, self._classes, self._classify,
                                                   self._client.decode_responses))
                return True
            records = decode(batch)
            if self._unsub_seqs:
                # Routed before an unsubscribe took effect: keep only what
                # still matches our subscriptions.
                offsets, _ids = self._local.match_flat([t for t, _p in records])
                records = [r for i, r in enumerate(records) if offsets[i + 1] > offsets[i]]
            (self._pending if sink is None else sink).extend(records)
        elif kind == "confirm":
            for msg in self._confirms.pop(item[1], ()):
                self._control.append(msg)
        elif kind == "gap":
            self._control.append({"type": "gap", "pattern": None, "channel": None, "data": item[1]})
        elif kind == "reconnect":
            self._control.append({"type": "reconnect", "pattern": None, "channel": None,
                                  "data": self._out(item[1])})
        return True

    def _classify(self, channel: bytes):
        """("message", None) if a channel matches exactly, ("pmessage",
        pattern) for the longest matching pattern, None if nothing matches
        (unsubscribed while in flight).  Cached per channel."""
        ids = self._local.match(channel)
        result = None
        best = -1
        for i in ids:
            key, prefix = self._byid.get(i, (None, None))
            if key is None:
                continue
            if not prefix:
                result = ("message", None)
                break
            if len(key) > best:
                best = len(key)
                result = ("pmessage", self._out(key + b"*"))
        if len(self._classes) >= 100_000:
            self._classes.clear()
        self._classes[channel] = result
        return result

    def _message(self, channel: bytes, data: bytes) -> dict | None:
        cls = self._classes.get(channel, False)
        if cls is False:
            cls = self._classify(channel)
        if cls is None:
            return None
        if self._client.decode_responses:
            return {"type": cls[0], "pattern": cls[1], "channel": channel.decode("utf-8"),
                    "data": data.decode("utf-8")}
        return {"type": cls[0], "pattern": cls[1], "channel": channel, "data": data}

    def get_message(self, ignore_subscribe_messages: bool = False, timeout: float | None = 0.0) -> dict | None:
        """The next message, or None if none arrives within ``timeout``
        seconds (0: do not wait; None: wait for ever)."""
        if self._dicts and not self._control and not self._pending:
            return self._dicts.popleft()           # the common case
        ignore = ignore_subscribe_messages or self.ignore_subscribe_messages
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while self._control:
                msg = self._control.popleft()
                if ignore and msg["type"] in ("subscribe", "psubscribe", "unsubscribe", "punsubscribe"):
                    continue
                return msg
            while self._pending:                   # left by get_batch(): keep the order
                msg = self._message(*self._pending.popleft())
                if msg is not None:
                    return msg
            if self._dicts:
                return self._dicts.popleft()
            if not self._take(deadline, as_dicts=True):
                return None

    def listen(self) -> Iterator[dict]:
        """Messages as they arrive, for ever (until close())."""
        dicts = self._dicts
        while True:
            while dicts and not self._control and not self._pending:
                yield dicts.popleft()
            try:
                msg = self.get_message(timeout=None)
            except ConnectionClosed:
                return
            if msg is not None:
                yield msg

    def get_batch(self, timeout: float | None = None, max_messages: int | None = None) -> list:
        """Data messages many at a time, as ``(channel, data)`` tuples (bytes,
        or str with decode_responses); [] if none arrive within ``timeout``.
        At most ``max_messages``, or by default what has arrived up to about
        8192 (whole received batches), so a call never takes long.
        Confirmations and notices wait for get_message()."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._dicts:                            # left by get_message(): keep the order
            out = [(d["channel"], d["data"]) for d in self._dicts]
            self._dicts.clear()
            return out
        if max_messages is not None and max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        limit = max_messages if max_messages is not None else BATCH_MESSAGES
        pending = self._pending
        if pending:                                # left by get_message()/max_messages: first
            if len(pending) <= limit:
                out = list(pending)
                pending.clear()
            else:
                return [pending.popleft() for _ in range(limit)]
        else:
            out = []
        while not out:
            if not self._take(deadline, sink=out):
                return []
        # Without waiting, also take what had arrived by now, and no more: a
        # sender as fast as this reader must not keep the call from returning.
        for _ in range(len(self._inbox)):
            if len(out) >= limit:
                break
            self._take(0.0, sink=out)
        if max_messages is not None and len(out) > max_messages:
            pending.extendleft(reversed(out[max_messages:]))
            del out[max_messages:]
        if self._client.decode_responses:
            out = [(c.decode("utf-8"), d.decode("utf-8")) for c, d in out]
        return out

    # -- called by the I/O thread -----------------------------------------

    def _deliver(self, item: tuple) -> bool:
        """Returns False when the inbox is full: stop reading for now."""
        with self._cond:
            self._inbox.append(item)
            if item[0] == "data":
                self._inbox_bytes += len(item[2])
            self._cond.notify()
            for wake in self._wakers:
                wake()
            if self._inbox_bytes > self._client.max_inbox_bytes:
                self._conn.paused = True
                return False
            return True

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Unsubscribe from everything and close this connection."""
        if self._closed:
            return
        done = threading.Event()
        self._client._io.call("close_conn", self._conn, done)
        done.wait(5.0)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            for wake in self._wakers:
                wake()

    reset = close   # redis-py's name

    def has_ready(self) -> bool:
        """Is anything ready for get_message()/get_batch() without waiting?"""
        return bool(self._control or self._pending or self._dicts or self._inbox)

    def __enter__(self) -> PubSub:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _IOThread(threading.Thread):
    """Owns a Client's sockets.  Other threads hand it commands through a
    deque and wake it through a pipe; it never blocks on them."""

    def __init__(self, client: Client) -> None:
        super().__init__(name=f"fastbus-io-{client.name}", daemon=True)
        self.client = client
        self.commands: deque = deque()
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._conns: dict[zmq.Socket, _Conn] = {}
        self._poller = zmq.Poller()
        self._flush_waiters: dict[bytes, threading.Event] = {}
        self._flushes: deque = deque()    # (messages taken when done, event): flush() not yet sent
        self._taken = 0                   # messages the sender has taken from the publisher
        self._stats_waiters: deque = deque()
        self._tokens = itertools.count(1)
        self._stopping = False
        self._stopped = threading.Event()

    # other threads
    def wake(self) -> None:
        try:
            os.write(self._wfd, b"\x00")
        except BlockingIOError:
            pass   # the pipe is full: the thread is already awake
        except OSError:
            pass   # closed: the thread has stopped

    def call(self, *cmd) -> None:
        if self._stopped.is_set():
            raise ConnectionClosed("client is closed")
        self.commands.append(cmd)
        self.wake()

    def stop(self, timeout: float) -> None:
        self.call("stop")
        self.join(timeout)

    # the thread
    def run(self) -> None:
        self._poller.register(self._rfd, zmq.POLLIN)
        next_ping = time.monotonic() + self.client._ping_interval
        try:
            while not self._stopping:
                timeout = self._timeout(next_ping)
                for sock, _ev in self._poller.poll(timeout):
                    if sock == self._rfd:
                        try:
                            os.read(self._rfd, 4096)
                        except BlockingIOError:
                            pass
                    else:
                        conn = self._conns.get(sock)
                        if conn is not None:
                            self._drain(conn)
                while self.commands and not self._stopping:
                    self._command(*self.commands.popleft())
                self._send_due(force=bool(self._flushes))
                while self._flushes and self._flushes[0][0] <= self._taken:
                    # All the flush asked for is sent: a ping behind it comes
                    # back once the broker has it.
                    token = b"flush-%d" % next(self._tokens)
                    self._flush_waiters[token] = self._flushes.popleft()[1]
                    self._send(self.client._pub, [P.PING, token])
                now = time.monotonic()
                if now >= next_ping:
                    for conn in list(self._conns.values()):
                        self._send(conn, [P.PING, b""])
                    next_ping = now + self.client._ping_interval
        finally:
            self._shutdown()

    def _timeout(self, next_ping: float) -> int:
        if self.commands:
            return 0
        client = self.client
        if (self._flushes or client._publisher.has_sealed()) and not client._flow_paused:
            return 0
        now_ns = time.monotonic_ns()
        t = next_ping - now_ns / 1e9
        d = self.client._outbox.deadline_ns()
        if d is not None:
            t = min(t, (d - now_ns) / 1e9)
        return max(0, int(t * 1000 + 0.999))

    def _send(self, conn: _Conn, frames: list) -> None:
        if conn.sock is None:
            return
        try:
            conn.sock.send_multipart(frames, copy=False)
        except zmq.ZMQError as exc:
            log.warning("send to %s failed: %s", self.client.endpoint, exc)

    def _send_due(self, force: bool = False, final: bool = False) -> None:
        """Send due batches (all queued ones with ``force``), a bounded
        burst at a time: between bursts the loop reads the broker, so a
        pause (flow control) stops a backlog from going out all at once.
        While paused nothing is sent, except the ``final`` flush at close."""
        client = self.client
        if client._flow_paused and not final:
            return
        take = client._publisher.take
        for _ in range(1 << 62 if final else SEND_BURST):
            item = take(force)
            if item is None:
                break
            self._send(client._pub, [P.PUB, item[0]])
            self._taken += item[1]

    def _open(self, conn: _Conn) -> None:
        s = self.client._ctx.socket(zmq.DEALER)
        s.linger = 2000
        s.rcvhwm = 16                     # batches: back-pressure reaches the broker soon
        if conn.kind == "pub":
            # What is already sent when the broker asks to pause still
            # arrives: bound it (in batches, and a fixed kernel buffer), so
            # flow control holds with a slow-consumer limit well above the
            # pause threshold.  Beyond it, batches wait in the publisher's
            # own bounded buffer (max_buffer_bytes).
            s.sndhwm = 64
            s.sndbuf = 512 * 1024
        else:
            s.sndhwm = 1000
        if conn.kind == "sub":
            # A fixed kernel buffer too (loopback autotuning may grow one to
            # 32 MB): what a subscriber holds unread stays bounded, and a
            # stalled one shows up at the broker.
            s.rcvbuf = min(max(self.client.max_inbox_bytes // 4, 256 * 1024), 8 * 1024 * 1024)
        s.reconnect_ivl = 100
        s.reconnect_ivl_max = 2000
        # No ZMTP heartbeat timeout: a subscriber that pauses reading (full
        # inbox) must not be cut off as dead.  Broker restarts show in PONGs.
        s.tcp_keepalive = 1
        if self.client._curve:
            server, public, secret = self.client._curve
            s.curve_serverkey = server.encode()
            s.curve_publickey = public.encode()
            s.curve_secretkey = secret.encode()
        s.connect(self.client.endpoint)
        conn.sock = s
        self._conns[s] = conn
        self._poller.register(s, zmq.POLLIN)
        conn.polling = True
        self._hello(conn)

    def _hello(self, conn: _Conn) -> None:
        hello = {"v": P.VERSION, "role": "client", "pub": conn.kind == "pub", "name": self.client.name}
        self._send(conn, [P.HELLO, P.dump_json(hello)])
        if conn.kind == "sub" and conn.subs:
            # Stamped with the latest sequence: this snapshot is the state the
            # pubsub's own (un)subscriptions have reached.
            self._send(conn, [P.SUB, P.pack_u64(conn.seq),
                              P.encode_ops((SUBSCRIBE, k, p) for k, p in conn.subs)])

    def _resync(self, conn: _Conn, why: str) -> None:
        log.info("%s: resending to %s (%s)", self.client.name, self.client.endpoint, why)
        self._hello(conn)
        if conn.pubsub is not None:
            conn.pubsub._deliver(("reconnect", why.encode()))

    def _command(self, cmd: str, *args) -> None:
        if cmd == "open":
            self._open(args[0])
        elif cmd == "sub":
            conn, seq, ops = args
            conn.seq = seq
            for op, key, prefix in ops:
                if op == SUBSCRIBE:
                    conn.subs.add((key, prefix))
                else:
                    conn.subs.discard((key, prefix))
            self._send(conn, [P.SUB, P.pack_u64(seq), P.encode_ops(ops)])
        elif cmd == "flush":
            # Done when what is queued now has been taken and sent (the run
            # loop sends it, in bursts, respecting flow control).
            self._flushes.append((self._taken + self.client._publisher.queued, args[0]))
        elif cmd == "stats":
            self._stats_waiters.append(args[0])
            self._send(self.client._pub, [P.STATS])
        elif cmd == "close_conn":
            conn, done = args
            self._close_conn(conn)
            done.set()
        elif cmd == "resume":
            conn = args[0]
            if conn.sock is not None and not conn.polling:
                self._poller.register(conn.sock, zmq.POLLIN)
                conn.polling = True
                self._drain(conn)
        elif cmd == "stop":
            self._stopping = True

    def _close_conn(self, conn: _Conn) -> None:
        if conn.sock is None:
            return
        self._send(conn, [P.BYE])
        if conn.polling:
            self._poller.unregister(conn.sock)
            conn.polling = False
        del self._conns[conn.sock]
        conn.sock.close(linger=1000)
        conn.sock = None

    def _drain(self, conn: _Conn) -> None:
        sock = conn.sock
        for _ in range(1000):
            if conn.paused:
                # Stop polling it until the reader catches up ("resume").
                self._poller.unregister(sock)
                conn.polling = False
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                self._on_message(conn, frames)
            except (P.ProtocolError, ValueError) as exc:
                log.warning("%s: bad message from the broker: %s", self.client.name, exc)

    def _on_message(self, conn: _Conn, frames: list) -> None:
        cmd = frames[0].bytes
        ps = conn.pubsub
        if cmd == P.DATA and ps is not None and len(frames) == 3:
            ps._deliver(("data", P.unpack_u64(frames[1]), frames[2]))   # may pause the conn
        elif cmd == P.CONFIRM and ps is not None:
            ps._deliver(("confirm", P.unpack_u64(frames[1])))
        elif cmd == P.WANT and conn.kind == "pub" and len(frames) == 3:
            self._on_want(frames[1].bytes, frames[2])
        elif cmd == P.FLOW and conn.kind == "pub" and len(frames) == 2:
            paused = frames[1].bytes == P.FLOW_PAUSE
            if paused and not self.client._flow_paused:
                self.client._flow_pauses += 1
            self.client._flow_paused = paused
        elif cmd == P.GAP and ps is not None:
            ps._deliver(("gap", P.unpack_u64(frames[1])))
        elif cmd == P.WELCOME:
            if conn.kind == "pub":
                self.client._flow_paused = False     # a new session: the broker says again if not
            conn.instance = str(P.load_json(frames[1]).get("instance", "")).encode()
        elif cmd == P.PONG and len(frames) == 3:
            token, instance = frames[1].bytes, frames[2].bytes
            if conn.instance and instance != conn.instance:
                conn.instance = instance
                self._resync(conn, "broker restarted")
            ev = self._flush_waiters.pop(token, None)
            if ev is not None:
                ev.set()
        elif cmd == P.KICK:
            reason = P.load_json(frames[1]).get("reason", "")
            self._resync(conn, str(reason))
        elif cmd == P.PING:
            pass                     # the broker's liveness probe: nothing to answer
        elif cmd == P.STATS_REPLY:
            if self._stats_waiters:
                self._stats_waiters.popleft().put(P.load_json(frames[1], limit=16 << 20))
        else:
            raise P.ProtocolError(f"unexpected {cmd!r}")

    def _on_want(self, flags: bytes, frame) -> None:
        """The broker's view of what subscribers want (publisher filter)."""
        ops = P.decode_ops(frame)
        client = self.client
        if flags and flags[0] & P.WANT_RESET:
            t = Trie()
            for op, key, prefix in ops:
                if op == SUBSCRIBE:
                    t.add(key, 0, prefix=prefix)
            client._wanted = t
            return
        t = client._wanted
        if t is None:
            return          # a diff before any snapshot: keep sending everything
        for op, key, prefix in ops:
            if op == SUBSCRIBE:
                t.add(key, 0, prefix=prefix)
            else:
                try:
                    t.remove(key, 0, prefix=prefix)
                except KeyError:
                    pass

    def _shutdown(self) -> None:
        self._send_due(force=True, final=True)
        for conn in list(self._conns.values()):
            self._close_conn(conn)
        for ev in self._flush_waiters.values():
            ev.set()
        for _n, ev in self._flushes:
            ev.set()
        self._stopped.set()
        os.close(self._rfd)
        os.close(self._wfd)
