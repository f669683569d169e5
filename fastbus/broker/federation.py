"""Federation: our link to an upstream broker (``--upstream``), a DEALER
connection on which we are a session with role "broker".

We subscribe there (SUB) with what every other link of ours wants, as
diffs from that link's forwarder (fastbus.broker.interest); upstream sends
us WANT (reset, then diffs) with what its side wants from us, and that
becomes the upstream link's subscriptions, so messages published below go
up exactly when someone above wants them.  DATA from upstream is routed
like any received batch, never back up (split horizon).  After a reconnect
or an upstream restart (a PONG or KICK tells us) we start over: HELLO and
our whole want set again.  FLOW from upstream is ignored: flow control is
between a broker and its own clients.
"""

from __future__ import annotations

import logging
import time

import zmq

from fastbus import protocol as P
from fastbus._core import SUBSCRIBE
from fastbus.errors import BatchError, InvalidEndpoint

from .config import RECV_BUDGET
from .links import UpstreamLink, count_in

log = logging.getLogger("fastbus.broker")



#: Seconds without an answer from the upstream broker before the first
#: warning (then at doubling intervals, at most every 5 minutes).
UPSTREAM_SILENT_WARN = 5.0


class Upstream:
    """The upstream link and its socket's handler (``on_readable``)."""

    def __init__(self, broker) -> None:
        self.b = broker
        s = broker._ctx.socket(zmq.DEALER)
        s.linger = 0
        s.sndhwm = 1000
        s.tcp_keepalive = 1
        s.reconnect_ivl = 100
        s.reconnect_ivl_max = 2000
        curve = broker.config.upstream_curve
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
        self.sock = s
        self.link = UpstreamLink(broker.links.new_id(), s)
        self._refused = ""                        # the reason upstream last refused us, if it did
        self._retry_in = 0.0                      # then: seconds until we try again (doubling)...
        self._retry_at = 0.0                      # ...and when
        self._silent_since = time.monotonic()     # not connected since (None: connected)
        self._warn_after = UPSTREAM_SILENT_WARN   # seconds of silence before the next warning
        broker.add_link(self.link)
        self.hello()

    def check(self, now: float) -> None:
        """Maintenance: say when the upstream has not answered for a while
        (unreachable, or not a fastbus broker), then less often, and when
        it answers again.  ``now``: time.monotonic()."""
        if self.connected:
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

    def hello(self) -> None:
        """(Re)introduce ourselves upstream and resend all we want there."""
        b, link = self.b, self.link
        link.instance = b""
        # Whatever upstream wanted from us belonged to the old session.
        b.interest.set_wants(link, set(), True)
        b.sender.discard_queue(link)
        b.router.remove_link(link.link)          # and what was batched for it
        b.router.add_link(link.link)
        hello = {"v": P.VERSION, "role": "broker", "pub": True, "name": b.config.name}
        send = b.sender.send
        send(link, [P.HELLO, P.dump_json(hello)])
        # What we want from upstream: what every other link wants, in SUB
        # frames of at most the operations upstream takes in one.
        for ops in b.interest.link_snapshot_chunks(link, link.sub_ops):
            send(link, link.want_frames(ops))
        send(link, [P.PING, b"hello"])

    def _may_retry(self) -> bool:
        """Say HELLO again now?  Not while a refusal's back-off runs."""
        return not self._refused or time.monotonic() >= self._retry_at

    def on_readable(self) -> None:
        b, link, sock = self.b, self.link, self.sock
        receive, flush_full = b.router.receive, b.sender.flush_full
        source = link.link
        for _ in range(RECV_BUDGET):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            cmd = frames[0]
            try:
                if cmd == P.DATA and len(frames) == 3:
                    full = receive(frames[2], source)
                    count_in(link, frames[2])
                    if full:
                        flush_full(full)
                elif cmd == P.WANT and len(frames) == 3:
                    self._on_want(frames[1], frames[2])
                elif cmd == P.WELCOME:
                    info = P.load_json(frames[1])
                    link.instance = str(info.get("instance", "")).encode()
                    limits = info.get("limits") or {}
                    if isinstance(limits.get("max_sub_ops"), int) and limits["max_sub_ops"] > 0:
                        link.sub_ops = limits["max_sub_ops"]
                    self._refused = ""
                    self._retry_in = self._retry_at = 0.0
                elif cmd == P.PONG and len(frames) == 3:
                    if frames[2] != link.instance and self._may_retry():
                        log.info("upstream restarted or reconnected: resending subscriptions")
                        self.hello()
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
                elif cmd in (P.CONFIRM, P.GAP, P.STATS_REPLY, P.PING, P.FLOW):
                    # FLOW: upstream's flow control is for its clients; a
                    # broker keeps forwarding (its own limits apply).
                    if cmd == P.GAP:
                        b.drops["slow_consumer"] += P.unpack_u64(frames[1])
                else:
                    raise P.ProtocolError(f"unexpected {cmd!r} from upstream")
            except (P.ProtocolError, BatchError, ValueError) as exc:
                b.drops["protocol"] += 1
                log.warning("bad message from upstream: %s", exc)

    def _on_want(self, flags: bytes, frame) -> None:
        ops = P.decode_ops(frame, max_key=self.b.config.max_topic)
        interest = self.b.interest
        if flags and flags[0] & P.WANT_RESET:
            interest.set_wants(self.link, {(k, p) for op, k, p in ops if op == SUBSCRIBE}, True)
        else:
            interest.apply(self.link, ops)
