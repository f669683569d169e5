"""The client-facing ROUTER socket: sessions of clients and downstream
brokers, and the commands they send (HELLO, SUB, PUB, PING, STATS, BYE;
docs/PROTOCOL.md).

A PUB from a known session is the hot path, and never comes here: the data
plane (fastbus.broker._relay) routes and sends it in C.  Everything else
is handed over one message at a time, in order.  Bad input never stops the broker: it is counted,
logged, answered with KICK, and the session dropped.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import zmq

from fastbus import protocol as P
from fastbus._core import SUBSCRIBE
from fastbus._core import error_for
from fastbus.errors import BatchError

from .config import RECV_BUDGET, SUB_OPS_PER_TURN, broker_allowed, broker_network
from .links import ClientLink, DownstreamLink, RedisLink, Session, peer_dicts
from .resp import RespCommands

if TYPE_CHECKING:
    from ._relay import PubRouted

log = logging.getLogger("fastbus.broker")


def _bye_keeps(rest: list) -> int | None:
    """A durable subscriber's BYE that keeps its session: its options
    frame (JSON) {"keep": true, "taken": n} (docs/PROTOCOL.md); the count
    its process took, or None (a BYE that ends the session)."""
    if not rest:
        return None
    try:
        opts = P.load_json(rest[0])
    except (P.ProtocolError, ValueError):
        return None
    taken = opts.get("taken") if isinstance(opts, dict) and opts.get("keep") is True else None
    return taken if isinstance(taken, int) and not isinstance(taken, bool) and taken >= 0 else None


def _wants_clients(frame: bytes) -> bool:
    """STATS's optional options frame (JSON): {"clients": true} asks for
    one entry per peer too (docs/PROTOCOL.md)."""
    try:
        opts = P.load_json(frame)
    except (P.ProtocolError, ValueError):
        return False
    return isinstance(opts, dict) and opts.get("clients") is True


_PUB = P.PUB
_ROLES = {"client": ClientLink, "broker": DownstreamLink, "redis": RedisLink}


class Sessions:
    """The sessions on one ROUTER socket (bound to every client endpoint)."""

    def __init__(self, broker, sock: zmq.Socket) -> None:
        self.b = broker
        self.sock = sock
        self._kicked: set[bytes] = set()          # unknown peers already asked to say hello
        self._gone: dict[bytes, str] = {}          # removed sessions -> why, told when they reappear
        self._expired: dict[str, tuple] = {}       # lingering sessions that ran out -> (messages dropped, linger)
        self._ops_this_turn = 0                    # subscription operations applied in this turn
        self.resp = RespCommands(broker)           # what Redis clients ask besides pub/sub (--resp)
        cfg = broker.config
        self._broker_nets = [broker_network(e) for e in cfg.allow_brokers]
        self._broker_keys = {k.decode() if isinstance(k, bytes) else k for k in cfg.curve_allowed_brokers or ()}

    # -- receiving ---------------------------------------------------------

    def on_readable(self) -> None:
        """Take the messages the data plane (fastbus.broker._relay) hands
        over: up to RECV_BUDGET read, and at most SUB_OPS_PER_TURN
        subscription operations applied (the rest next turn, so a flood
        of subscriptions does not stop the loop serving others).  Known
        sessions' PUBs among them are routed and sent in C; the rest comes
        here, one message at a time, in order."""
        relay = self.b.relay
        self._ops_this_turn = 0
        left = RECV_BUDGET
        while left > 0 and self._ops_this_turn < SUB_OPS_PER_TURN:
            frames, meta, n = relay.receive(left)
            left -= n
            if frames is None:
                return
            if type(frames) is not list:         # (a PubRouted: the relay's typed event)
                self._pub_routed(frames)
            else:
                self._message(frames, meta)

    def _pub_routed(self, routed: PubRouted) -> None:
        """A known session's PUB the data plane routed only in part, or
        refused (it counted either): a refusal drops the sender with the
        reason, records over the size limits are told to it."""
        if routed.status < 0:
            self._protocol_error(routed.ident, error_for(routed.status, "batch"))
            return
        link = self.b.links.by_ident.get(routed.ident)
        if link is not None:
            self._oversize(link, routed.over)

    def _message(self, frames: list, meta: dict | None = None) -> None:
        """One message the data plane did not route (see _relay.pyx)."""
        if len(frames) < 2:
            self.b.drops["protocol"] += 1
            return
        try:
            self._handle(frames[0], frames[1], frames[2:], meta)
        except (P.ProtocolError, BatchError, ValueError) as exc:
            self._protocol_error(frames[0], exc)

    def _handle(self, ident: bytes, cmd: bytes, rest: list, meta: dict | None = None) -> None:
        b = self.b
        link = b.links.by_ident.get(ident)
        if cmd == _PUB:
            if len(rest) != 1:
                raise P.ProtocolError("PUB takes one batch frame")
            if link is not None:
                b.route(rest[0], link.link)    # a link the relay does not know (none today)
                return
            # An unknown sender (e.g. after a broker restart): route what
            # arrives, and ask it to introduce itself (once) so it gets its
            # filters.  (A known session's PUB the relay routed itself.)
            b.route(rest[0], None)
            self._hello_required(ident)
            return
        b.counters["control_in"] += 1
        if cmd == P.RESP_REQUEST and isinstance(link, RedisLink):
            self.resp.handle(link, rest)
        elif cmd == P.HELLO:
            self._on_hello(ident, link, rest, meta or {})
        elif cmd == P.PING:
            token = rest[0] if rest else b""
            if link is not None:
                b.relay.tell_took(link.link)       # (a flush's PONG finds what it covers acknowledged)
            if link is None:
                self._reply(ident, [P.PONG, token, b.instance])
                # A client we dropped (or never met) that is still alive.
                self._hello_required(ident)
            elif link.acks and len(rest) > 1 and rest[1] == P.LEASE_ASK:
                # Behind everything queued for it, WANT included: a lease
                # on the view those gave it (fastbus.broker.settle).
                lease = b.lease_grant_us()
                b.relay.grant(link.link, lease)
                b.sender.send(link, [P.PONG, token, b.instance, P.pack_u64(lease)])
            else:
                b.sender.send(link, [P.PONG, token, b.instance])
        elif cmd == P.STATS:
            st = b.stats_dict()
            from fastbus.monitor.http import process_rss   # (imported once; STATS is rare)
            st["rss_bytes"] = process_rss()
            if rest and _wants_clients(rest[0]):
                st["connz"] = peer_dicts(b.peer_rows())
            self._reply(ident, [P.STATS_REPLY, P.dump_json(st)])
        elif cmd == P.BYE:
            # Forgotten before the answer goes: the peer closes its socket
            # only once it has it (WELCOME's "bye"), so nothing sent on
            # behalf of the others finds it gone.  A peer we do not know
            # gets its answer too (it is leaving anyway).  A durable
            # subscriber's process that closes keeps its session: it
            # lingers, from what the process took (docs/PROTOCOL.md).
            keep = _bye_keeps(rest)
            if link is not None and link.durable is not None and keep is not None:
                self._consumed(link, keep)
                b.relay.detach(link.link)
                b.detach_link(link)
            elif link is not None:
                b.remove_link(link, "bye")
            self._reply(ident, [P.BYE])
        elif link is None:
            # Unknown session (e.g. the broker restarted): ask it to say hello.
            # What it sent is dropped (and counted) if it held messages or
            # subscriptions; a PING (a Stream's first on a connection made
            # again asks for just this) or a TAKEN loses nothing.
            if cmd not in (P.PING, P.TAKEN):
                b.drops["unknown_peer"] += 1
            self._hello_required(ident)
        elif cmd == P.SUB:
            b.relay.count_received(link.link)     # (the client keeps it until TOOK says so)
            if len(rest) != 2:
                raise P.ProtocolError("SUB takes a sequence number and an ops batch")
            seq = P.unpack_u64(rest[0])
            # A frame costs at most max_sub_ops operations (clients split
            # larger changes; WELCOME says the limit).
            ops = P.decode_ops(rest[1], max_key=b.config.max_topic, max_ops=b.config.max_sub_ops)
            self._ops_this_turn += len(ops)
            # Batches routed under the old subscriptions go out first, so each
            # data batch is stamped with the subscriptions it was routed with.
            b.sender.flush_link(link.link)
            refused = b.interest.apply(link, ops)
            if b.journal is not None:
                b.journal.subscribed(link, seq, ops, refused)
            # Data routed from now on carries this seq; the CONFIRM says
            # more, and may wait (below).
            b.relay.confirm(link.link, seq)
            if refused:
                # Never confirmed: the client learns which, and why, first.
                reason = refused[0][2]
                log.warning("refused %d subscriptions of %s: %s", len(refused), link.name, reason)
                b.sender.send(link, [P.REFUSED, P.pack_u64(seq),
                                     P.encode_ops((SUBSCRIBE, k, p) for k, p, _why in refused),
                                     P.dump_json({"reason": reason})])
            # Confirmed once in effect everywhere: every publisher's filter
            # and every other broker has what this SUB added.
            added = sum(1 for op in ops if op[0] == SUBSCRIBE) > len(refused)
            b.settler.reply_when_settled(link, [P.CONFIRM, P.pack_u64(seq)], added)
        elif cmd == P.ACK:
            if len(rest) != 1:
                raise P.ProtocolError("ACK takes a sequence number")
            b.settler.acked(link, P.unpack_u64(rest[0]))
        elif cmd == P.TAKEN:
            if len(rest) != 1:
                raise P.ProtocolError("TAKEN takes a count")
            taken = P.unpack_u64(rest[0])
            link.took = max(link.took, taken)
            if link.durable is not None:
                self._consumed(link, taken)
            else:
                b.relay.trim(link.link, taken)
                if b.journal is not None:
                    b.journal.taken(link, taken)
        else:
            raise P.ProtocolError(f"unknown command {cmd!r}")

    def _on_hello(self, ident: bytes, link: Session | None, rest: list, meta: dict) -> None:
        b = self.b
        if len(rest) != 1:
            raise P.ProtocolError("HELLO takes one JSON frame")
        hello = P.load_json(rest[0])
        if hello.get("v") != P.VERSION:
            self._reply(ident, [P.KICK, P.dump_json({"reason": f"unsupported protocol version {hello.get('v')!r}",
                                                    "version": P.VERSION})])
            return
        role = hello.get("role", "client")
        kind = _ROLES.get(role) if isinstance(role, str) else None
        if kind is None:
            raise P.ProtocolError(f"unknown role {role!r}")
        if kind.is_broker and not self._may_be_broker(meta):
            b.drops["not_a_broker"] += 1
            reason = ("this broker does not accept downstream brokers from here: its operator allows them "
                      "with --allow-broker ADDRESS (or, with CURVE, --curve-allow-broker KEY)")
            log.warning("refused a downstream broker at %s (%s)", meta.get("Peer-Address") or "a local socket",
                        str(hello.get("name", ""))[:100])
            self._reply(ident, [P.KICK, P.dump_json({"reason": reason, "refused": True})])
            return
        session_id = self._session_id(hello, kind)
        durable = self._durable(hello, kind)
        if durable is not None:
            if b.config.durable_linger <= 0:
                self._refuse_durable(ident, link, durable, "this broker keeps no durable sessions "
                                                           "(its operator started it with --durable-linger 0)")
                return
            session_id = P.durable_session_id(durable)
        if session_id is not None and session_id in b.links.by_session:
            owner = b.links.by_session[session_id]
            if link is not None and link is not owner:
                b.remove_link(link, "hello again")
            takeover = owner.durable is not None and hello.get("claim") != owner.claim
            if takeover and not owner.lingering:
                # Two live processes may not hold one durable name.
                b.drops["durable_in_use"] += 1
                self._refuse_durable(ident, None, durable or owner.durable,
                                     f"durable subscriber {owner.durable!r} is held by a live process "
                                     f"(connected from {owner.address or 'a local socket'}): one process "
                                     f"at a time may hold a durable name", in_use=True)
                return
            if self._resume(owner, ident, hello, meta, takeover):
                return
            if b.links.is_current(owner):
                session_id = None                # another key's session: this one is not resumable
        if link is not None:
            b.remove_link(link, "hello again")      # a resync starts from nothing
        self._kicked.discard(ident)
        self._gone.pop(ident, None)
        name = str(hello.get("name", ""))[:100] or ident.hex()
        link = kind(b.links.new_id(), ident, name, self.sock, bool(hello.get("pub")))
        link.address = meta.get("Peer-Address") or None
        link.acks = hello.get("ack") is True       # it acknowledges WANT and filters under a lease
        link.headers = hello.get("headers") is True   # it reads headers (docs/BATCH_FORMAT.md)
        link.headers_again = hello.get("headers_again") is True   # ... and repeats of a record's block
        link.groups = hello.get("groups") is True     # (a downstream broker) it takes queue group ops
        linger = b.config.durable_linger if durable is not None else b.config.session_linger
        if session_id is not None and linger > 0:
            link.session_id = session_id
            link.user_id = meta.get("User-Id") or None
            link.linger = linger
            if durable is not None:
                link.durable = durable
                link.claim = hello.get("claim")
        b.add_link(link)
        if link.session_id is not None and b.journal is not None and not link.is_broker:
            # (A downstream broker's session is not journaled: after a
            # restart it starts over, sending its whole want set.)
            b.journal.opened(link)
        log.info("peer %s joined (%s, link %d%s%s)", name, link.role, link.link,
                 ", publisher" if link.publisher else "",
                 f", durable {durable!r}" if link.durable else ", resumable" if link.session_id else "")
        send = b.sender.send
        cfg = b.config
        welcome = self._welcome(link)
        if link.session_id is not None:
            welcome["resumed"] = False           # (a new session: its client subscribes again)
            expired = self._expired.pop(link.session_id, None)
            if expired is not None:
                welcome["expired"] = {"linger": expired[1], "lost": expired[0]}
        if link.acks:
            welcome["lease_us"] = b.lease_grant_us()     # the answer to its HELLO, as a PONG is to a PING
            b.relay.grant(link.link, welcome["lease_us"])
        send(link, [P.WELCOME, P.dump_json(welcome)])
        if link.is_broker or link.filters:
            send(link, b.interest.want_reset(link))
            if link.filters and b.sender.paused:
                send(link, [P.FLOW, P.FLOW_PAUSE])

    def _welcome(self, link: Session) -> dict:
        """What a WELCOME says to a session (its limits, what this broker does)."""
        cfg = self.b.config
        return {"v": P.VERSION, "instance": self.b.instance.decode(), "name": cfg.name,
                "globs": True,                # SUB may hold glob ops (flags bit 2)
                "groups": True,               # SUB may hold queue group ops (flags bit 3)
                "held": True,                 # ... and held group declarations (flags bit 4)
                "bind": True,                 # ... and bindings to held groups (flags bit 5)
                "bye": True,                  # BYE is answered with BYE once the peer is forgotten
                "headers": True,              # batches may carry headers (flag bit 1)
                "headers_again": True,        # ... and repeats of the block before (flag bit 2)
                # A resumable session outlives its connection this long.
                "linger": link.linger if link.session_id is not None else cfg.session_linger,
                "limits": {"max_topic": cfg.max_topic, "max_payload": cfg.max_payload,
                           "max_message_bytes": cfg.max_message_bytes,
                           "max_subscriptions": cfg.max_subscriptions,
                           "max_subscription_bytes": cfg.max_subscription_bytes,
                           "max_sub_ops": cfg.max_sub_ops}}

    def _session_id(self, hello: dict, kind) -> str | None:
        """The session a client's or a downstream broker's HELLO names (to
        open it, or to resume it), or None: peers that name none start a
        session that ends with its connection."""
        sid = hello.get("session")
        if sid is None or not (kind is ClientLink or kind.is_broker):
            return None
        if not P.valid_session_id(sid):
            raise P.ProtocolError(f"a session id is {P.SESSION_ID_CHARS} hex digits")
        return sid

    def _durable(self, hello: dict, kind) -> str | None:
        """The durable subscriber's name a HELLO presents, or None (checked:
        a subscribing client's, with its process's claim)."""
        name = hello.get("durable")
        if name is None:
            return None
        if kind is not ClientLink or hello.get("pub"):
            raise P.ProtocolError("only a subscriber's session may be durable")
        if not P.valid_durable_name(name):
            raise P.ProtocolError(f"a durable name is 1 to {P.DURABLE_NAME_CHARS} printable characters")
        if not P.valid_session_id(hello.get("claim")):
            raise P.ProtocolError(f"a durable subscriber's claim is {P.SESSION_ID_CHARS} hex digits")
        return name

    def _refuse_durable(self, ident: bytes, link: Session | None, name: str, reason: str,
                        in_use: bool = False) -> None:
        """KICK a HELLO that may not have the durable session it names: its
        client raises (DurableNameInUse), and does not try again."""
        log.warning("refused durable subscriber %r: %s", name, reason)
        if link is not None:
            self.b.remove_link(link, "hello again")
        self._reply(ident, [P.KICK, P.dump_json({"reason": reason, "durable": name,
                                                "durable_in_use": in_use, "refused": True})])

    def _consumed(self, link: Session, taken: int) -> None:
        """A durable subscriber's process took its stream up to ``taken``:
        what that covers is no longer kept, and a process that takes the
        name over starts there."""
        if taken > link.consumed:
            link.consumed = taken
            self.b.relay.trim(link.link, taken)
            if self.b.journal is not None:
                self.b.journal.taken(link, taken)

    def _resume(self, link: Session, ident: bytes, hello: dict, meta: dict, takeover: bool = False) -> bool:
        """A client back for its session (on a new connection, or on the one
        it has: it cannot tell that the broker never saw its old one go):
        WELCOME says so, then what it missed, in order, once (a GAP first
        of what the ring no longer held), then the live stream.  False
        (a new session instead) if its key is not the session's or what it
        says it took is not what it was sent."""
        b = self.b
        taken = hello.get("taken", 0)
        why = ("opened with another key" if (meta.get("User-Id") or None) != link.user_id else
               "not the same kind of session" if bool(hello.get("pub")) != link.publisher else None)
        if why is not None:
            b.drops["resume_refused"] += 1
            log.warning("peer %s: a resume of session %s... refused: %s", str(hello.get("name", ""))[:100],
                        link.session_id[:8], why)
            return False
        if not isinstance(taken, int) or isinstance(taken, bool) or taken < 0:
            raise P.ProtocolError("HELLO's taken is a count (an integer >= 0)")
        link.headers = hello.get("headers") is True      # (the resuming process's own)
        link.headers_again = hello.get("headers_again") is True
        b.router.set_headers(link.link, link.headers, link.headers_again)
        if takeover:
            # Another process presents a durable name: the stream goes on
            # from what the last one took (its TAKEN; what it had read and
            # not taken comes again), and it holds the name from now on.
            consumed = min(link.consumed, b.relay.resume_state(link.link)[1])
            # From the start of the batch it stopped in (the new process
            # drops the ``skip`` records of it the last one took).
            start = b.relay.ring_from(link.link)
            taken = start if start <= consumed else consumed
            link.claim = hello.get("claim")
            b.counters["durable_taken_over"] += 1
            if b.journal is not None:
                b.journal.opened(link)           # (its new claim)
        welcome = self._welcome(link)
        welcome["resumed"] = True
        welcome["confirmed"] = link.confirmed
        if takeover:
            welcome["taken"] = taken
            welcome["skip"] = consumed - taken
        welcome["received"] = b.relay.received(link.link)
        if link.acks:
            welcome["lease_us"] = b.lease_grant_us()
            b.relay.grant(link.link, welcome["lease_us"])
        was = link.ident
        b.links.rebind(link, ident)
        self._kicked.discard(ident)
        self._gone.pop(ident, None)
        try:
            replayed, lost = b.relay.resume(link.link, ident, taken, [P.WELCOME, P.dump_json(welcome)])
            link.took = taken
        except ValueError as exc:               # it says it took more than it was sent
            b.links.rebind(link, was)
            b.drops["resume_refused"] += 1
            log.warning("%s: resume refused: %s", link.name, exc)
            b.remove_link(link, f"resume refused: {exc}")
            return False
        if link.is_broker or link.filters:
            # What subscribers want now, whatever its view missed, and the flow state.
            b.sender.send(link, b.interest.want_reset(link))
            if link.filters and b.sender.paused:
                b.sender.send(link, [P.FLOW, P.FLOW_PAUSE])
        away = 0.0 if link.detached_at is None else time.monotonic() - link.detached_at
        link.detached_at = None
        b.router.set_away(link.link, False)
        b.interest.resumed(link)                 # (what its held groups kept meanwhile)
        link.address = meta.get("Peer-Address") or link.address
        b.counters["sessions_resumed"] += 1
        b.counters["messages_replayed"] += replayed
        b.counters["resume_lost"] += lost
        log.info("peer %s resumed its session (link %d) after %.3f s: %d messages sent again%s", link.name,
                 link.link, away, replayed, f", {lost} lost past the bound (GAP)" if lost else "")
        return True

    def _may_be_broker(self, meta: dict) -> bool:
        """May this connection be a downstream broker?  With CURVE and a
        broker key list, its key must be on it; else its address must be
        allowed (BrokerConfig.allow_brokers)."""
        cfg = self.b.config
        if cfg.curve_allowed_brokers is not None:
            return (meta.get("User-Id") or "") in self._broker_keys
        return broker_allowed(self._broker_nets, meta.get("Peer-Address"))

    def _oversize(self, link: Session, n: int) -> None:
        """Records of a sender's batch over the size limits were not routed
        (the rest were): count them, and tell the sender."""
        b = self.b
        cfg = b.config
        b.drops["oversize"] += n
        reason = (f"{n} message{'s' if n != 1 else ''} over the broker's limits (max_payload {cfg.max_payload:,} "
                  f"bytes, max_topic {cfg.max_topic:,}) were dropped")
        log.warning("%s: %s", link.name, reason)
        b.sender.send(link, [P.NOTICE, P.dump_json({"dropped": n, "reason": reason})])

    # -- replies outside sessions ------------------------------------------

    def _hello_required(self, ident: bytes) -> None:
        """KICK a peer without a session, once: once it went (a peer whose
        socket is full, a slow consumer just dropped, is told at its next
        message, its ping at the latest, and never left believing it is
        still subscribed)."""
        if ident in self._kicked:
            return
        if len(self._kicked) > 10000:
            self._kicked.clear()
        reason = self._gone.get(ident)
        if self._reply(ident, [P.KICK, P.dump_json({"reason": f"disconnected: {reason}" if reason
                                                    else "hello required"})]):
            self._kicked.add(ident)
            self._gone.pop(ident, None)

    def _reply(self, ident: bytes, frames: list) -> bool:
        """An answer outside a session's queue, through the data plane (at
        once, or not at all: False)."""
        return self.b.relay.reply(ident, frames)

    def _protocol_error(self, ident: bytes, exc: Exception) -> None:
        b = self.b
        if not isinstance(exc, BatchError):       # a refused batch the router counted (drops.malformed)
            b.drops["protocol"] += 1
        link = b.links.by_ident.get(ident)
        log.warning("dropping %s: %s", link.name if link else ident.hex(), exc)
        self._reply(ident, [P.KICK, P.dump_json({"reason": f"protocol error: {exc}"})])
        if link is not None:
            b.remove_link(link, f"protocol error: {exc}")

    def expired(self, link: Session, lost: int) -> None:
        """A lingering session ran out (``lost``: the messages that waited
        for it): said to its client if it comes back (WELCOME's "expired")."""
        if link.session_id is not None:
            if len(self._expired) > 10000:
                self._expired.clear()
            self._expired[link.session_id] = (lost, link.linger)

    def forget(self, link: Session, reason: str) -> None:
        """A session that left: remember why, to tell it if it comes back."""
        if reason != "bye":
            if len(self._gone) > 10000:
                self._gone.clear()
            self._gone[link.ident] = reason
