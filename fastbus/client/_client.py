"""The publishing side of a client: ``Client`` and its publishing session."""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypedDict

import zmq

from fastbus import protocol as P
from fastbus._core import SUBSCRIBE, Outbox, Publisher, Trie
from fastbus._types import ChannelT, EncodableT
from fastbus.client import _engine
from fastbus.client._endpoint import AbsenceProbe, check_endpoint
from fastbus.client._keeper import Keeper
from fastbus.client._keys import to_key
from fastbus.client._session import SEND_BURST, Session, driving
from fastbus.errors import BrokerTimeout, ConnectionClosed, FlushTimeout, KeyRefused, MessagesRejected

if TYPE_CHECKING:
    from fastbus.client._pubsub import PubSub

log = logging.getLogger("fastbus.client")


class ClientStats(TypedDict):
    """``Client.stats()``: this client's counters."""
    published: int          #: messages queued by publish() (sent or to be sent)
    filtered: int           #: not sent: nobody wanted their channel
    queued: int             #: waiting to be sent
    queued_bytes: int       #: bytes of those
    filter_active: bool     #: is publish() dropping what no subscriber wants now (the broker's view, under its lease)?
    flow_paused: bool       #: has the broker asked publishers to pause (a subscriber is behind)?
    flow_pauses: int        #: how many times it did
    rejected: int           #: messages the broker dropped (over its limits; flush() raises MessagesRejected)
    unfiltered: int         #: sent although the filter would have dropped them: its lease had run out

#: A publish() that starts a batch sends it at once from the publishing
#: thread unless the publisher is in a burst: BURST_LIMIT batches already
#: left that way, each within BURST_GAP seconds of the one before.  Then the
#: keeper sends what gathered by the time it runs (see Publisher).
BURST_GAP = 20e-6
BURST_LIMIT = 4
#: While the broker's pipe is full, the keeper retries at least this often.
BLOCKED_BACKSTOP = 0.001
class _Flush:
    __slots__ = ("target", "token", "pinged")

    def __init__(self, target: int, token: bytes) -> None:
        self.target = target          # messages sent when everything queued at the call is sent
        self.token = token
        self.pinged = False


#: A lease that never ends (a broker that grants none: its view counts as it is).
FOREVER = 2 ** 64 - 1
#: Pings whose send times a publishing session remembers (their PONGs come
#: back in order, each a lease from when its ping left).
PINGS_KEPT = 256


