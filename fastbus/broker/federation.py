"""Federation: our link to an upstream broker (``--upstream``), a DEALER
connection on which we are a session with role "broker".

We subscribe there (SUB) with what every other link of ours wants, as
diffs from that link's forwarder (fastbus.broker.interest); upstream sends
us WANT (reset, then diffs) with what its side wants from us, and that
becomes the upstream link's subscriptions, so messages published below go
up exactly when someone above wants them.  DATA from upstream is routed
like any received batch, never back up (split horizon).  The data plane
(fastbus.broker._relay) moves the batches both ways: it sends ours up and
routes upstream's DATA in its poll; the rest of what upstream sends comes
here (``on_readable``).  After a reconnect or an upstream restart (a PONG
or KICK tells us) we start over: HELLO and our whole want set again,
once: until its WELCOME, only an answer to a ping sent after that HELLO
(our probes, every ``probe_interval``) says it again, as one that
upstream refused or lost in a crash.  FLOW from upstream is ignored: flow
control is between a broker and its own clients.

Confirmed means in effect everywhere (fastbus.broker.settle): we
acknowledge upstream's WANT once our own publishers and downstream brokers
have what it added, and our view of what upstream wants counts only under
a lease, renewed by pings about three times a lease.  Once the lease runs
out (this broker stalled, or upstream stopped answering) we forward
everything up (``Router.set_catchall``) until a renewed lease says our view
is current again; and we never grant our own peers a lease that outlives
ours.
"""

from __future__ import annotations

import logging
import math
import time

import zmq

from fastbus import protocol as P
from fastbus._core import SUBSCRIBE, error_for
from fastbus.client import native_stream
from fastbus.errors import BatchError, InvalidEndpoint

from .links import UpstreamLink

log = logging.getLogger("fastbus.broker")



#: Seconds without an answer from the upstream broker before the first
#: warning (then at doubling intervals, at most every 5 minutes).
UPSTREAM_SILENT_WARN = 5.0
#: A connected upstream that answers none of our pings for this long is
#: taken for gone: we start over (HELLO), as after a restart.
UPSTREAM_SILENT_RESYNC = 5.0
#: A lease ping unanswered this long is sent again.
LEASE_PING_RETRY = 1.0
#: What a Stream keeps of what it sent upstream until upstream's TOOK covers
#: it (past it the relay's queue for the link holds the rest, under
#: --max-queue-bytes).
RESEND_BYTES = 64 * 1024 * 1024


