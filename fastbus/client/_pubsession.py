"""A client's publishing connection: ``PubSession``.

Its publisher (the C ``Publisher``: outbox, buffer, filter), the broker's
view of what subscribers want (WANT, acknowledged under a lease), flow
control, flush and the counters behind ``Client.stats()``.  The native
sender (``_engine.Sender``) sends what a burst leaves while no Python thread
runs.  It knows its owner's ``Connections`` and options, not the Client.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque

import zmq

from fastbus import protocol as P
from fastbus._publisher import Publisher
from fastbus.client import _engine
from fastbus.client._connections import Connections
from fastbus.client._session import SEND_BURST, Session
from fastbus.errors import MessagesRejected

log = logging.getLogger("fastbus.client")

#: While the broker's pipe is full, the keeper retries at least this often.
BLOCKED_BACKSTOP = 0.001


class _Flush:
    __slots__ = ("target", "token", "pinged", "counted")

    def __init__(self, target: int, token: bytes) -> None:
        self.target = target          # messages sent when everything queued at the call is sent
        self.token = token
        self.pinged = False
        self.counted = 0              # what the connection counted when the ping went (resend)


#: What the publishing session's native reader queues for the keeper at
#: most (the broker's answers and notices; a stats reply may exceed it).
PUB_READER_BYTES = 1 << 20
#: A lease that never ends (a broker that grants none: its view counts as it is).
FOREVER = 2 ** 64 - 1
#: HELLOs whose send times a publishing session remembers (the WELCOME
#: grants a lease from the oldest).
HELLOS_KEPT = 256


class PubSession(Session):
    """The connection a client publishes on: its publisher, the broker's
    filter of what subscribers want, flow control, flush and stats.

    The filter is the broker's view (WANT), applied and acknowledged (ACK)
    as it arrives (by the native reader, without waiting for a Python
    thread; csrc/fb_view.h), and it counts only under the broker's lease: from when a
    ping (or HELLO) left to that plus the lease its PONG (or WELCOME)
    grants, for docs/PROTOCOL.md's contract ("confirmed means in effect
    everywhere"): the broker confirms a subscription once this session
    acknowledged it, or once every lease granted before has run out.  The
    publisher asks for a renewal (``renew_lease``) while its filter is in
    use; a lease that ran out makes it send what it would have dropped.
    The renewal's ping carries its send time in its token (``LEASE_TOKEN``),
    so whoever reads the PONG can apply the lease: with the engine, the
    native sender sends it and the native reader applies it, and a
    publisher busy in Python keeps its lease without any Python thread.

    An idle publisher's batch (and a full one) leaves from the publishing
    thread, in C: the publisher's ``send_now`` is the engine's, which sends
    if the connection is free, else leaves it to the engine's thread (this
    class's ``send_now`` and ``pump`` do it in Python without the engine,
    and for what is handed back).  Batches a burst leaves in the outbox are
    sent by a native thread (``engine``, a ``_engine.Sender``) the moment
    the burst stops, without waiting for the interpreter lock.  It reads what the broker says
    between its batches (through the native reader), so a FLOW pause stops
    it after one batch, and the resume, read by whichever thread reads it
    first, starts it again.  What it does not send (a full socket, control
    frames first) it hands back to the keeper, or to the event loop that
    drives the session.  (An asyncio client's loop sends each turn's batch;
    its sender sends what a full socket refused, as room comes.)"""

    kind = "pub"
    acks = True
    _tokens = itertools.count(1)

    def __init__(self, conns: Connections, publisher: Publisher) -> None:
        self.engine: _engine.Sender | None = None     # (open() starts it)
        self._skipped = False
        super().__init__(conns)
        self.publisher = publisher
        self.linger_ns = int((self.options.max_delay or 0.0) * 1e9)
        self._flow_pauses = 0             # pauses the reactions of closed connections counted
        self._sent = 0                    # messages sent to the broker: from Python, and by engines stopped
        self.pongs: set[bytes] = set()    # flush tokens the broker answered
        self.stats_replies: list[dict] = []
        self.rejected = 0                 # messages the broker said it dropped (NOTICE)
        self.unacknowledged_lost = 0      # messages sent to a broker that lost the session before taking them
        self.notice: MessagesRejected | None = None   # raised by the next flush()
        self._hellos: deque[int] = deque(maxlen=HELLOS_KEPT)    # HELLOs not yet welcomed: sent ns
        publisher.renew = self.renew_lease
        # Until the broker's WELCOME says its limits: what any broker's frame
        # can carry (a larger message would close the connection, silently).
        publisher.max_payload = P.MAX_PAYLOAD_UNWELCOMED

    def make_reactions(self, sock: object) -> _engine.Reactions:
        """The session's (Session.make_reactions), and a publisher's: a
        FLOW pause stops publishing (the native sender's flag, once it
        runs: flow_to) and a resume starts it again, a WANT goes into the
        publisher's view and is acknowledged, and so does the lease a PONG
        to a lease ping grants."""
        return _engine.Reactions(sock, flow=(P.FLOW, P.FLOW_PAUSE, P.WELCOME), view_of=self.publisher,
                                 want_command=P.WANT, ack_command=P.ACK, lease_pong=(P.PONG, P.LEASE_TOKEN),
                                 lease_ask=P.LEASE_ASK, ping=(P.PING, P.PONG, self.options.ping_interval),
                                 took_command=P.TOOK)

    def open_native(self) -> None:
        """The native sender and reader.  The sender sends what a burst
        leaves while the publishing thread does something else (for an
        event loop's session, what a full socket refused).  The reader
        reads what the broker says while no Python thread can, and applies
        the session's reactions to it (make_reactions: the sender reads
        through it between batches, so a FLOW pause stops it after one);
        it pings the broker; the rest it hands to the keeper (or the loop)
        through their descriptor."""
        owner_fd = self.native_owner_fd()
        if owner_fd is None:
            return                        # (a loop's session: the keeper serves it until the loop drives it)
        if self.engine is None:
            self.engine = _engine.Sender(self.publisher, self.lock, self.sock, owner_fd,
                                         linger=self.linger_ns / 1e9, command=P.PUB,
                                         reactions=self.reactions)
            self.publisher.wake = self.engine.wake
            self.publisher.renew = self.engine.wake     # it sends the lease ping asked for
            if not self.conns.driven_by_loop:
                # The publishing thread sends an idle publisher's batch in
                # C (no Python frame per batch); a loop's is its turn's.
                self.publisher.send_now = self.engine.send_now
        self.reactions.flow_to(self.engine)
        if self.reader is None:
            self.adopt_reader(_engine.Reader(self.lock, self.sock, owner_fd, PUB_READER_BYTES, P.DATA,
                                             reactions=self.reactions, sender=self.engine))

    def close(self) -> None:
        if self.reader is not None:
            self.reader.stop()            # before the sender it pauses, and the socket (the lock
                                          # we hold: the sender stops reading through it)
            self.reader = None
        if self.reactions is not None:
            self._flow_pauses += self.reactions.flow_pauses
            self.reactions.flow_to(None)
        if self.engine is not None:
            # Before the socket closes; it leaves the lock we hold alone
            # (it looks whether to stop while it waits for it).
            self.engine.stop()
            self._sent += self.engine.sent_messages + self.engine.inline_messages
            self.engine = None
            self.publisher.wake = self._keeper.wake
            self.publisher.renew = self.renew_lease
            if not self.conns.driven_by_loop:
                self.publisher.send_now = self.send_now
        super().close()

    @property
    def sent(self) -> int:
        """Messages sent to the broker."""
        eng = self.engine
        return self._sent + (eng.sent_messages + eng.inline_messages if eng is not None else 0)

    @property
    def flow_paused(self) -> bool:
        """Has the broker asked publishers to pause?  The flag the
        reactions set for the broker's latest FLOW (or WELCOME), whichever
        thread read it: the native sender's, once it runs."""
        r = self.reactions
        return r is not None and r.paused

    @property
    def flow_pauses(self) -> int:
        """How many times the broker paused this publisher."""
        return self._flow_pauses + (self.reactions.flow_pauses if self.reactions is not None else 0)

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
        if self.engine is not None and not self.outq and self.engine.owner_first:
            self.engine.owner_first = False
            self.engine.wake()            # what waited behind them: batches, a lease ping

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
        if not self.hold(0):
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
                if self.engine is not None:
                    # It waits for room itself (looking every millisecond,
                    # reading the broker meanwhile): no Python thread must.
                    self.engine.wake()
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
        return f"the broker at {self.options.endpoint} is not taking them"

    def take_notice(self) -> MessagesRejected | None:
        """The broker's notice of dropped messages since the last call (a
        completed flush raises it), or None."""
        notice, self.notice = self.notice, None
        return notice

    def linger_over(self) -> bool:
        """May a partial batch leave now (no linger, or the linger passed)?"""
        return self.publisher.linger_left(self.linger_ns) == 0.0

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
                wait = pub.linger_left(self.linger_ns)
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
        resend = None if isinstance(self.sock, zmq.Socket) else self.sock.resend_state
        if not f.pinged:
            if resend is not None and resend[3]:
                return False          # held until the broker resumes the session: then they go
            # Behind the batches: its PONG comes back once the broker has them.
            self.ping(f.token)
            f.pinged = True
            f.counted = resend[0] if resend is not None else 0
        if f.token in self.pongs:
            self.pongs.discard(f.token)
            if resend is not None and resend[1] < f.counted:
                # The PONG came, but not all it should follow (a cut lost
                # them: they go again on the resume): ask again after them.
                f.pinged = False
                f.token = b"flush-%d" % next(self._tokens)
                return False
            return True
        return False

    # -- input ------------------------------------------------------------------

    def on_message(self, cmd: bytes, frames: list) -> None:
        # WANT, FLOW and a lease's PONG are the reactions' (make_reactions),
        # applied by whichever thread read them; one that reaches here is
        # one they refused.
        if cmd == P.WANT:
            raise P.ProtocolError(f"bad subscription batch: the publisher's view refused a WANT of "
                                  f"{len(frames)} frames ({sum(map(len, frames))} bytes)")
        elif cmd == P.ACK and len(frames) == 2:
            # Not from the broker: the native reader applied a WANT but
            # could not send its ACK (the socket's queue was full).
            self._ack(P.unpack_u64(frames[1]))
        elif cmd == P.STATS_REPLY and len(frames) == 2:
            self.stats_replies.append(P.load_json(frames[1], limit=16 << 20))
        elif cmd == P.NOTICE and len(frames) == 2:
            info = P.load_json(frames[1])
            n = info.get("dropped")
            n = n if isinstance(n, int) and n > 0 else 0
            reason = str(info.get("reason", ""))[:500]
            self.rejected += n
            earlier = self.notice.count if self.notice is not None else 0
            self.notice = MessagesRejected(f"the broker at {self.options.endpoint} dropped {earlier + n} messages "
                                           f"of this client: {reason}", earlier + n)
            log.warning("%s: the broker at %s: %s", self.options.name, self.options.endpoint, reason)
        else:
            super().on_message(cmd, frames)

    def on_welcome(self) -> None:
        # (Not paused: the reactions took the WELCOME as a new session's.)
        # What the broker accepts: publish() refuses a message over it at once.
        pub = self.publisher
        pub.max_payload = self.limit("max_payload", P.MAX_PAYLOAD_UNWELCOMED)
        pub.max_topic = self.limit("max_topic")
        # A broker that does not say it takes headers (an older fastbus)
        # would refuse a whole batch for one record with them.
        pub.headers_refused = None if self.welcome.get("headers") is True else (
            f"the broker at {self.options.endpoint} does not take headers (an older fastbus): not sent")
        # A record whose headers are the one's before goes as a repeat
        # (docs/BATCH_FORMAT.md) to a broker that reads them.
        pub.outbox.header_repeats = self.welcome.get("headers_again") is True
        # The answer to our oldest HELLO in flight (or a later one): its
        # lease counts from the oldest, never longer than granted.
        sent = self._hellos[0] if self._hellos else 0
        self._hellos.clear()
        lease = self.welcome.get("lease_us")
        if isinstance(lease, int) and not isinstance(lease, bool) and lease >= 0:
            pub.set_lease(0)
            if sent:
                self._grant(sent, lease)
        else:
            # A broker that grants no lease does not wait for us either.
            pub.set_lease(FOREVER)

    def on_unacknowledged(self, n: int, records: int) -> None:
        # Said by the next flush (MessagesRejected, with the count), and counted.
        self.unacknowledged_lost += records
        reason = (f"{records} messages sent to the broker at {self.options.endpoint} before it lost this session "
                  f"(a restart without --journal) were never acknowledged: they may not have been delivered")
        earlier = self.notice.count if self.notice is not None else 0
        self.notice = MessagesRejected(reason if not earlier else f"{reason} (and {earlier} more dropped before)",
                                       earlier + records)
        log.warning("%s: %s (stats()['unacknowledged_lost'])", self.options.name, reason)

    def on_pong(self, token: bytes, lease_us: int | None) -> None:
        # (A lease ping's is the reactions': one without a lease, which
        # they let be asked for again, comes here too.)
        if token.startswith(b"flush-"):
            self.pongs.add(token)

    def _grant(self, sent_ns: int, lease_us: int) -> None:
        """The broker's WELCOME answered the HELLO we sent at ``sent_ns``
        with a lease (csrc/fb_view.h fb_view_lease, as the reactions apply
        a lease PONG's)."""
        ack = self.publisher.lease(sent_ns, lease_us)
        if ack:
            self._ack(ack)                # what we applied while we did not filter

    def on_ack_due(self, seq: int) -> None:
        self._ack(seq)

    def _ack(self, seq: int) -> None:
        self.publisher.acked(seq)
        self.send([P.ACK, P.pack_u64(seq)])

    def hello(self) -> None:
        pub = self.publisher
        # A new session: everything, until its WANT reset, its WANTs
        # numbered anew, and filtering only under its own lease (WELCOME's):
        # the native reader may apply that reset before we read WELCOME.
        pub.forget_view()
        if self.reactions is not None:
            self.reactions.paused = False     # a new session is not paused (its broker says if it is)
        self._hellos.append(time.monotonic_ns())
        super().hello()

    def renew_lease(self) -> None:
        """The publisher's call without the native sender (see Publisher):
        its filter is in use and its lease ends soon, or has ended.  A ping
        renews it."""
        self.post(self._lease_ping)

    def _lease_ping(self) -> None:
        # The reactions' (its send time in its token: the lease counts from
        # no later), as the native sender sends it; one the socket did not
        # take goes behind the control frames waiting for room.
        if self.reactions is not None:
            frames = self.reactions.lease_ping()
            if frames is not None:
                self.send(frames)

    def filtering(self) -> bool:
        """Does the publisher drop what nobody wants now: a view from the
        broker, under a lease that has not run out?  Asking renews a lease
        that has."""
        pub = self.publisher
        if pub.filters():
            return True
        if pub.has_view:
            pub.ask_renewal()
        return False

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
                    log.warning("%s: %d messages not sent at close: %s", self.options.name,
                                item[1] + pub.queued, exc)
                    break
        self.close()
