"""A PubSub's connection: ``SubSession``, and ``ConfirmWait`` (how long a
subscribe() waits for its confirmation, and what it raises when it gives
up).  They know their owner's ``Connections`` and options, not the Client.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from fastbus import protocol as P
from fastbus._core import SUBSCRIBE, batch_count
from fastbus.client import _engine
from fastbus.client._connections import Connections
from fastbus.client._endpoint import AbsenceProbe
from fastbus.client._items import Batch, Confirmed, Gap, InboxItem, Notice, Refused
from fastbus.client._session import BROKER_RESTARTED, Session, recv_frames
from fastbus.errors import BrokerTimeout, BrokerUnavailable, ConnectionClosed, DurableNameInUse

log = logging.getLogger("fastbus.client")

_DATA = P.DATA
_unpack_u64 = P.U64.unpack
SUB_OPS_DEFAULT = P.MIN_SUB_OPS   # subscription changes per SUB frame until the broker's WELCOME says its limit

#: How often a CURVE subscriber the broker has not welcomed yet looks for a
#: refused handshake while it waits (see KeyRefused).
HANDSHAKE_CHECK = 0.25
#: A resumable session tells the broker what it took (TAKEN) each time it
#: took this many more records: what the broker keeps for a resume
#: (bounded there too) is freed that often.
TAKEN_EVERY = 4096
#: A durable subscriber tells what its application took (TAKEN) each time
#: it took this many more records, and whenever it has taken all it was
#: given: a process that takes the name over starts there.
DURABLE_TAKEN_EVERY = 1024
#: The KICK reason of a broker that does not know this connection (yet).
HELLO_REQUIRED = "hello required"


def batch_records(batch) -> int:
    """The records a DATA batch holds (its header), as the broker counts them."""
    try:
        return batch_count(batch) or 1
    except ValueError:
        return 1


class SubSession(Session):
    """The connection of one PubSub: its subscriptions as the broker was
    told them, and what arrives, handed to the PubSub's inbox."""

    kind = "sub"

    def __init__(self, conns: Connections, deliver: Callable[[InboxItem], None],
                 inbox_full: Callable[[int], bool], durable: str | None = None,
                 wake_on_data: bool = False, replies: Any = None) -> None:
        super().__init__(conns)
        #: Data too wakes the keeper while nobody reads (a client's inbox of
        #: replies: what comes when no request waits is taken, not left).
        self.wake_on_data = wake_on_data
        #: A sync client's inbox (fastbus._core.Replies): the native reader
        #: matches its DATA to the waiting requests itself (fb_reader.h
        #: replies); what it took is told the broker by took_natively().
        self.replies = replies
        self._native_taken = 0
        #: A durable subscriber's name: its session outlives this process
        #: (any process presenting the name takes it over, where this one
        #: stopped taking); ``claim``: this process's, drawn once.
        self.durable = durable
        if durable is not None:
            self.session_id = P.durable_session_id(durable)
            self.claim = P.new_session_id()
        #: What its application took (records of DATA and GAPs; its PubSub
        #: counts), and as far as the last TAKEN told the broker.
        self.consumed = 0
        self.consumed_told = 0
        #: Records of its stream its PubSub moved out of the inbox (its
        #: application took them, less what it has not returned yet).
        self.moved = 0
        #: A durable session taken over from another process: what its
        #: subscriptions let through may not be this one's (filtered), and
        #: how many records of the first batch that process had taken.
        self.adopted = False
        self.skip = 0
        #: Why the broker refused this durable session (raised by every call).
        self.refused: DurableNameInUse | None = None
        #: Its PubSub's inbox: ``deliver(item)`` what was read (the lock
        #: held); ``inbox_full(times)``: holds it over ``times`` x its bound?
        self.deliver = deliver
        self.inbox_full = inbox_full
        self.subs: set[tuple[bytes, bool]] = set()   # what the broker was told
        self.seq = 0
        self.resend = False                 # resend self.subs at the next WELCOME
        self.confirmed = 0                  # the latest CONFIRM read: SUBs up to it are in effect
        self.awaiting = 0                   # subscribe() calls waiting for a CONFIRM
        self.confirm_cv = threading.Condition()   # ...woken by it when another thread reads
        # How much of its stream the session took off its connections
        # (records of DATA, and of GAPs), which a resuming HELLO says; the
        # broker sends what followed again (docs/PROTOCOL.md, "Resuming a
        # session").
        self.taken = 0
        self.taken_told = 0                 # ... as far as the last TAKEN told the broker
        self.resync_why: str | None = None  # a HELLO after a lost session: said (reconnect) unless resumed
        self._hellos = 0
        self._draining = False

    def open_native(self) -> None:
        """The native reader: takes what arrives while nobody reads (up to
        max_inbox_bytes more), without the interpreter lock; see
        _engine.Reader.  An event loop's, once the loop drives us, wakes
        the loop for every message (the loop reads only when woken).  It
        applies the session's reactions (Session.make_reactions) to what
        it reads, and pings the broker."""
        owner_fd = self.native_owner_fd()
        if self.reader is not None or owner_fd is None:
            return                        # (a loop's session: the keeper reads until the loop drives it)
        replies = None if self.conns.driven_by_loop else self.replies
        self._native_taken = 0
        self.adopt_reader(_engine.Reader(self.lock, self.sock, owner_fd, self.options.max_inbox_bytes, P.DATA,
                                         wake_on_data=self.conns.driven_by_loop or self.wake_on_data,
                                         reactions=self.reactions,
                                         lost_command=P.LOST_LOCAL, replies=replies))

    def took_natively(self) -> None:
        """What the native reader handed to ``replies`` since the last call,
        counted as taken (the lock held): its TAKEN, when one is due."""
        reader = self.reader
        if reader is None or self.replies is None:
            return
        total = reader.replies_taken
        if total > self._native_taken:
            n, self._native_taken = total - self._native_taken, total
            self._took(n)

    def native_taken_due(self) -> bool:
        """Has the native reader taken a TAKEN's worth since the last told?"""
        reader = self.reader
        return reader is not None and reader.replies_taken - self._native_taken >= TAKEN_EVERY

    def close(self) -> None:
        if self.reader is not None:
            self.reader.stop()            # before the socket closes; it waits for the lock we hold
            self.reader = None
        super().close()

    def configure(self, s: zmq.Socket) -> None:
        s.sndhwm = 1000
        # A fixed kernel buffer (loopback autotuning may grow one to 32 MB):
        # what a subscriber holds unread stays bounded, and a stalled one
        # shows up at the broker.
        s.rcvbuf = min(max(self.options.max_inbox_bytes // 4, 256 * 1024), 8 * 1024 * 1024)

    def reading(self) -> bool:
        # A subscribe() waiting for its CONFIRM reads past a full inbox, to
        # twice its bound (what arrives before the CONFIRM must be kept).
        return not self.inbox_full(1) or (self.awaiting > 0 and not self.inbox_full(2))

    def hello(self) -> None:
        # What the native reader took off the connection counts as taken:
        # into the inbox with it first (in order), so "taken" is exact.
        n = self._hellos
        reader = self.reader
        if reader is not None and not self._draining:
            self._draining = True
            try:
                while reader.queued:
                    self.handle(reader.pop())
            finally:
                self._draining = False
            if self._hellos != n:
                return                        # (what it held made a HELLO of its own)
        self._hellos += 1
        super().hello()
        # What we hold goes again once WELCOME answers (on_welcome), unless
        # the broker resumes the session.
        self.resend = bool(self.subs)

    def hello_fields(self) -> dict:
        fields = {**super().hello_fields(), "taken": self.taken}
        if self.durable is not None:
            fields["durable"] = self.durable
            fields["claim"] = self.claim
        return fields

    def _took(self, records: int) -> None:
        """``records`` more of the stream were taken off the connection."""
        self.taken += records
        if self.taken - self.taken_told >= TAKEN_EVERY and "linger" in self.welcome and not self.resyncing \
                and self.durable is None:       # (a durable one tells what its application took)
            self.taken_told = self.taken
            self.send([P.TAKEN, P.pack_u64(self.taken)])

    def tell_consumed(self, consumed: int) -> None:
        """A durable subscriber's application took its stream up to
        ``consumed``: TAKEN, now (the lock held)."""
        if consumed > self.consumed_told and self.welcome.get("linger") and not self.resyncing:
            self.consumed_told = consumed
            self.send([P.TAKEN, P.pack_u64(consumed)])

    def bye_frames(self) -> list:
        # A durable subscriber that closes keeps its session, from what its
        # application took.
        if self.durable is not None and self.refused is None and self.welcome.get("linger"):
            return [P.BYE, P.dump_json({"keep": True, "taken": self.consumed})]
        return [P.BYE]

    def on_welcome(self) -> None:
        info = self.welcome
        why, self.resync_why = self.resync_why, None
        if info.get("resumed"):
            # The broker kept the session: its subscriptions stand, and what
            # we missed follows this WELCOME.  A CONFIRM a cut lost is said here.
            self.resend = False
            taken = info.get("taken")
            if self.durable is not None and isinstance(taken, int) and not isinstance(taken, bool):
                # Taken over from another process: the stream goes on from
                # what it took (the first ``skip`` records again, dropped here).
                self.taken = self.taken_told = self.consumed = self.consumed_told = self.moved = taken
                skip = info.get("skip", 0)
                self.skip = skip if isinstance(skip, int) and skip > 0 else 0
                self.adopted = True
                log.info("%s: took over durable subscriber %r at %s", self.options.name, self.durable,
                         self.options.endpoint)
                return
            confirmed = info.get("confirmed")
            if isinstance(confirmed, int) and confirmed > self.confirmed:
                self.on_message(P.CONFIRM, [P.CONFIRM, P.pack_u64(confirmed)])
            log.info("%s: resumed its session at %s", self.options.name, self.options.endpoint)
            return
        # A new session: its stream counts from nothing.
        self.taken = self.taken_told = 0
        self.consumed = self.consumed_told = self.moved = 0
        if why is None and self.durable is not None and isinstance(info.get("expired"), dict):
            why = "expired"                   # (a durable name's last session ran out: said below)
        if why is not None:
            expired = info.get("expired")
            if isinstance(expired, dict):
                why = (f"the broker at {self.options.endpoint} ended this session after "
                       f"{expired.get('linger')} s without a connection: {expired.get('lost')} messages "
                       f"that waited for it were dropped, and what was published after was not kept")
            self.deliver(Notice("reconnect", why.encode()))
        # The broker knows us again (a reconnect, or a restarted broker):
        # resend what we hold, now that WELCOME said how many operations it
        # takes in one SUB frame (a larger frame is a protocol error: the
        # session would be dropped and the resend refused again, for ever).
        # Stamped with the latest sequence: this snapshot is the state the
        # pubsub's own (un)subscriptions reached.
        if self.resend and self.subs:
            self.resend = False
            self._refuse_unknown(self.seq, [(SUBSCRIBE, k, p) for k, p in self.subs])
            ops = [(SUBSCRIBE, k, p) for k, p in self.subs]
            size = self.limit("max_sub_ops", SUB_OPS_DEFAULT)
            seq = P.pack_u64(self.seq)
            for i in range(0, len(ops), size):
                self.send([P.SUB, seq, P.encode_ops(ops[i:i + size])])

    def on_lost(self) -> None:
        # Said at once (a `disconnected` message), then the resumed stream
        # or, if the session is not resumed, a `reconnect` message.
        linger = self.welcome.get("linger")
        then = (f"the broker keeps this session {linger:g} s: back within that, nothing is missed"
                if isinstance(linger, (int, float)) and linger > 0 and not isinstance(linger, bool) else
                "reconnecting: what is published until then is not delivered")
        self.deliver(Notice("disconnected", f"the connection to the broker at {self.options.endpoint} was lost; "
                                            f"{then}".encode()))

    def refuse(self, info: dict) -> None:
        """The broker refused this durable session (KICK): every call of its
        PubSub raises, and no HELLO is sent again."""
        self.refused = DurableNameInUse(f"the broker at {self.options.endpoint} refused durable subscriber "
                                        f"{self.durable!r}: {info.get('reason', '')}", str(self.durable))

    def resync(self, why: str) -> None:
        if self.refused is not None:
            return
        # One event, one notice.  A broker that asks only for a HELLO (a
        # new connection), or one that restarted (it may journal), may
        # still hold the session: said (a reconnect message) once WELCOME
        # shows it was not resumed; a restart says more than a HELLO asked
        # for.  Anything else (a slow consumer dropped) ended it: said now.
        if why == HELLO_REQUIRED:
            if not self.resyncing:
                self.resync_why = why
        elif why == BROKER_RESTARTED:
            if not self.resyncing or self.resync_why is not None:
                self.resync_why = why
        elif not self.resyncing or self.resync_why is not None:
            self.resync_why = None
            self.deliver(Notice("reconnect", why.encode()))
        super().resync(why)

    def _refuse_unknown(self, seq: int, ops: list) -> list:
        """``ops`` less the glob and queue group subscriptions a broker that
        said WELCOME without ``globs`` / ``groups`` (an older one) would drop
        this session for: they are refused here, as the broker refuses, and
        not held.  (Before any WELCOME, all go: an older broker's KICK
        brings the WELCOME that says so, and the resend leaves them out.)"""
        if not self.welcome:
            return ops
        for feature, unknown, what in (("globs", lambda p: p == P.GLOB, "match glob patterns"),
                                       ("groups", lambda p: isinstance(p, P.Queue), "have queue groups"),
                                       ("held", lambda p: isinstance(p, P.Queue) and p.hold,
                                        "keep messages for held groups"),
                                       ("bind", lambda p: isinstance(p, P.Queue) and p.into is not None,
                                        "bind channels to held groups")):
            if self.welcome.get(feature):
                continue
            refused = {(key, prefix) for op, key, prefix in ops if op == SUBSCRIBE and unknown(prefix)}
            if not refused:
                continue
            self.subs -= refused
            self.deliver(Refused(seq, refused, f"the broker at {self.options.endpoint} does not {what} "
                                                f"(a version before they came): upgrade it"))
            ops = [op for op in ops if op[0] != SUBSCRIBE or not unknown(op[2])]
        return ops

    def change(self, seq: int, ops: list) -> None:
        """Tell the broker of (un)subscriptions (the lock held)."""
        self.seq = seq
        ops = self._refuse_unknown(seq, ops)
        for op, key, prefix in ops:
            if isinstance(prefix, P.Queue) and prefix.hold:
                continue                      # (a declaration, not a subscription: not held, not sent again)
            if op == SUBSCRIBE:
                self.subs.add((key, prefix))
            else:
                self.subs.discard((key, prefix))
        self.send([P.SUB, P.pack_u64(seq), P.encode_ops(ops)])

    def wait_read_elsewhere(self, seq: int, until: float) -> None:
        """Without the lock (another thread reads the connection): wait
        until that thread reads CONFIRM ``seq`` (it wakes us; ``awaiting``
        said we wait) or until ``until`` (time.monotonic())."""
        with self.confirm_cv:
            if self.confirmed < seq:
                self.confirm_cv.wait(max(0.0, until - time.monotonic()))

    def read_one(self) -> None:
        """``read(1)`` for the path of every message a reader waits for: a
        DATA frame goes straight to the inbox (the lock held; ``more`` was
        set)."""
        frames = recv_frames(self.sock, self.ready)
        self.ready = False
        if frames is None:
            self.more = self.unread = False
            self.check_lost()
            return
        if self._pollers is not None and not self.sock.pending():
            # A Stream that read all the kernel had: the next wait's poll
            # says when more comes (no receive that would find nothing).
            self.more = False
        if frames[0] == _DATA and len(frames) == 3 and len(frames[1]) == 8:
            self.deliver(Batch(_unpack_u64(frames[1])[0], frames[2]))
            self._took(batch_records(frames[2]))
        else:
            self.react(frames)

    def on_message(self, cmd: bytes, frames: list) -> None:
        deliver = self.deliver
        if cmd == P.DATA and len(frames) == 3:
            deliver(Batch(P.unpack_u64(frames[1]), frames[2]))
            self._took(batch_records(frames[2]))
        elif cmd == P.CONFIRM and len(frames) == 2:
            seq = P.unpack_u64(frames[1])
            deliver(Confirmed(seq))
            if seq > self.confirmed:
                self.confirmed = seq
                if self.awaiting:
                    with self.confirm_cv:
                        self.confirm_cv.notify_all()
        elif cmd == P.REFUSED and len(frames) == 4:
            refused = {(key, prefix) for _op, key, prefix in P.decode_ops(frames[2])}
            reason = str(P.load_json(frames[3]).get("reason", ""))[:500]
            self.subs -= refused                  # never held: not resent after a reconnect
            log.warning("%s: the broker at %s refused %d subscriptions: %s", self.options.name,
                        self.options.endpoint, len(refused), reason)
            deliver(Refused(P.unpack_u64(frames[1]), refused, reason))
        elif cmd == P.GAP and len(frames) == 2:
            lost = P.unpack_u64(frames[1])
            deliver(Gap(lost))
            self._took(lost)
        else:
            super().on_message(cmd, frames)


class ConfirmWait:
    """When a subscribe() waiting for its CONFIRM gives up (both twins wait
    through it; only how they wait differs): :meth:`check` raises
    ConnectionClosed once the PubSub is closed, BrokerUnavailable when no
    broker answered this connection within the client's
    ``socket_connect_timeout`` (or nothing listens at its address for about
    a second: AbsenceProbe), KeyRefused when a CURVE broker refused its
    key, BrokerTimeout when a broker that answered has not confirmed within
    ``subscribe_timeout``.  ``wake_by()``: when to look again."""

    def __init__(self, session: SubSession, seq: int) -> None:
        opts = session.options
        self.session = session
        self.seq = seq
        self.start = time.monotonic()
        self.connect_by = self.start + opts.socket_connect_timeout
        self.deadline = None if opts.subscribe_timeout is None else self.start + opts.subscribe_timeout
        self.probe = AbsenceProbe(opts.endpoint, self.start)

    def done(self) -> bool:
        return self.session.confirmed >= self.seq

    def check(self, locked: bool, probe: bool = True) -> None:
        """Raise if the wait is over without a CONFIRM (``locked``: the
        caller holds the session's lock, so the CURVE handshake can be
        looked at; ``probe``: probe the address now if due, which may block
        for up to 0.2 s: an event loop runs ``self.probe.check`` in an
        executor instead)."""
        s = self.session
        if s.closing:
            raise ConnectionClosed("pubsub is closed")
        if s.refused is not None:
            raise s.refused
        if self.done():
            return
        opts = s.options
        endpoint = opts.endpoint
        now = time.monotonic()
        if not s.instance:
            if locked:
                self.probe.check_handshake(s)
            if probe:
                self.probe.check(s, 0)
            if now >= self.connect_by:
                raise BrokerUnavailable(f"no broker at {endpoint} answered within {opts.socket_connect_timeout:g} s "
                                        f"(socket_connect_timeout)", endpoint)
        elif self.deadline is not None and now >= self.deadline:
            raise BrokerTimeout(f"the broker at {endpoint} did not confirm the subscription within "
                                f"{opts.subscribe_timeout:g} s (subscribe_timeout); it stays requested, and its "
                                f"confirmation comes through get_message()", endpoint)

    def wake_by(self) -> float:
        """When to look again (time.monotonic())."""
        s = self.session
        now = time.monotonic()
        if not s.instance:
            # The probe's next look, the handshake's, or the connect timeout.
            return self.probe.wake_by(s, min(self.connect_by, now + HANDSHAKE_CHECK)) or now
        return self.deadline if self.deadline is not None else now + 3600.0