class Upstream:
    """The upstream link and its socket's handler (``on_readable``)."""

    def __init__(self, broker) -> None:
        self.b = broker
        curve = broker.config.upstream_curve
        # A Stream where it can be one (the relay's thread reads and writes
        # it, and what upstream did not take goes again after a cut: the
        # session resumes, docs/PROTOCOL.md "Federation"); with CURVE, a
        # libzmq DEALER (the session resumes its stream, with no resend).
        s = native_stream(broker.config.upstream) if curve is None else None
        self.native = s is not None
        if s is None:
            s = broker._ctx.socket(zmq.DEALER)
            s.ipv6 = True
        s.linger = 0
        s.sndhwm = 1000
        s.tcp_keepalive = 1
        s.reconnect_ivl = 100
        # A Stream backs off as libzmq does (doubling up to the maximum),
        # from the moment the connection is lost: one link, tried every
        # 100 ms, finds upstream back within a tenth of a second of its
        # return (a 0.5 s cut cost 0.7 s with the doubling).
        s.reconnect_ivl_max = 100 if self.native else 2000
        if curve is not None:
            # We are a client there; upstream knows our key as a broker's
            # (its curve_allowed_brokers).
            server, public, secret = curve
            s.curve_serverkey = server.encode()
            s.curve_publickey = public.encode()
            s.curve_secretkey = secret.encode()
        try:
            s.connect(broker.config.upstream)
        except zmq.ZMQError as exc:           # BrokerConfig.check lets few through (a bad host name?)
            s.close(linger=0)
            raise InvalidEndpoint(f"upstream: cannot connect to {broker.config.upstream!r}: {exc.strerror}",
                                  broker.config.upstream, setting="upstream") from None
        if self.native:
            # Back on a new connection, it says so at once (upstream answers
            # KICK "hello required", and we resume); what upstream did not
            # take (its TOOK) is kept, and goes again once it says what it
            # has (WELCOME "received").
            s.set_reconnect_message([P.PING, P.RECONNECT_TOKEN])
            s.set_resend(P.RESENT, RESEND_BYTES)
        self.sock = s
        #: Our session there (it outlives a cut connection: what we missed
        #: comes again, and what we sent it and it did not take goes again).
        self.session_id = P.new_session_id()
        self._gaps = 0                            # records upstream's GAPs said we missed (our stream's count)
        self._taken_told = 0                      # our last TAKEN
        self._welcomes = 0                        # WELCOMEs so far (a Stream's)
        self.link = UpstreamLink(broker.links.new_id(), s)
        self.link.headers = True                  # until a WELCOME says otherwise
        self.link.groups = False                  # it takes queue group ops: once a WELCOME says so
        self._refused = ""                        # the reason upstream last refused us, if it did
        self._retry_in = 0.0                      # then: seconds until we try again (doubling)...
        self._retry_at = 0.0                      # ...and when
        self._silent_since = time.monotonic()     # not connected since (None: connected)
        self._warn_after = UPSTREAM_SILENT_WARN   # seconds of silence before the next warning
        self._last_heard = time.monotonic()       # our last PONG from upstream
        self._hellos: list[int] = []              # when our unanswered HELLOs left (monotonic ns)
        self.lease_until_ns = 0                   # our view of upstream's wants counts until then
        self._lease_ping_at = 0.0                 # our lease ping in flight since (0: none)
        #: When tick() should run next (the loop's poll wakes for it).
        self.next_tick = math.inf
        broker.add_link(self.link)
        broker.relay.set_upstream(self.link.link, s)   # its batches go out in C, as sessions' do
        self.hello()

    def check(self, now: float) -> None:
        """Maintenance: say when the upstream has not answered for a while
        (unreachable, or not a fastbus broker), then less often, and when
        it answers again.  ``now``: time.monotonic()."""
        self.tell_taken()
        if self.connected:
            if now - self._last_heard >= UPSTREAM_SILENT_RESYNC and self._may_retry():
                log.warning("the upstream broker %s answered no ping for %.0f s: starting over",
                            self.b.config.upstream, now - self._last_heard)
                self.hello()
                return
            if self._silent_since is None:
                return
            if self._warn_after > UPSTREAM_SILENT_WARN:
                log.info("the upstream broker %s answered", self.b.config.upstream)
            self._silent_since, self._warn_after = None, UPSTREAM_SILENT_WARN
            return
        if self._silent_since is None:
            self._silent_since = now
        elif now - self._silent_since >= self._warn_after:
            log.warning("the upstream broker %s has not answered for %.0f s: is it running, and is the "
                        "address right%s? (retrying)", self.b.config.upstream, now - self._silent_since,
                        ", and does it accept our CURVE key" if self.b.config.upstream_curve else "")
            self._warn_after = min(self._warn_after * 2, now - self._silent_since + 300)

    @property
    def connected(self) -> bool:
        return bool(self.link.instance)

    def taken(self) -> int:
        """What we took of our session's stream there: the records of its
        DATA (the data plane routes them all) and the counts of its GAPs."""
        return self.b.relay.up_records + self._gaps

    def tell_taken(self) -> None:
        """TAKEN, if we took more since the last: upstream forgets what it
        kept for a resume up to there (at each maintenance: a second of
        traffic, within the ring a quarter of its --max-queue-bytes)."""
        taken = self.taken()
        if self.connected and taken > self._taken_told:
            self._taken_told = taken
            self.b.sender.send(self.link, [P.TAKEN, P.pack_u64(taken)])

    @property
    def _hello_in_flight(self) -> bool:
        """Our HELLO has not been answered yet (WELCOME sets the instance)."""
        return not self.link.instance and bool(self._hellos)

    def lease_left(self) -> float:
        """Seconds our lease on upstream's wants has left (inf while not
        connected: there is no view to keep current, fastbus.broker.loop
        Broker.lease_grant_us)."""
        if not self.connected:
            return math.inf
        return max(0.0, (self.lease_until_ns - time.monotonic_ns()) / 1e9)

    def _granted(self, sent_ns: int, lease_us: int) -> None:
        """Upstream answered what we sent at ``sent_ns`` with a lease."""
        until = sent_ns + int(lease_us * 1000 * P.LEASE_USE)
        if until > self.lease_until_ns:
            self.lease_until_ns = until
            # Forward everything up from the lease's end, unless renewed.
            self.b.router.set_catchall(self.link.link, until)
        self.next_tick = min(self.next_tick, (sent_ns + lease_us * 1000 // 3) / 1e9)

    def tick(self, now: float) -> None:
        """Renew the lease (the loop calls it at ``next_tick``)."""
        self.next_tick = math.inf
        if not self.connected:
            return
        if self._lease_ping_at and now - self._lease_ping_at < LEASE_PING_RETRY:
            self.next_tick = self._lease_ping_at + LEASE_PING_RETRY
            return
        sent = time.monotonic_ns()
        self._lease_ping_at = now
        self.b.sender.send(self.link, [P.PING, P.LEASE_TOKEN + P.pack_u64(sent), P.LEASE_ASK])
        self.next_tick = now + LEASE_PING_RETRY

    def hello(self) -> None:
        """(Re)introduce ourselves upstream, naming our session and what we
        took of it.  A libzmq connection (no resend) starts over at once;
        a Stream's waits for the WELCOME to say whether the session went
        on (_welcomed)."""
        b, link = self.b, self.link
        link.instance = b""
        if not self.native:
            self._start_over()
        self.lease_until_ns = 0                  # no lease until it answers
        self._lease_ping_at = 0.0
        self._last_heard = time.monotonic()
        hello = {"v": P.VERSION, "role": "broker", "pub": True, "name": b.config.name, "ack": True,
                 "headers": True, "headers_again": True, "groups": True, "session": self.session_id,
                 "taken": self.taken()}
        send = b.sender.send
        self._hellos.append(time.monotonic_ns())
        del self._hellos[1:-1]                   # the oldest counts (see WELCOME); bounded
        link.hello_gen += 1
        send(link, [P.HELLO, P.dump_json(hello)])
        if not self.native:
            self._send_wants()
        send(link, [P.PING, link.ping_token(b"hello")])

    def _start_over(self) -> None:
        """A new session upstream: whatever it wanted from us belonged to
        the old one, and so do the acknowledgements we owed it."""
        b, link = self.b, self.link
        b.interest.set_wants(link, set(), True)
        b.settler.forget(link)
        if not self.native:
            # (A Stream sends what was queued and batched for upstream to the
            # new session, in order, once it is welcomed.)
            b.sender.discard_queue(link)
            b.router.remove_link(link.link)
            b.router.add_link(link.link)
            b.router.set_headers(link.link, link.headers, link.headers_again)
            b.router.set_broker(link.link, link.groups)
        b.router.set_catchall(None)

    def _send_wants(self) -> None:
        """What we want from upstream: what every other link wants, in SUB
        frames of at most the operations upstream takes in one."""
        for frames in self.b.interest.upstream_snapshot(self.link):
            self.b.sender.send(self.link, frames)

    def _welcomed(self, info: dict) -> None:
        """A Stream's WELCOME: the session went on (what upstream did not
        get goes again, and it sends what we missed), or is new (it
        restarted, or the linger ran out): we start over, and what went
        on the lost connection is not sent again."""
        s = self.sock
        resumed = info.get("resumed") is True
        again = self._welcomes > 0
        self._welcomes += 1
        expired = info.get("expired")
        if isinstance(expired, dict):
            log.warning("our session at the upstream broker %s expired (we were away over its %s s linger): "
                        "%s messages that waited for us there were dropped", self.b.config.upstream,
                        expired.get("linger"), expired.get("lost"))
        if not info.get("linger"):
            s.set_resend(b"", 0)                 # an upstream that keeps no session
            if again:
                log.warning("the upstream broker %s keeps no session (--session-linger 0): what it routed to "
                            "us while the link was down is lost, uncounted", self.b.config.upstream)
        else:
            dropped = s.resume(info.get("received", 0), "resumed" if resumed else "fresh")
            if dropped:
                log.warning("the upstream broker %s does not have our session any more (%s): %d messages "
                            "sent to it before were not acknowledged and may not have reached its subscribers",
                            self.b.config.upstream, "it restarted" if "expired" not in info else "it expired",
                            dropped)
        if resumed:
            log.info("resumed our session at the upstream broker %s", self.b.config.upstream)
            return
        self._start_over()
        self._send_wants()

    def _may_retry(self) -> bool:
        """Say HELLO again now?  Not while a refusal's back-off runs."""
        return not self._refused or time.monotonic() >= self._retry_at

    def on_readable(self) -> None:
        """The message from upstream the data plane kept for us (it reads
        the socket and routes DATA itself, counting its records:
        fastbus.broker._relay Relay.take_upstream); the rest of what the
        socket holds it reads at its next wait, in order."""
        frames = self.b.relay.take_upstream()
        if frames is None:
            return
        if type(frames) is not list:             # (an UpstreamRefused: the relay's typed event)
            self.b.drops["protocol"] += 1
            log.warning("bad message from upstream: %s", error_for(frames.status, "batch from upstream"))
            return
        self._message(frames)

    def _message(self, frames: list) -> None:
        """One message from upstream."""
        b, link = self.b, self.link
        cmd = frames[0]
        try:
            if cmd == P.WANT and len(frames) in (3, 4):
                self._on_want(frames[1], frames[2], frames[3] if len(frames) == 4 else None)
            elif cmd == P.WELCOME:
                info = P.load_json(frames[1])
                # (What it takes, before what we send it on the strength of it.)
                had_groups = link.groups
                link.headers = info.get("headers") is True   # (an older upstream reads none)
                link.headers_again = info.get("headers_again") is True
                link.groups = info.get("groups") is True     # (nor takes queue group ops)
                b.router.set_broker(link.link, link.groups)
                if self.native:
                    self._welcomed(info)
                elif link.groups and not had_groups:
                    b.interest.announce_groups(link)     # (our wants went before it said so)
                link.instance = str(info.get("instance", "")).encode()
                b.router.set_headers(link.link, link.headers, link.headers_again)
                limits = info.get("limits") or {}
                if isinstance(limits.get("max_sub_ops"), int) and limits["max_sub_ops"] > 0:
                    link.sub_ops = limits["max_sub_ops"]
                self._refused = ""
                self._retry_in = self._retry_at = 0.0
                self._last_heard = time.monotonic()
                # The answer to our oldest HELLO in flight, or to a
                # later one: its lease counts from the oldest (never
                # longer than granted).
                sent = self._hellos[0] if self._hellos else 0
                self._hellos.clear()
                lease = info.get("lease_us")
                if isinstance(lease, int) and not isinstance(lease, bool) and lease >= 0:
                    if sent:
                        self._granted(sent, lease)
                    self.next_tick = 0.0          # and keep it renewed
                # (An upstream that grants no lease does not wait for
                # our acknowledgements either: our view counts as it is.)
            elif cmd == P.PONG and len(frames) in (3, 4):
                self._last_heard = time.monotonic()
                if self._hello_in_flight:
                    if link.follows_last_hello(frames[1]):
                        # Upstream answers what we sent after our HELLO
                        # without having answered the HELLO (it would
                        # have, first: one pipe, handled in order).  It
                        # refused us, or never had it: it died as the
                        # HELLO arrived, and whoever answers now did
                        # not read it.  Say it again (once a refusal's
                        # back-off has run).
                        if self._may_retry():
                            log.info("upstream did not answer our HELLO: saying it again")
                            self.hello()
                    # Otherwise, the answer to a ping sent before our
                    # HELLO (pings queued while upstream was down): the
                    # HELLO is on its way, and its WELCOME says the
                    # instance.
                elif frames[2] != link.instance:
                    if self._may_retry():
                        log.info("upstream restarted or reconnected: resending subscriptions")
                        self.hello()
                elif len(frames) == 4 and frames[1].startswith(P.LEASE_TOKEN) and \
                        len(frames[1]) == len(P.LEASE_TOKEN) + 8:
                    self._lease_ping_at = 0.0
                    self._granted(P.unpack_u64(frames[1][len(P.LEASE_TOKEN):]), P.unpack_u64(frames[3]))
            elif cmd == P.KICK:
                info = P.load_json(frames[1])
                if info.get("refused"):
                    # Not allowed to federate there: say so (once per
                    # reason), and try again later, backing off.
                    reason = str(info.get("reason", ""))[:300]
                    if reason != self._refused:
                        log.error("the upstream broker %s refused this broker: %s", b.config.upstream, reason)
                    self._refused = reason
                    self._retry_in = min(self._retry_in * 2, 30.0) if self._retry_in else 1.0
                    self._retry_at = time.monotonic() + self._retry_in
                elif self._hello_in_flight:
                    # A KICK for what we sent before our HELLO (a
                    # restarted upstream asks for one, as its PONG
                    # said): that HELLO is on its way.  A second one
                    # would make upstream drop the session the first
                    # made, and its publishers see our subscriptions
                    # go and come back.  One event, one resync.
                    pass
                elif self._may_retry():
                    log.info("upstream asked for a resync: %s", frames[1][:200])
                    self.hello()
            elif cmd == P.REFUSED and len(frames) == 4:
                why = str(P.load_json(frames[3]).get("reason", ""))[:300]
                n = len(P.decode_ops(frames[2], max_key=b.config.max_topic))
                b.drops["too_many_subscriptions"] += n
                log.error("the upstream broker refused %d of our subscriptions (messages for them will not "
                          "come down): %s", n, why)
            elif cmd == P.NOTICE:
                log.warning("the upstream broker: %s",
                            str(P.load_json(frames[1]).get("reason", ""))[:300])
            elif cmd == P.CONFIRM and len(frames) == 2:
                b.settler.acked(link, P.unpack_u64(frames[1]))
            elif cmd == P.TOOK and len(frames) == 2:
                if self.native:
                    self.sock.acked(P.unpack_u64(frames[1]))
            elif cmd in (P.GAP, P.STATS_REPLY, P.PING, P.FLOW):
                # FLOW: upstream's flow control is for its clients; a
                # broker keeps forwarding (its own limits apply).
                if cmd == P.GAP:
                    n = P.unpack_u64(frames[1])
                    b.drops["slow_consumer"] += n
                    self._gaps += n
            else:
                raise P.ProtocolError(f"unexpected {cmd!r} from upstream")
        except (P.ProtocolError, BatchError, ValueError) as exc:
            b.drops["protocol"] += 1
            log.warning("bad message from upstream: %s", exc)

    def _on_want(self, flags: bytes, frame, seq: bytes | None) -> None:
        ops = P.decode_ops(frame, max_key=self.b.config.max_topic)
        interest = self.b.interest
        if flags and flags[0] & P.WANT_RESET:
            interest.set_wants(self.link, {(k, p) for op, k, p in ops if op == SUBSCRIBE}, True)
        else:
            interest.apply(self.link, ops)
        if seq is not None:
            # Acknowledged once our publishers and downstream brokers have
            # what it added (fastbus.broker.settle).
            added = any(op == SUBSCRIBE for op, _k, _p in ops)
            self.b.settler.reply_when_settled(self.link, [P.ACK, seq], added)
