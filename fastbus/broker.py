"""The fastbus broker: batched pub/sub over ZeroMQ with diff-only
subscription forwarding, federation and publisher-side filtering.

One thread runs :meth:`Broker.run`: a poll loop over a ROUTER socket bound to
every client endpoint, plus the optional upstream link and the plain-ZeroMQ
compatibility sockets.  Per-message work is in C: ``Router.route`` decodes a
received batch, matches it against the subscription trie and appends every
record to the outbox of every matching link; the loop then sends the outboxes
that are due.

Links are the broker's neighbours: clients, downstream brokers, the upstream
broker, the compatibility sockets.  Each has a dense id, which is its
subscriber id in the routing trie.  What a link wants is what it subscribed;
for the upstream link, it is the upstream broker's want set for us.  A
message arriving on a link goes to every other link that wants it (split
horizon), so in a tree of brokers a message crosses each link at most once.

What the broker wants from its neighbours is computed by forwarders
(``fastbus.Forwarder``, subsume mode): one over all links, whose diffs go to
publishing clients so they drop unwanted messages before the network, and
one per broker link over all *other* links, whose diffs are our subscriptions
on that link.  docs/PROTOCOL.md describes the frames.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import zmq

from fastbus import protocol as P
from fastbus._core import SUBSCRIBE, UNSUBSCRIBE, Forwarder, Outbox, Router, Trie, decode, encode
from fastbus.errors import BatchError, NotSubscribedError

log = logging.getLogger("fastbus.broker")

SLOW_POLICIES = ("drop", "disconnect")
RECV_BUDGET = 256           # messages taken from one socket per loop turn


@dataclass
class BrokerConfig:
    """Settings of a broker.  Every field has a working default: a broker on
    ``tcp://127.0.0.1:6464`` that only accepts loopback endpoints."""

    bind: list[str] = field(default_factory=lambda: [P.DEFAULT_ENDPOINT])
    #: Bind TCP endpoints on non-loopback addresses too.
    allow_remote: bool = False
    #: Endpoint of an upstream broker to federate with.
    upstream: str | None = None
    #: Plain-ZeroMQ compatibility: XPUB for SUB sockets, XSUB for PUB sockets,
    #: PULL for PUSH sockets; messages are two frames, [channel, payload].
    zmq_pub: list[str] = field(default_factory=list)
    zmq_sub: list[str] = field(default_factory=list)
    zmq_pull: list[str] = field(default_factory=list)
    #: Per-subscriber batching: a batch goes out at this many records, bytes,
    #: or this age of its oldest record.
    max_messages: int = 4096
    max_bytes: int = 256 * 1024
    max_delay: float = 0.001
    #: Slow consumers: bytes of batches queued for one subscriber beyond its
    #: socket buffer; then "drop" (oldest first, with a gap notice) or
    #: "disconnect".
    max_queue_bytes: int = 32 * 1024 * 1024
    slow_policy: str = "drop"
    #: Flow control: when this many bytes are queued for one subscriber, the
    #: publishers connected here are asked to pause until every such queue
    #: is down to a quarter of it; their buffers then fill and publish()
    #: blocks (Client.max_buffer_bytes), instead of the broker's queues
    #: growing to the slow-consumer limit: end to end, nothing is dropped
    #: for a subscriber that is slower than the publishers.  One that takes
    #: nothing for flow_max_pause seconds (stuck, not slow) no longer holds
    #: them back until it catches up; the slow-consumer policy applies to it.  0: no flow control; None:
    #: 4 MiB or a quarter of max_queue_bytes, whichever is less.
    flow_pause_bytes: int | None = None
    flow_max_pause: float = 5.0
    #: Limits on what a peer may send.
    max_topic: int = 65535
    max_payload: int = 16 * 1024 * 1024
    max_message_bytes: int = 64 * 1024 * 1024
    max_subscriptions: int = 1_000_000
    #: How often idle peers are probed (a dead one fails the probe), and the
    #: TCP keepalive idle time (seconds) that finds half-open connections.
    probe_interval: float = 1.0
    heartbeat_timeout: float = 5.0
    #: CURVE: the broker's secret key (Z85, with its public key) and the
    #: public keys of the clients it accepts.
    curve_secret_key: str | None = None
    curve_public_key: str | None = None
    curve_allowed: list[str] | None = None
    name: str = "fastbus"
    #: Log a line of counters every this many seconds (0: never).
    stats_interval: float = 0.0

    def check(self) -> None:
        """Raise ValueError on a setting that cannot work."""
        if not self.bind:
            raise ValueError("the broker needs at least one endpoint to bind")
        for ep in [*self.bind, *self.zmq_pub, *self.zmq_sub, *self.zmq_pull]:
            check_endpoint(ep, self.allow_remote)
        if self.slow_policy not in SLOW_POLICIES:
            raise ValueError(f"slow_policy must be one of {SLOW_POLICIES}, not {self.slow_policy!r}")
        for name in ("max_messages", "max_bytes", "max_queue_bytes", "max_topic", "max_payload",
                     "max_message_bytes", "max_subscriptions"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not 0 < self.max_delay <= 10:
            raise ValueError("max_delay must be between 0 and 10 seconds")
        if self.flow_pause_bytes is not None and (
                self.flow_pause_bytes < 0 or
                (self.flow_pause_bytes and self.flow_pause_bytes >= self.max_queue_bytes)):
            raise ValueError("flow_pause_bytes must be 0 (no flow control) or less than max_queue_bytes")
        if not 0 < self.flow_max_pause <= 600:
            raise ValueError("flow_max_pause must be between 0 and 600 seconds")
        if self.stats_interval < 0:
            raise ValueError("stats_interval must be >= 0 (0: no periodic log)")
        if not 0 < self.probe_interval <= 60 or not 0 < self.heartbeat_timeout <= 600:
            raise ValueError("probe_interval and heartbeat_timeout must be positive (seconds)")
        if (self.curve_secret_key is None) != (self.curve_public_key is None):
            raise ValueError("CURVE needs both curve_secret_key and curve_public_key")
        if self.curve_allowed is not None and self.curve_secret_key is None:
            raise ValueError("curve_allowed needs curve_secret_key and curve_public_key")


def check_endpoint(endpoint: str, allow_remote: bool) -> None:
    """Reject a malformed endpoint, or a non-loopback TCP one unless allowed."""
    scheme = endpoint.split("://", 1)[0] if "://" in endpoint else ""
    if scheme in ("ipc", "inproc"):
        return
    if scheme != "tcp":
        raise ValueError(f"unsupported endpoint {endpoint!r}: use tcp://, ipc:// or inproc://")
    parts = urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad port in {endpoint!r}") from exc
    host = parts.hostname
    if not host or port is None:
        raise ValueError(f"endpoint {endpoint!r} needs a host and a port, e.g. tcp://127.0.0.1:6464")
    if allow_remote:
        return
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"{endpoint!r} is not a loopback address; pass allow_remote=True "
                     f"(--allow-remote) to listen beyond this machine")