class PubSession(Session):
    """The connection a client publishes on: its publisher, the broker's
    filter of what subscribers want, flow control, flush and stats.

    The filter is the broker's view (WANT), applied and acknowledged (ACK)
    as it arrives, and it counts only under the broker's lease: from when a
    ping (or HELLO) left to that plus the lease its PONG (or WELCOME)
    grants, for docs/PROTOCOL.md's contract ("confirmed means in effect
    everywhere"): the broker confirms a subscription once this session
    acknowledged it, or once every lease granted before has run out.  The
    publisher asks for a renewal (``renew_lease``) while its filter is in
    use; a lease that ran out makes it send what it would have dropped.

    Batches a burst leaves in the outbox are sent by a native thread
    (``engine``, a ``_engine.Sender``) the moment the burst stops, without
    waiting for the interpreter lock; what it does not send (a full socket,
    a FLOW pause, control frames or sealed batches first) it hands back to
    the keeper.  An event loop's session has none: the loop sends."""

    kind = "pub"
    acks = True
    _tokens = itertools.count(1)

    def __init__(self, client: Client, publisher: Publisher, linger: float) -> None:
        self.engine: _engine.Sender | None = None     # (open() starts it)
        self._skipped = False
        super().__init__(client)
        self.publisher = publisher
        self.linger_ns = int(linger * 1e9)
        self._flow_paused = False
        self.flow_pauses = 0
        self._sent = 0                    # messages sent to the broker from Python
        self.pongs: set[bytes] = set()    # flush tokens the broker answered
        self.stats_replies: list[dict] = []
        self.rejected = 0                 # messages the broker said it dropped (NOTICE)
        self.notice: MessagesRejected | None = None   # raised by the next flush()
        self._pings: deque[tuple[bytes, int]] = deque(maxlen=PINGS_KEPT)   # (token, sent ns), oldest first
        self._hellos: deque[int] = deque(maxlen=PINGS_KEPT)                # HELLOs not yet welcomed: sent ns
        self.applied = 0                  # the latest WANT applied (its seq)...
        self.acked = 0                    # ...and the latest acknowledged
        self.ack_until_ns = 0             # ACK what we apply until then (see on_message)
        publisher.renew = self.renew_lease

    def open(self) -> None:
        super().open()
        if self.engine is None and not self.client.driven_by_loop and _engine.available():
            self.engine = _engine.Sender(self.publisher, self.lock, self.sock, self.client._keeper.wake_fd,
                                         linger=self.linger_ns / 1e9, command=P.PUB)
            self.publisher.wake = self.engine.wake

    def close(self) -> None:
        if self.engine is not None:
            # Before the socket closes; it leaves the lock we hold alone
            # (it looks whether to stop while it waits for it).
            self.engine.stop()
            self.engine = None
            self.publisher.wake = self.client._keeper.wake
        super().close()

    @property
    def sent(self) -> int:
        """Messages sent to the broker."""
        return self._sent + (self.engine.sent_messages if self.engine is not None else 0)

    @property
    def flow_paused(self) -> bool:
        """Has the broker asked publishers to pause?"""
        return self._flow_paused

    @flow_paused.setter
    def flow_paused(self, paused: bool) -> None:
        self._flow_paused = paused
        if self.engine is not None:
            self.engine.paused = paused

    @property
    def keeper_skipped(self) -> bool:
        return self._skipped or (self.engine is not None and self.engine.owner_skipped)

    @keeper_skipped.setter
    def keeper_skipped(self, value: bool) -> None:
        # The native sender may be the holder the keeper found: it wakes
        # the keeper when it lets go.
        self._skipped = value
        if self.engine is not None:
            self.engine.owner_skipped = value

    def send(self, frames: list) -> bool:
        sent = super().send(frames)
        if not sent and self.engine is not None and self.outq:
            self.engine.owner_first = True
        return sent

    def flush_outq(self) -> None:
        super().flush_outq()
        if self.engine is not None and not self.outq:
            self.engine.owner_first = False

    def configure(self, s: zmq.Socket) -> None:
        # What is already sent when the broker asks to pause still arrives:
        # bound it (in batches, and a fixed kernel buffer), so flow control
        # holds with a slow-consumer limit well above the pause threshold.
        # Beyond it, batches wait in the publisher's own bounded buffer
        # (max_buffer_bytes).
        s.sndhwm = 16
        s.sndbuf = 512 * 1024

    # -- sending ----------------------------------------------------------------

    def send_now(self, full: bool) -> None:
        """The publisher's call, in the publishing thread: a batch may leave
        now (``full``: it is full).  Sent here if the socket is free, else
        by whoever holds it or by the keeper."""
        if self.flow_paused:
            return                        # FLOW resume sends it
        if not self.lock.acquire(False):
            self.publisher.wake()         # the native sender (else the keeper) sends it
            return
        try:
            self.pump(busy=full)
        finally:
            self.release()

    def pump(self, force: bool = True, busy: bool = True, final: bool = False) -> int:
        """Send queued batches, at most SEND_BURST (all with ``final``, even
        while paused); returns how many were sent.  ``busy``: tell the
        publisher it is not idle (see Publisher.sent)."""
        if self.flow_paused and not final:
            return 0
        pub = self.publisher
        n = 0
        while final or n < SEND_BURST:
            item = pub.take(force)
            if item is None:
                break
            batch, count = item
            if not self.send_data([P.PUB, batch]):
                pub.put_back(batch, count)
                self.blocked = True
                break
            self.blocked = False
            n += 1
            self._sent += count
        if n:
            pub.sent(busy)
        return n

    def block_reason(self) -> str:
        """Why publish() timed out on a full buffer (PublishTimeout's text)."""
        if self.flow_paused:
            return "the broker asked publishers to pause (a subscriber is behind)"
        return f"the broker at {self.client.endpoint} is not taking them"

    def take_notice(self) -> MessagesRejected | None:
        """The broker's notice of dropped messages since the last call (a
        completed flush raises it), or None."""
        notice, self.notice = self.notice, None
        return notice

    def linger_over(self) -> bool:
        """May a partial batch leave now (no linger, or the linger passed)?"""
        return not self.linger_ns or time.monotonic_ns() >= self.publisher.last_send_ns + self.linger_ns

    def serve(self, now: float) -> None:
        if self.outq:
            self.flush_outq()
        if self.keeper_sends():
            self.pump(force=self.linger_over())
        self.read()
        self.tick(now)

    def keeper_sends(self) -> bool:
        """Must the keeper send batches now (no native sender, or it handed
        them back: the socket was full, sealed batches wait)?"""
        eng = self.engine
        return eng is None or eng.take_handed() or self.blocked or self.publisher.has_sealed()

    def due_in(self, now: float) -> float | None:
        due = super().due_in(now)
        pub = self.publisher
        if pub.queued and not self.flow_paused and \
                (self.engine is None or self.blocked or pub.has_sealed()):
            if self.blocked:
                # The broker is not taking batches (its pipe is full): the
                # socket's FD says when it has room, unless another thread
                # took that notice in; then this backstop.  Only under
                # back-pressure, never what a message on an idle client waits for.
                wait = BLOCKED_BACKSTOP
            elif self.linger_ns and not pub.has_sealed():
                wait = max(0.0, (pub.last_send_ns + self.linger_ns - time.monotonic_ns()) / 1e9)
            else:
                wait = 0.0
            due = wait if due is None else min(due, wait)
        return due

    # -- flush and stats (the lock held by the waiting thread) ------------------

    def start_flush(self) -> _Flush:
        return _Flush(self.sent + self.publisher.queued, b"flush-%d" % next(self._tokens))

    def flush_step(self, f: _Flush) -> bool:
        """Advance a flush; True when the broker has everything it covers."""
        if self.sent < f.target:
            self.pump()
            if self.sent < f.target:
                return False
        if not f.pinged:
            # Behind the batches: its PONG comes back once the broker has them.
            self.ping(f.token)
            f.pinged = True
        if f.token in self.pongs:
            self.pongs.discard(f.token)
            return True
        return False

    # -- input ------------------------------------------------------------------

    def on_message(self, cmd: bytes, frames: list) -> None:
        if cmd == P.WANT and len(frames) in (3, 4):
            self.on_want(frames[1], frames[2])
            if len(frames) == 4:
                # Applied: the broker may confirm what it added.  Said
                # while a lease of ours may run, as the broker sees it (it
                # does not wait for a publisher without one; a new lease
                # says it, _grant): till twice the lease after we asked.
                self.applied = P.unpack_u64(frames[3])
                if time.monotonic_ns() < self.ack_until_ns:
                    self._ack()
        elif cmd == P.FLOW and len(frames) == 2:
            paused = frames[1] == P.FLOW_PAUSE
            if paused and not self.flow_paused:
                self.flow_pauses += 1
            self.flow_paused = paused
            if not paused:
                self.pump(force=self.linger_over())
        elif cmd == P.STATS_REPLY and len(frames) == 2:
            self.stats_replies.append(P.load_json(frames[1], limit=16 << 20))
        elif cmd == P.NOTICE and len(frames) == 2:
            info = P.load_json(frames[1])
            n = info.get("dropped")
            n = n if isinstance(n, int) and n > 0 else 0
            reason = str(info.get("reason", ""))[:500]
            self.rejected += n
            earlier = self.notice.count if self.notice is not None else 0
            self.notice = MessagesRejected(f"the broker at {self.client.endpoint} dropped {earlier + n} messages "
                                           f"of this client: {reason}", earlier + n)
            log.warning("%s: the broker at %s: %s", self.client.name, self.client.endpoint, reason)
        else:
            super().on_message(cmd, frames)

    def on_welcome(self) -> None:
        self.flow_paused = False          # a new session: the broker says again if not
        # What the broker accepts: publish() refuses a message over it at once.
        pub = self.publisher
        pub.max_payload = self.limit("max_payload")
        pub.max_topic = self.limit("max_topic")
        # The answer to our oldest HELLO in flight (or a later one): its
        # lease counts from the oldest, never longer than granted.
        sent = self._hellos[0] if self._hellos else 0
        self._hellos.clear()
        lease = self.welcome.get("lease_us")
        if isinstance(lease, int) and not isinstance(lease, bool) and lease >= 0:
            pub.lease_until_ns = 0
            if sent:
                self._grant(sent, lease)
        else:
            # A broker that grants no lease does not wait for us either.
            pub.lease_until_ns = pub.renew_at_ns = FOREVER

    def on_pong(self, token: bytes, lease_us: int | None) -> None:
        if token.startswith(b"flush-"):
            self.pongs.add(token)
        pings = self._pings
        while pings:                     # PONGs come in the order of the pings
            t, sent = pings.popleft()
            if t == token:
                if lease_us is not None:
                    self._grant(sent, lease_us)
                return

    def _grant(self, sent_ns: int, lease_us: int) -> None:
        """The broker answered what we sent at ``sent_ns`` with a lease."""
        pub = self.publisher
        usable = int(lease_us * 1000 * P.LEASE_USE)
        until = sent_ns + usable
        if until > pub.lease_until_ns:
            pub.lease_until_ns = until
            pub.renew_at_ns = sent_ns + usable // 2      # renewed while the filter is in use
            pub.renew_asked = False
        self.ack_until_ns = max(self.ack_until_ns, sent_ns + 2 * lease_us * 1000)
        if self.applied > self.acked:
            self._ack()                   # what we applied while we did not filter

    def _ack(self) -> None:
        self.acked = self.applied
        self.send([P.ACK, P.pack_u64(self.applied)])

    def ping(self, token: bytes = b"", lease: bool = False) -> None:
        # Its send time before it leaves: a lease counts from no later.
        self._pings.append((token, time.monotonic_ns()))
        super().ping(token, lease)

    def hello(self) -> None:
        pub = self.publisher
        pub.wanted = None                 # a new session: everything, until its WANT reset
        pub.renew_asked = False
        self.applied = self.acked = 0     # a new session numbers its WANTs anew
        self._hellos.append(time.monotonic_ns())
        super().hello()

    def renew_lease(self) -> None:
        """The publisher's call (see Publisher): its filter is in use and
        its lease ends soon, or has ended.  A ping renews it."""
        self.post(lambda: self.ping(b"lease", lease=True))

    def filtering(self) -> bool:
        """Does the publisher drop what nobody wants now: a view from the
        broker, under a lease that has not run out?  Asking renews a lease
        that has."""
        pub = self.publisher
        if pub.filters():
            return True
        if pub.wanted is not None and not pub.renew_asked:
            pub.renew_asked = True
            self.renew_lease()
        return False

    def on_want(self, flags: bytes, frame) -> None:
        """The broker's view of what subscribers want (publisher filter)."""
        ops = P.decode_ops(frame)
        pub = self.publisher
        if flags and flags[0] & P.WANT_RESET:
            t = Trie()
            for op, key, prefix in ops:
                if op == SUBSCRIBE:
                    t.add(key, 0, prefix=prefix)
            pub.wanted = t
            return
        t = pub.wanted
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

    def close_final(self, timeout: float) -> None:
        """At close: send what is left even while paused (blocking up to
        ``timeout``), then say goodbye."""
        if self.sock is not None:
            self.sock.sndtimeo = max(1, int(timeout * 1000))
            pub = self.publisher
            while (item := pub.take(True)) is not None:
                try:
                    self.sock.send_multipart([P.PUB, item[0]])
                    self._sent += item[1]
                except zmq.ZMQError as exc:
                    log.warning("%s: %d messages not sent at close: %s", self.client.name,
                                item[1] + pub.queued, exc)
                    break
        self.close()