class Peer:
    """A link the broker talks to over its ROUTER socket (a client or a
    downstream broker), or over its own socket (the upstream broker)."""

    __slots__ = ("link", "ident", "role", "publisher", "name", "acked_seq", "queue", "queued_bytes",
                 "lost", "last_sent", "forwarder", "subs", "sock", "flow_exempt")

    def __init__(self, link: int, ident: bytes | None, role: str, publisher: bool, name: str, sock):
        self.link = link
        self.ident = ident
        self.role = role                  # "client" | "broker" | "upstream" | "zmq-pub"
        self.publisher = publisher
        self.name = name
        self.acked_seq = 0
        self.queue: deque = deque()       # (frames, records or 0 for control)
        self.queued_bytes = 0
        self.lost = 0                     # data records dropped, not yet reported
        self.last_sent = 0.0
        self.forwarder: Forwarder | None = None   # broker links: our subscriptions there
        self.subs = 0
        self.sock = sock
        self.flow_exempt = False          # held publishers back too long: no longer does

    def describe(self) -> dict:
        return {"link": self.link, "role": self.role, "name": self.name, "publisher": self.publisher,
                "subscriptions": self.subs, "queued_bytes": self.queued_bytes}


class Broker:
    """A fastbus broker.  ``Broker(config).run()`` serves in the calling
    thread until :meth:`stop`; ``start()`` runs it in a background thread,
    and the broker is a context manager::

        with Broker(BrokerConfig(bind=["tcp://127.0.0.1:6464"])) as b:
            ...   # clients connect to tcp://127.0.0.1:6464
    """

    def __init__(self, config: BrokerConfig | None = None, *, context: zmq.Context | None = None,
                 **overrides) -> None:
        config = config or BrokerConfig()
        for k, v in overrides.items():
            if not hasattr(config, k):
                raise TypeError(f"unknown broker setting {k!r}")
            setattr(config, k, v)
        config.check()
        self.config = config
        self.instance = P.new_instance_id()
        self._ctx = context or zmq.Context.instance()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self._stop_requested = False
        self._wake_addr = f"inproc://fastbus-broker-wake-{id(self):x}"
        self._wake_send: zmq.Socket | None = None
        self._stats_lock = threading.Lock()
        self._stats_snapshot: dict = {}
        self.endpoints: list[str] = []    # the bound endpoints, ports resolved

    # -- lifecycle ---------------------------------------------------------

    def start(self, timeout: float = 10.0) -> Broker:
        """Run in a background thread; returns once the sockets are bound."""
        if self._thread is not None:
            raise RuntimeError("broker already started")
        self._thread = threading.Thread(target=self._thread_main, name=f"fastbus-broker-{self.config.name}",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("broker did not start")
        if self._error is not None:
            raise self._error
        return self

    def _thread_main(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # reported by start() or stop()
            self._error = exc
            self._ready.set()

    def request_stop(self) -> None:
        """Ask the loop to finish (safe from a signal handler); returns at once."""
        self._stop_requested = True
        try:
            s = self._ctx.socket(zmq.PAIR)
            s.linger = 0
            s.connect(self._wake_addr)
            s.send(b"stop", zmq.NOBLOCK)
            s.close()
        except zmq.ZMQError:
            pass

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (from any thread) and wait: pending batches are sent
        first."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError("broker did not stop")
        if self._error is not None and not isinstance(self._error, KeyboardInterrupt):
            raise self._error

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """The first bound client endpoint (with the real port if 0 was asked)."""
        return self.endpoints[0]

    def stats(self) -> dict:
        """A snapshot of the counters (updated by the loop, thread-safe)."""
        with self._stats_lock:
            return dict(self._stats_snapshot)

    # -- setup -------------------------------------------------------------

    def _setup(self) -> None:
        cfg = self.config
        ctx = self._ctx
        self._trie = Trie()
        self._router = Router(self._trie, max_messages=cfg.max_messages, max_bytes=cfg.max_bytes,
                              max_delay=cfg.max_delay, max_topic=cfg.max_topic, max_payload=cfg.max_payload)
        self._fwd_all = Forwarder("subsume")
        self._peers: dict[bytes, Peer] = {}          # by routing id
        self._links: dict[int, Peer] = {}            # by link id
        self._free_links: list[int] = []
        self._next_link = 1
        self._blocked: set[int] = set()              # links with queued frames
        self._holding: set[int] = set()              # links whose queue has publishers paused
        self._flow_bytes = cfg.flow_pause_bytes if cfg.flow_pause_bytes is not None else \
            min(4 << 20, cfg.max_queue_bytes // 4)
        self._flow_paused = False
        self._pause_started = 0.0
        self._kicked: set[bytes] = set()             # unknown peers already asked to say hello
        self._gone: dict[bytes, str] = {}             # removed peers -> why, told when they reappear
        self._sock_handlers: dict = {}
        self.counters = dict.fromkeys([
            "batches_in", "messages_in", "bytes_in", "batches_out", "messages_out", "bytes_out",
            "peers_joined", "peers_left", "subscribe_ops", "unsubscribe_ops", "control_in",
            "flow_pauses", "flow_timeouts"], 0)
        self.drops = dict.fromkeys([
            "slow_consumer", "unrouted", "malformed", "protocol", "unknown_peer", "not_subscribed",
            "too_many_subscriptions", "disconnected_slow", "unreachable", "internal"], 0)
        self._started = time.monotonic()
        self._next_stats_log = self._started + (self.config.stats_interval or 0)

        self._wake = ctx.socket(zmq.PAIR)
        self._wake.bind(self._wake_addr)

        r = self._sock = ctx.socket(zmq.ROUTER)
        r.router_mandatory = 1
        r.linger = 1000
        # Batches held by libzmq per peer.  Small, so that a stalled subscriber
        # soon shows up as EAGAIN and our own accounted queue and slow-consumer
        # policy take over (16 x max_bytes, plus the kernel's socket buffers).
        r.sndhwm = 16
        r.rcvhwm = 1000
        r.maxmsgsize = cfg.max_message_bytes
        # No ZMTP heartbeat timeouts: heartbeats share the data stream, so a
        # subscriber that is merely slow (not reading) would be cut off as
        # dead, losing its gap count.  A dead process closes its connection
        # (found by the next probe); a slow one is the slow-consumer policy's;
        # TCP keepalive finds half-open connections.
        r.tcp_keepalive = 1
        r.tcp_keepalive_idle = int(cfg.heartbeat_timeout)
        r.tcp_keepalive_intvl = max(1, int(cfg.probe_interval))
        r.tcp_keepalive_cnt = 3
        self._auth = None
        if cfg.curve_secret_key:
            r.curve_server = True
            r.curve_secretkey = cfg.curve_secret_key.encode()
            r.curve_publickey = cfg.curve_public_key.encode()
            if cfg.curve_allowed is not None:
                from zmq.auth.thread import ThreadAuthenticator
                allowed = {k.encode() if isinstance(k, str) else k for k in cfg.curve_allowed}
                self._auth = ThreadAuthenticator(ctx, log=logging.getLogger("fastbus.broker.auth"))
                self._auth.start()
                # The provider is looked up by the socket's exact ZAP domain.
                self._auth.configure_curve_callback("fastbus", credentials_provider=_AllowedKeys(allowed))
                r.zap_domain = b"fastbus"
        for ep in cfg.bind:
            r.bind(ep)
            self.endpoints.append(r.last_endpoint.decode())
        self._sock_handlers[r] = self._on_router

        self._upstream: Peer | None = None
        self._up_seq = 0
        self._up_instance = b""
        self._up_next_ping = 0.0
        if cfg.upstream:
            self._connect_upstream()

        self._xpub_peer: Peer | None = None
        if cfg.zmq_pub:
            xs = ctx.socket(zmq.XPUB)
            xs.xpub_verboser = 1          # every (un)subscribe, so counts stay right
            xs.xpub_nodrop = 1
            xs.linger = 0
            for ep in cfg.zmq_pub:
                xs.bind(ep)
            self._xpub_peer = self._add_peer(None, "zmq-pub", False, "zmq-pub", xs)
            self._sock_handlers[xs] = self._on_xpub
        self._compat_in = Outbox(max_messages=cfg.max_messages, max_bytes=cfg.max_bytes, max_delay=None)
        self._compat_link = self._alloc_link()   # the source of messages from plain ZeroMQ publishers
        for eps, kind in ((cfg.zmq_sub, zmq.XSUB), (cfg.zmq_pull, zmq.PULL)):
            if eps:
                s = ctx.socket(kind)
                s.linger = 0
                s.maxmsgsize = cfg.max_message_bytes
                for ep in eps:
                    s.bind(ep)
                if kind == zmq.XSUB:
                    s.send(b"\x01")        # everything: plain publishers are not filtered
                self._sock_handlers[s] = lambda s=s: self._on_compat_in(s)
        self._publish_stats()

    def _connect_upstream(self) -> None:
        s = self._ctx.socket(zmq.DEALER)
        s.linger = 0
        s.sndhwm = 1000
        s.tcp_keepalive = 1
        s.reconnect_ivl = 100
        s.reconnect_ivl_max = 2000
        s.connect(self.config.upstream)
        peer = self._add_peer(None, "upstream", True, "upstream", s)
        self._upstream = peer
        self._sock_handlers[s] = self._on_upstream
        self._upstream_hello()

    # -- links -------------------------------------------------------------

    def _alloc_link(self) -> int:
        if self._free_links:
            return self._free_links.pop()
        link = self._next_link
        self._next_link += 1
        return link

    def _add_peer(self, ident, role, publisher, name, sock) -> Peer:
        link = self._alloc_link()
        peer = Peer(link, ident, role, publisher, name, sock)
        self._links[link] = peer
        if ident is not None:
            self._peers[ident] = peer
        self._router.add_link(link)
        if role in ("broker", "upstream"):
            # What we want from this link: everything every other link wants.
            fwd = Forwarder("subsume")
            for other in self._links.values():
                if other.link != link:
                    for key, prefix, refs in self._trie.subscriber_keys(other.link):
                        for _ in range(refs):
                            fwd.subscribe(other.link, key, prefix=prefix)
            peer.forwarder = fwd
        self.counters["peers_joined"] += 1
        return peer

    def _remove_peer(self, peer: Peer, reason: str) -> None:
        if self._links.get(peer.link) is not peer:
            return
        log.info("peer %s (%s, link %d) left: %s", peer.name, peer.role, peer.link, reason)
        self._trie.remove_subscriber(peer.link)
        self._emit_all(self._fwd_all.remove_peer(peer.link))
        for other in list(self._links.values()):
            if other.forwarder is not None and other is not peer:
                self._emit_link(other, other.forwarder.remove_peer(peer.link))
        self._router.remove_link(peer.link)
        del self._links[peer.link]
        if peer.ident is not None:
            self._peers.pop(peer.ident, None)
        self._blocked.discard(peer.link)
        self._holding.discard(peer.link)
        if self._flow_paused and not self._holding:
            self._set_flow(False)
        self._free_links.append(peer.link)
        self.counters["peers_left"] += 1
        if peer.ident is not None and reason != "bye":
            if len(self._gone) > 10000:
                self._gone.clear()
            self._gone[peer.ident] = reason

    # -- subscriptions -----------------------------------------------------

    def _apply_ops(self, peer: Peer, ops) -> None:
        """(Un)subscriptions of a link: routing trie, then the forwarders."""
        diff_all = []
        diffs: dict[int, list] = {}
        for op, key, prefix in ops:
            if op == SUBSCRIBE:
                if peer.subs >= self.config.max_subscriptions and peer.role == "client":
                    self.drops["too_many_subscriptions"] += 1
                    continue
                self._trie.add(key, peer.link, prefix=prefix)
                peer.subs += 1
                self.counters["subscribe_ops"] += 1
                diff_all += self._fwd_all.subscribe(peer.link, key, prefix=prefix)
            else:
                try:
                    self._trie.remove(key, peer.link, prefix=prefix)
                except NotSubscribedError:
                    self.drops["not_subscribed"] += 1
                    continue
                peer.subs -= 1
                self.counters["unsubscribe_ops"] += 1
                diff_all += self._fwd_all.unsubscribe(peer.link, key, prefix=prefix)
            for other in self._links.values():
                if other.forwarder is not None and other is not peer:
                    f = other.forwarder
                    d = f.subscribe(peer.link, key, prefix=prefix) if op == SUBSCRIBE else \
                        f.unsubscribe(peer.link, key, prefix=prefix)
                    if d:
                        diffs.setdefault(other.link, []).extend(d)
        self._emit_all(diff_all)
        for link, d in diffs.items():
            other = self._links.get(link)
            if other is not None:
                self._emit_link(other, d)

    def _emit_all(self, diff: list) -> None:
        """Tell the publishing clients what is now (un)wanted."""
        if not diff:
            return
        frame = P.encode_ops(diff)
        # A snapshot: a send may find another peer dead and remove it.
        for peer in list(self._links.values()):
            if peer.publisher and peer.role == "client" and self._links.get(peer.link) is peer:
                self._send(peer, [P.WANT, b"\x00", frame])

    def _emit_link(self, peer: Peer, diff: list) -> None:
        """A broker link: our want set changed."""
        if not diff:
            return
        if peer.role == "upstream":
            self._up_seq += 1
            self._send(peer, [P.SUB, P.pack_u64(self._up_seq), P.encode_ops(diff)])
        else:
            self._send(peer, [P.WANT, b"\x00", P.encode_ops(diff)])

    def _set_link_wants(self, peer: Peer, wanted: set, reset: bool) -> None:
        """The upstream link's subscriptions become its want set: apply the
        difference, subscriptions first so nothing is dropped in between."""
        current = {(k, p) for k, p, _refs in self._trie.subscriber_keys(peer.link)}
        add = [(SUBSCRIBE, k, p) for k, p in wanted - current]
        rem = [(UNSUBSCRIBE, k, p) for k, p in current - wanted] if reset else []
        self._apply_ops(peer, add + rem)

    # -- sending -----------------------------------------------------------

    def _send(self, peer: Peer, frames: list, records: int = 0) -> None:
        """Send now if the peer keeps up, else queue; records > 0 marks data
        that the slow-consumer policy may drop."""
        if peer.queue or peer.lost:
            # Behind others already queued, or behind a pending loss notice.
            self._enqueue(peer, frames, records)
            return
        if not self._try_send(peer, frames):
            self._enqueue(peer, frames, records)

    def _try_send(self, peer: Peer, frames: list) -> bool:
        sock = peer.sock
        try:
            if peer.ident is not None:
                # ROUTER_MANDATORY: EAGAIN if this peer's pipe is full,
                # EHOSTUNREACH if it is gone, both on the routing-id frame.
                sock.send_multipart([peer.ident, *frames], zmq.NOBLOCK, copy=False)
            elif peer.role == "zmq-pub":
                return self._send_xpub(frames)
            else:
                sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                self.drops["unreachable"] += 1
                self._remove_peer(peer, "unreachable")
                return True
            raise
        peer.last_sent = time.monotonic()
        return True

    def _enqueue(self, peer: Peer, frames: list, records: int) -> None:
        size = sum(len(f) for f in frames)
        peer.queue.append((frames, records, size))
        peer.queued_bytes += size
        self._blocked.add(peer.link)
        flow = self._flow_bytes
        if records and flow and peer.queued_bytes > flow and not peer.flow_exempt and \
                peer.link not in self._holding:
            self._holding.add(peer.link)
            if not self._flow_paused:
                self._set_flow(True)
        if peer.queued_bytes <= self.config.max_queue_bytes:
            return
        if self.config.slow_policy == "disconnect":
            self.drops["disconnected_slow"] += 1
            peer.queue.clear()
            peer.queued_bytes = 0
            if peer.ident is not None:
                try:
                    self._try_send(peer, [P.KICK, P.dump_json({"reason": "slow consumer"})])
                except zmq.ZMQError:
                    pass
            self._remove_peer(peer, "slow consumer")
            return
        # drop the oldest data batches until under the limit; control stays
        kept = deque()
        while peer.queue and peer.queued_bytes > self.config.max_queue_bytes:
            f, recs, sz = peer.queue.popleft()
            if recs:
                peer.lost += recs
                peer.queued_bytes -= sz
                self.drops["slow_consumer"] += recs
            else:
                kept.append((f, recs, sz))
        peer.queue.extendleft(reversed(kept))

    def _drain_queues(self) -> None:
        for link in list(self._blocked):
            peer = self._links.get(link)
            if peer is None:
                self._blocked.discard(link)
                continue
            while True:
                if peer.lost and (not peer.queue or peer.queue[0][1]):
                    # A loss is reported before the data that follows it.
                    if not self._try_send(peer, [P.GAP, P.pack_u64(peer.lost)]):
                        break
                    peer.lost = 0
                if not peer.queue:
                    break
                frames, _recs, size = peer.queue[0]
                if not self._try_send(peer, frames) or self._links.get(link) is not peer:
                    break
                peer.queue.popleft()
                peer.queued_bytes -= size
            if peer.queued_bytes <= self._flow_bytes // 4:
                self._holding.discard(link)
                peer.flow_exempt = False
            if not peer.queue and not peer.lost:
                self._blocked.discard(link)
        if self._flow_paused and not self._holding:
            self._set_flow(False)

    def _set_flow(self, paused: bool) -> None:
        """Ask the publishers connected here to pause or resume."""
        self._flow_paused = paused
        if paused:
            self._pause_started = time.monotonic()
            self.counters["flow_pauses"] += 1
        for peer in list(self._links.values()):
            if peer.publisher and peer.role == "client":
                self._send(peer, [P.FLOW, P.FLOW_PAUSE if paused else P.FLOW_RESUME])

    def _check_flow(self, now: float) -> None:
        """A subscriber that took nothing for flow_max_pause seconds while
        publishers waited for it is stuck: it stops holding them back."""
        limit = self.config.flow_max_pause
        if not self._flow_paused or now - self._pause_started < limit:
            return
        for link in list(self._holding):
            peer = self._links.get(link)
            if peer is None:
                self._holding.discard(link)
            elif now - max(peer.last_sent, self._pause_started) >= limit:
                peer.flow_exempt = True
                self._holding.discard(link)
                self.counters["flow_timeouts"] += 1
                log.warning("subscriber %s (link %d) took nothing for %.1f s while publishers waited; "
                            "it no longer holds them back (%d bytes queued for it)", peer.name, link,
                            now - max(peer.last_sent, self._pause_started), peer.queued_bytes)
        if not self._holding:
            self._set_flow(False)

    def _flush_link(self, link: int) -> None:
        peer = self._links.get(link)
        batch = self._router.take(link)
        if batch is None or peer is None:
            return
        n = batch.count
        self.counters["batches_out"] += 1
        self.counters["messages_out"] += n
        self.counters["bytes_out"] += len(batch)
        if peer.role == "upstream":
            self._send(peer, [P.PUB, batch], n)
        elif peer.role == "zmq-pub":
            self._send(peer, [batch], n)
        else:
            self._send(peer, [P.DATA, P.pack_u64(peer.acked_seq), batch], n)

    def _flush_due(self, everything: bool = False) -> None:
        while True:
            links = self._router.pending() if everything else self._router.due()
            if not links:
                return
            for link in links:
                self._flush_link(link)

    def _send_xpub(self, frames: list) -> bool:
        """A batch for the plain-ZeroMQ subscribers: one [channel, payload]
        message per record (XPUB does the per-subscriber filtering).  If the
        socket fills up, frames[0] becomes the unsent rest, for later."""
        xs = self._xpub_peer.sock
        records = decode(frames[0])
        for i, (topic, payload) in enumerate(records):
            try:
                xs.send_multipart([topic, payload], zmq.NOBLOCK)
            except zmq.Again:
                frames[0] = encode(records[i:])
                return False
        return True

    # -- receiving ---------------------------------------------------------

    def _on_router(self) -> None:
        sock = self._sock
        for _ in range(RECV_BUDGET):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            ident = frames[0].bytes
            if len(frames) < 2:
                self.drops["protocol"] += 1
                continue
            try:
                self._handle(ident, frames[1].bytes, frames[2:])
            except (P.ProtocolError, BatchError, ValueError) as exc:
                self._protocol_error(ident, exc)

    def _protocol_error(self, ident: bytes, exc: Exception) -> None:
        bad = isinstance(exc, BatchError)
        self.drops["malformed" if bad else "protocol"] += 1
        peer = self._peers.get(ident)
        log.warning("dropping %s: %s", peer.name if peer else ident.hex(), exc)
        try:
            self._sock.send_multipart([ident, P.KICK, P.dump_json({"reason": f"protocol error: {exc}"})],
                                      zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        if peer is not None:
            self._remove_peer(peer, f"protocol error: {exc}")

    def _handle(self, ident: bytes, cmd: bytes, rest: list) -> None:
        peer = self._peers.get(ident)
        if cmd == P.PUB:
            if len(rest) != 1:
                raise P.ProtocolError("PUB takes one batch frame")
            if peer is None:
                # After a broker restart: route what arrives, and ask the
                # sender to introduce itself (once) so it gets its filters.
                self._route(rest[0], None)
                self._hello_required(ident)
                return
            self._route(rest[0], peer.link)
            return
        self.counters["control_in"] += 1
        if cmd == P.HELLO:
            self._on_hello(ident, peer, rest)
        elif cmd == P.PING:
            self._reply(ident, [P.PONG, rest[0].bytes if rest else b"", self.instance])
            if peer is None:
                # A client we dropped (or never met) that is still alive.
                self._hello_required(ident)
        elif cmd == P.STATS:
            self._reply(ident, [P.STATS_REPLY, P.dump_json(self._stats_dict())])
        elif peer is None:
            # Unknown link (e.g. the broker restarted): ask it to say hello.
            self.drops["unknown_peer"] += 1
            self._hello_required(ident)
        elif cmd == P.SUB:
            if len(rest) != 2:
                raise P.ProtocolError("SUB takes a sequence number and an ops batch")
            seq = P.unpack_u64(rest[0])
            ops = P.decode_ops(rest[1], max_key=self.config.max_topic)
            # Batches routed under the old subscriptions go out first, so each
            # data batch is stamped with the subscriptions it was routed with.
            self._flush_link(peer.link)
            self._apply_ops(peer, ops)
            peer.acked_seq = seq
            self._send(peer, [P.CONFIRM, P.pack_u64(seq)])
        elif cmd == P.BYE:
            self._remove_peer(peer, "bye")
        else:
            raise P.ProtocolError(f"unknown command {cmd!r}")

    def _hello_required(self, ident: bytes) -> None:
        if ident in self._kicked:
            return
        if len(self._kicked) > 10000:
            self._kicked.clear()
        self._kicked.add(ident)
        reason = self._gone.pop(ident, None)
        self._reply(ident, [P.KICK, P.dump_json({"reason": f"disconnected: {reason}" if reason else "hello required"})])

    def _reply(self, ident: bytes, frames: list) -> None:
        try:
            self._sock.send_multipart([ident, *frames], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _on_hello(self, ident: bytes, peer: Peer | None, rest: list) -> None:
        if len(rest) != 1:
            raise P.ProtocolError("HELLO takes one JSON frame")
        hello = P.load_json(rest[0])
        if hello.get("v") != P.VERSION:
            self._reply(ident, [P.KICK, P.dump_json({"reason": f"unsupported protocol version {hello.get('v')!r}",
                                                    "version": P.VERSION})])
            return
        role = hello.get("role", "client")
        if role not in ("client", "broker"):
            raise P.ProtocolError(f"unknown role {role!r}")
        self._kicked.discard(ident)
        self._gone.pop(ident, None)
        if peer is not None:
            self._remove_peer(peer, "hello again")   # a resync starts from nothing
        name = str(hello.get("name", ""))[:100] or ident.hex()
        peer = self._add_peer(ident, role, bool(hello.get("pub")), name, self._sock)
        log.info("peer %s joined (%s, link %d%s)", name, role, peer.link, ", publisher" if peer.publisher else "")
        self._send(peer, [P.WELCOME, P.dump_json({"v": P.VERSION, "instance": self.instance.decode(),
                                                  "name": self.config.name})])
        if role == "broker":
            self._send(peer, [P.WANT, bytes([P.WANT_RESET]), P.encode_ops(peer.forwarder.snapshot())])
        elif peer.publisher:
            self._send(peer, [P.WANT, bytes([P.WANT_RESET]), P.encode_ops(self._fwd_all.snapshot())])
            if self._flow_paused:
                self._send(peer, [P.FLOW, P.FLOW_PAUSE])

    def _route(self, batch, source: int | None) -> None:
        n = self._router.route(batch, source=source)
        self.counters["batches_in"] += 1
        self.counters["messages_in"] += n
        self.counters["bytes_in"] += len(batch)
        # Outboxes that reached their size or count go out now, not after the
        # receive loop: under a flood they would otherwise grow without bound.
        self._flush_due()

    def _on_upstream(self) -> None:
        peer = self._upstream
        sock = peer.sock
        for _ in range(RECV_BUDGET):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            cmd = frames[0].bytes
            try:
                if cmd == P.DATA and len(frames) == 3:
                    self._route(frames[2], peer.link)
                elif cmd == P.WANT and len(frames) == 3:
                    self._on_want_upstream(frames[1].bytes, frames[2])
                elif cmd == P.WELCOME:
                    info = P.load_json(frames[1])
                    self._up_instance = str(info.get("instance", "")).encode()
                elif cmd == P.PONG and len(frames) == 3:
                    if frames[2].bytes != self._up_instance:
                        log.info("upstream restarted or reconnected: resending subscriptions")
                        self._upstream_hello()
                elif cmd == P.KICK:
                    log.info("upstream asked for a resync: %s", frames[1].bytes[:200])
                    self._upstream_hello()
                elif cmd in (P.CONFIRM, P.GAP, P.STATS_REPLY, P.PING, P.FLOW):
                    # FLOW: upstream's flow control is for its clients; a
                    # broker keeps forwarding (its own limits apply).
                    if cmd == P.GAP:
                        self.drops["slow_consumer"] += P.unpack_u64(frames[1])
                else:
                    raise P.ProtocolError(f"unexpected {cmd!r} from upstream")
            except (P.ProtocolError, BatchError, ValueError) as exc:
                self.drops["protocol"] += 1
                log.warning("bad message from upstream: %s", exc)

    def _on_want_upstream(self, flags: bytes, frame) -> None:
        ops = P.decode_ops(frame, max_key=self.config.max_topic)
        if flags and flags[0] & P.WANT_RESET:
            self._set_link_wants(self._upstream, {(k, p) for op, k, p in ops if op == SUBSCRIBE}, True)
        else:
            self._apply_ops(self._upstream, ops)

    def _upstream_hello(self) -> None:
        """(Re)introduce ourselves upstream and resend all we want there."""
        peer = self._upstream
        self._up_instance = b""
        # Whatever upstream wanted from us belonged to the old session.
        self._set_link_wants(peer, set(), True)
        peer.queue.clear()
        peer.queued_bytes = 0
        self._blocked.discard(peer.link)
        self._router.remove_link(peer.link)
        self._router.add_link(peer.link)
        self._up_seq += 1
        hello = {"v": P.VERSION, "role": "broker", "pub": True, "name": self.config.name}
        self._send(peer, [P.HELLO, P.dump_json(hello)])
        # What we want from upstream: what every other link wants.
        self._send(peer, [P.SUB, P.pack_u64(self._up_seq), P.encode_ops(peer.forwarder.snapshot())])
        self._send(peer, [P.PING, b"hello"])

    def _on_xpub(self) -> None:
        """Plain ZeroMQ SUB sockets (un)subscribing: prefix keys of the
        zmq-pub link."""
        xs = self._xpub_peer.sock
        ops = []
        for _ in range(RECV_BUDGET):
            try:
                msg = xs.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if not msg or msg[0] not in (0, 1):
                self.drops["protocol"] += 1
                continue
            ops.append((SUBSCRIBE if msg[0] == 1 else UNSUBSCRIBE, msg[1:], True))
        if ops:
            self._apply_ops(self._xpub_peer, ops)

    def _on_compat_in(self, sock) -> None:
        """Messages from plain PUB/PUSH sockets: [channel, payload]."""
        for _ in range(RECV_BUDGET):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) == 2:
                topic, payload = frames
            elif len(frames) == 1:
                topic, payload = frames[0], b""
            else:
                self.drops["protocol"] += 1
                continue
            if len(topic) > self.config.max_topic or len(payload) > self.config.max_payload:
                self.drops["protocol"] += 1
                continue
            if self._compat_in.append(topic, payload):
                self._route(self._compat_in.take(), self._compat_link)
        if len(self._compat_in):
            self._route(self._compat_in.take(), self._compat_link)

    # -- the loop ----------------------------------------------------------

    def run(self) -> None:
        """Serve until stop() (or KeyboardInterrupt)."""
        self._setup()
        poller = zmq.Poller()
        poller.register(self._wake, zmq.POLLIN)
        for s in self._sock_handlers:
            poller.register(s, zmq.POLLIN)
        self._ready.set()
        log.info("broker %s listening on %s", self.config.name, ", ".join(self.endpoints))
        next_maint = time.monotonic() + self.config.probe_interval
        try:
            while not self._stop_requested:
                timeout = self._poll_timeout(next_maint)
                for sock, _ev in poller.poll(timeout):
                    if sock is self._wake:
                        self._wake.recv()
                        continue
                    self._guarded(self._sock_handlers[sock])
                self._guarded(self._flush_due)
                if self._blocked:
                    self._guarded(self._drain_queues)
                now = time.monotonic()
                if self._flow_paused:
                    self._guarded(self._check_flow, now)
                if now >= next_maint:
                    self._guarded(self._maintenance, now)
                    next_maint = now + self.config.probe_interval
            self._flush_due(everything=True)
            self._drain_queues()
        finally:
            self._publish_stats()
            st = self._stats_snapshot
            log.info("stopped after %.1f s: %d messages in, %d out, %d peers left, dropped %s",
                     st["uptime_s"], st["messages_in"], st["messages_out"], st["peers"],
                     {k: v for k, v in st["drops"].items() if v} or "nothing")
            self._teardown()
            self._stopped.set()

    def _guarded(self, fn, *args) -> None:
        """Run one step of the loop; an unexpected error (a bug) is logged
        with its traceback and counted, and the broker serves on."""
        try:
            fn(*args)
        except zmq.ContextTerminated:
            raise
        except Exception:
            self.drops["internal"] += 1
            log.exception("internal error in %s; the broker continues", getattr(fn, "__name__", fn))

    def _poll_timeout(self, next_maint: float) -> int:
        if self._blocked:
            return 1
        now_ns = time.monotonic_ns()
        t = next_maint - now_ns / 1e9
        d = self._router.deadline_ns()
        if d is not None:
            t = min(t, (d - now_ns) / 1e9)
        return max(0, int(t * 1000 + 0.999))

    def _maintenance(self, now: float) -> None:
        # Probe idle peers: a dead one fails (EHOSTUNREACH) and is removed.
        for peer in list(self._links.values()):
            if peer.ident is not None and now - peer.last_sent >= self.config.probe_interval and not peer.queue:
                self._send(peer, [P.PING, b""])
        if self._upstream is not None:
            self._send(self._upstream, [P.PING, b"probe"])
        self._publish_stats()
        if self.config.stats_interval and now >= self._next_stats_log:
            self._next_stats_log = now + self.config.stats_interval
            s = self._stats_snapshot
            log.info("peers %d, subscriptions %d, in %d msg (%d batches), out %d msg, dropped %s",
                     s["peers"], s["subscriptions"], s["messages_in"], s["batches_in"], s["messages_out"],
                     {k: v for k, v in s["drops"].items() if v} or "nothing")

    def _stats_dict(self) -> dict:
        ts = self._trie.stats()
        rs = self._router.stats()
        roles: dict[str, int] = {}
        for p in self._links.values():
            roles[p.role] = roles.get(p.role, 0) + 1
        drops = dict(self.drops)
        drops["unrouted"] = rs["unrouted"]
        drops["malformed"] = self.drops["malformed"] + rs["rejected"]
        return {
            "name": self.config.name, "instance": self.instance.decode(),
            "uptime_s": round(time.monotonic() - self._started, 3),
            "endpoints": self.endpoints,
            "peers": len(self._peers), "links": roles,
            "publishers": sum(1 for p in self._links.values() if p.publisher and p.role == "client"),
            "subscriptions": ts["subscriptions"], "keys": ts["keys"],
            "upstream": {"endpoint": self.config.upstream, "connected": bool(self._up_instance)}
            if self._upstream is not None else None,
            **self.counters, "deliveries": rs["deliveries"], "drops": drops,
            "queued_bytes": sum(p.queued_bytes for p in self._links.values()),
        }

    def _publish_stats(self) -> None:
        d = self._stats_dict()
        with self._stats_lock:
            self._stats_snapshot = d

    def _teardown(self) -> None:
        for s in list(self._sock_handlers):
            s.close(linger=0 if s is not self._sock else 500)
        self._wake.close(linger=0)
        if self._auth is not None:
            self._auth.stop()


class _AllowedKeys:
    """CURVE credentials provider: accept exactly these client public keys."""

    def __init__(self, keys: set) -> None:
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq passes the client's public key, Z85-encoded."""
        return key in self.keys