class Client:
    """A connection to a fastbus broker (``tcp://host:port``, or
    ``endpoint=`` for ipc:// and inproc://).

    **Publishing** is buffered and batched, with no timer: a message
    published while the client is idle leaves at once, from the calling
    thread; messages published back to back (a burst) gather into a batch
    that the client's keeper thread sends as soon as it runs, and a batch
    that fills (``max_messages`` records or ``max_bytes`` bytes) leaves at
    once.  ``max_delay`` (seconds; default None: no linger) is an optional
    linger for larger batches under load: then a batch waits until
    ``max_delay`` after the previous one (or until full), while a message
    on an idle client still leaves at once.

    At most ``max_buffer_bytes`` wait to be sent; then ``publish()`` blocks
    until there is room, up to ``block_timeout`` seconds (None: no limit),
    and raises :class:`PublishTimeout`.  The buffer fills when the broker is
    unreachable, or when it asks publishers to pause because a subscriber
    fell behind (flow control, see ``BrokerConfig.flow_pause_bytes``).

    **Receiving** (:meth:`pubsub`): a thread in ``get_message()``,
    ``get_batch()`` or ``listen()`` reads the PubSub's connection itself, so
    a message reaches it without a hand-over between threads.  While nobody
    reads, a native thread (no interpreter lock) takes what arrives, up to
    ``max_inbox_bytes`` of received batches (and as much again already
    handed to Python, not yet returned); beyond that the client stops
    reading, so a subscriber that falls behind pushes back on the broker
    (which then pauses publishers, drops its oldest messages with a ``gap``
    notice, or disconnects it, as configured) instead of growing without
    bound.  ``decode_responses=True`` gives str channels and payloads.

    **Subscribing** returns once the subscription is in effect: from then
    on every message any client publishes reaches the subscriber.  With no
    broker to answer, ``subscribe()`` raises :class:`BrokerUnavailable`
    within ``socket_connect_timeout`` seconds (sooner, about a second, when
    nothing listens at the address); a broker that answered but does not
    confirm within ``subscribe_timeout`` (None: no limit) gives
    :class:`BrokerTimeout`.

    CURVE: pass the broker's public key and this client's key pair (Z85
    strings).
    """

    #: Hook for a twin that an event loop drives (:mod:`fastbus.aio` sets it
    #: True): every starting batch is handed to the publisher's ``send_now``
    #: (no bursts counted), and ``publish`` stays the class's method instead
    #: of becoming the publisher's C method (the twin's is a coroutine).
    driven_by_loop: bool = False

    def __init__(self, host: str = "127.0.0.1", port: int = P.DEFAULT_PORT, *, endpoint: str | None = None,
                 decode_responses: bool = False, max_messages: int = 1000, max_bytes: int = 64 * 1024,
                 max_delay: float | None = None, curve_server_key: str | None = None,
                 curve_public_key: str | None = None, curve_secret_key: str | None = None,
                 name: str | None = None, context: zmq.Context | None = None,
                 ping_interval: float = 1.0, max_inbox_bytes: int = 8 * 1024 * 1024,
                 max_buffer_bytes: int = 8 * 1024 * 1024, block_timeout: float | None = 60.0,
                 health_check_interval: float = 0, socket_connect_timeout: float = 5.0,
                 subscribe_timeout: float | None = 10.0) -> None:
        if health_check_interval:
            # redis-py's name: how often the connection's health is checked.
            # Here every connection pings its broker every ping_interval
            # seconds anyway; a health_check_interval sets that period.
            ping_interval = health_check_interval
        if max_delay is not None and not 0 <= max_delay <= 10:
            raise ValueError(f"max_delay must be None (no linger) or between 0 and 10 seconds, not {max_delay!r}")
        if not 0 < ping_interval <= 60:
            raise ValueError(f"ping_interval must be between 0 and 60 seconds, not {ping_interval!r}")
        if max_inbox_bytes <= 0:
            raise ValueError(f"max_inbox_bytes must be positive, not {max_inbox_bytes!r}")
        if max_buffer_bytes <= 0:
            raise ValueError(f"max_buffer_bytes must be positive, not {max_buffer_bytes!r}")
        if max_messages <= 0 or max_bytes <= 0:
            raise ValueError("max_messages and max_bytes must be positive")
        if block_timeout is not None and block_timeout < 0:
            raise ValueError("block_timeout must be >= 0 seconds, or None to wait for ever")
        if not 0 < socket_connect_timeout <= 3600:
            raise ValueError(f"socket_connect_timeout must be between 0 and 3600 seconds, "
                             f"not {socket_connect_timeout!r}")
        if subscribe_timeout is not None and not 0 < subscribe_timeout <= 3600:
            raise ValueError(f"subscribe_timeout must be None (no limit) or between 0 and 3600 seconds, "
                             f"not {subscribe_timeout!r}")
        if (curve_server_key is None) != (curve_secret_key is None) or \
                (curve_public_key is None) != (curve_secret_key is None):
            raise ValueError("CURVE needs curve_server_key, curve_public_key and curve_secret_key together")
        self.max_inbox_bytes = max_inbox_bytes
        self.socket_connect_timeout = socket_connect_timeout
        self.subscribe_timeout = subscribe_timeout
        self.endpoint = check_endpoint(endpoint or f"tcp://{host}:{int(port)}")
        self.decode_responses = decode_responses
        self.name = name or f"client-{os.getpid()}-{id(self):x}"
        self.max_delay = max_delay or None
        self._curve = (curve_server_key, curve_public_key, curve_secret_key) if curve_secret_key else None
        self._ctx = context or zmq.Context.instance()
        self._ping_interval = ping_interval
        self._closed = False
        self._pubsubs: list = []
        self._keeper = Keeper(self)
        self._outbox = Outbox(max_messages=max_messages, max_bytes=max_bytes, max_delay=None)
        gap, limit = self._burst_rule()
        self._publisher = Publisher(self._outbox, self._keeper.wake, burst_gap=gap, burst_limit=limit,
                                    max_buffer_bytes=max_buffer_bytes, block_timeout=block_timeout,
                                    block_reason=lambda: self._pub.block_reason(), closed_error=ConnectionClosed)
        self._pub = PubSession(self, self._publisher, self.max_delay or 0.0)
        self._publisher.send_now = self._pub.send_now
        self._open(self._pub)
        self._keeper.start()
        if not self.driven_by_loop:
            self.publish = self._publisher.publish     # the hot path: one C call

    def _burst_rule(self) -> tuple[float, int]:
        """(burst_gap, burst_limit) of the publisher (see Publisher): driven
        by a loop, a starting batch is always handed to send_now (it leaves
        when the running task yields: the loop's turn is the batch); with a
        linger, one batch per linger; else bursts as BURST_GAP/BURST_LIMIT."""
        if self.driven_by_loop:
            return 0.0, 1
        return (self.max_delay, 1) if self.max_delay else (BURST_GAP, BURST_LIMIT)

    def _open(self, session: Session) -> None:
        with session.lock:
            session.open()
        self._keeper.add(session)

    # -- publishing --------------------------------------------------------

    def publish(self, channel: ChannelT, message: EncodableT) -> int:  # replaced per instance by Publisher.publish
        """Queue a message; returns 1, or 0 when no subscriber wants its
        channel (the broker said so), in which case it is not sent."""
        return self._publisher.publish(channel, message)

    def publish_many(self, messages: Iterable[tuple[ChannelT, EncodableT]]) -> int:
        """Queue many ``(channel, message)`` pairs; returns how many were
        queued (the others nobody wanted)."""
        publish = self._publisher.publish
        return sum([publish(channel, message) for channel, message in messages])

    def ping(self, timeout: float | None = 10.0) -> bool:
        """As redis-py's: True once the broker answered a round trip (the
        one flush() makes: what this client queued is sent first).  The
        errors of flush(): FlushTimeout, BrokerUnavailable, ..."""
        self.flush(timeout)
        return True

    def is_wanted(self, channel: ChannelT) -> bool:
        """Would publish() send this channel?  True until the broker has told
        this client what its subscribers want, then whether anyone does (and
        True again while that view's lease has run out, until renewed)."""
        wanted = self._publisher.wanted
        if wanted is None or not self._pub.filtering():
            return True
        return wanted.any_match(to_key(channel))

    def flush(self, timeout: float | None = 10.0) -> None:
        """Send everything queued and wait until the broker has it (a ping
        that follows the batches comes back).  FlushTimeout (a TimeoutError)
        if it does not within ``timeout`` seconds (the messages stay queued
        for sending); BrokerUnavailable (also a TimeoutError) sooner, after
        about a second, if this client never reached its broker and nothing
        listens at its address; MessagesRejected if the broker dropped
        messages of this client since the last flush (over its size limits,
        which publish() checks itself once the broker has said them)."""
        if self._closed:
            raise ConnectionClosed("client is closed")
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        s = self._pub
        probe = None if timeout is None else AbsenceProbe(self.endpoint, start)
        with driving([s], deadline) as held:
            if held:
                f = s.start_flush()
                while not s.flush_step(f):
                    if deadline is not None and time.monotonic() >= deadline:
                        break
                    if probe is not None:
                        probe.check_handshake(s)
                        probe.check(s, self._publisher.queued)
                    s.wait(deadline if probe is None else probe.wake_by(s, deadline))
                    s.read()
                else:
                    notice = s.take_notice()
                    if notice is not None:
                        raise notice
                    return
        queued = self._publisher.queued
        raise FlushTimeout(f"the broker at {self.endpoint} did not confirm the flush within {timeout:g} s "
                           f"({queued} message(s) stay queued for it)", queued)

    # -- subscribing -------------------------------------------------------

    def pubsub(self, ignore_subscribe_messages: bool = False) -> PubSub:
        """A new subscriber with its own connection."""
        from fastbus.client._pubsub import PubSub
        if self._closed:
            raise ConnectionClosed("client is closed")
        return PubSub(self, ignore_subscribe_messages=ignore_subscribe_messages)

    # -- information -------------------------------------------------------

    def stats(self) -> ClientStats:
        """This client's counters: published, filtered (not sent: nobody
        wanted them), queued, rejected (the broker dropped them: over its
        limits; flush() raises MessagesRejected for them)."""
        pub = self._publisher
        return {"published": pub.accepted, "filtered": pub.refused,
                "queued": pub.queued, "queued_bytes": pub.buffered_bytes,
                "filter_active": self._pub.filtering(), "flow_paused": self._pub.flow_paused,
                "flow_pauses": self._pub.flow_pauses, "rejected": self._pub.rejected,
                "unfiltered": pub.lapsed}

    def broker_stats(self, timeout: float = 5.0) -> dict[str, Any]:
        """The broker's counters (see ``fastbus stats``)."""
        if self._closed:
            raise ConnectionClosed("client is closed")
        deadline = time.monotonic() + timeout
        s = self._pub
        with driving([s], deadline) as held:
            if held:
                s.stats_replies.clear()
                s.send([P.STATS])
                while time.monotonic() < deadline:
                    s.read()
                    if s.stats_replies:
                        return s.stats_replies.pop(0)
                    s.wait(deadline)
        raise BrokerTimeout(f"no answer from the broker at {self.endpoint} within {timeout:g} s", self.endpoint)

    # -- hooks for the asyncio twin (fastbus.aio) and other drivers -----------

    @property
    def closed(self) -> bool:
        """Has close() (or shutdown()) run?"""
        return self._closed

    @property
    def session(self) -> PubSession:
        """The connection this client publishes on.  Its ``fd``, ``lock``,
        ``serve()`` and ``due_in()`` let an event loop drive it instead of the
        keeper thread (as :mod:`fastbus.aio` does); ``publisher`` is its
        C publisher.  Not needed by applications."""
        return self._pub

    # -- lifecycle ---------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Flush (waiting up to ``timeout`` for the broker), then close every
        connection of this client, its PubSubs included."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        except (TimeoutError, ConnectionClosed, KeyRefused) as exc:
            log.warning("closing %s with messages the broker did not confirm: %s", self.name, exc)
        self.shutdown(timeout)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Close every connection of this client, its PubSubs included,
        without waiting for the broker to confirm what was sent (close() is
        flush() then this): what is queued is sent in the time left, at most
        ``timeout`` seconds."""
        if self._closed:
            return
        self._closed = True
        self._publisher.closed = True
        self._keeper.stop(timeout)
        for ps in list(self._pubsubs):
            ps.shutdown(timeout)
        s = self._pub
        if s.lock.acquire(timeout=timeout):
            try:
                s.close_final(timeout)
            finally:
                s.lock.release()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self._keeper.stop(1.0)
            except Exception:
                pass
