"""Settings of a broker (:class:`BrokerConfig`) and the endpoint check that
keeps it on loopback unless told otherwise."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from fastbus import protocol as P
from fastbus.endpoints import check_connect, check_listen
from fastbus.errors import InvalidConfig, InvalidEndpoint

SLOW_POLICIES = ("drop", "disconnect")
#: Messages read from one socket per turn of the loop: under load a turn
#: reads this many batches from each busy socket, then every link gets the
#: batch the turn made for it.
RECV_BUDGET = 256
#: Subscription operations the loop applies per turn, at most (the rest of
#: a session's SUB frames wait for the next turn).
SUB_OPS_PER_TURN = 8192
#: What a subscription costs besides its key, for max_subscription_bytes:
#: about a trie node and a reference (docs/CORE.md).
SUB_OVERHEAD = 48
#: The list settings that also take one str (bind="tcp://...").
_LISTS = ("bind", "resp", "zmq_pub", "zmq_sub", "zmq_pull", "allow_brokers", "curve_allowed", "curve_allowed_brokers")


def resp_endpoint(endpoint: object) -> object:
    """A Redis-protocol endpoint as the broker listens on it: redis://HOST:PORT
    is tcp://HOST:PORT (port 6379 if none), unix://PATH is ipc://PATH; the
    broker's own forms as they are."""
    if not isinstance(endpoint, str):
        return endpoint
    if endpoint.startswith("redis://"):
        rest = endpoint[len("redis://"):].split("/", 1)[0].rsplit("@", 1)[-1]
        if rest and ":" not in rest.rsplit("]", 1)[-1]:
            rest += ":6379"
        return "tcp://" + rest
    if endpoint.startswith("unix://"):
        return "ipc://" + endpoint[len("unix://"):].split("?", 1)[0]
    return endpoint


@dataclass
class BrokerConfig:
    """Settings of a broker.  Every field has a working default: a broker on
    ``tcp://127.0.0.1:6464`` that only accepts loopback endpoints."""

    bind: list[str] = field(default_factory=lambda: [P.DEFAULT_ENDPOINT])
    #: Endpoints where Redis clients connect too (RESP2/RESP3 pub/sub:
    #: csrc/fb_resp_session.h), e.g. tcp://127.0.0.1:6379; fastbus clients
    #: may use them as well.  Loopback unless allow_remote, as bind.
    resp: list[str] = field(default_factory=list)
    #: Redis clients must AUTH with this password (as Redis's requirepass;
    #: user "default"), or as one of resp_users ({user: password}).
    resp_password: str | None = None
    resp_users: dict[str, str] = field(default_factory=dict)
    #: Bind TCP endpoints on non-loopback addresses too.
    allow_remote: bool = False
    #: Endpoint of an upstream broker to federate with.
    upstream: str | None = None
    #: CURVE to the upstream broker: its public key (Z85).  This broker then
    #: connects with upstream_curve_public_key / upstream_curve_secret_key
    #: (default: its own curve_public_key / curve_secret_key), the key the
    #: upstream lists with curve_allowed_brokers (--curve-allow-broker).
    upstream_curve_server_key: str | None = None
    upstream_curve_public_key: str | None = None
    upstream_curve_secret_key: str | None = None
    #: Plain-ZeroMQ compatibility: XPUB for SUB sockets, XSUB for PUB sockets,
    #: PULL for PUSH sockets; messages are two frames, [channel, payload].
    zmq_pub: list[str] = field(default_factory=list)
    zmq_sub: list[str] = field(default_factory=list)
    zmq_pull: list[str] = field(default_factory=list)
    #: Per-link batching.  Batches form by themselves: after each turn of
    #: reading its sockets the broker sends every link what that turn
    #: brought, so at a low rate a message leaves at once and under load
    #: batches grow.  A batch also leaves as soon as it holds max_messages
    #: records or max_bytes bytes.  max_delay is an optional linger (seconds,
    #: 0 = none, the default): with a linger L, a link's batch leaves when
    #: full, or when nothing was sent to that link in the last L seconds (an
    #: idle link still sends at once); otherwise L after that link's previous
    #: batch.  So under load each link gets at most one batch per L (fewer,
    #: larger batches), and a lone message is never held back.
    max_messages: int = 4096
    max_bytes: int = 256 * 1024
    max_delay: float = 0.0
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
    #: them back until it catches up; the slow-consumer policy applies to
    #: it.  0: no flow control; None: 4 MiB or a quarter of max_queue_bytes,
    #: whichever is less.
    flow_pause_bytes: int | None = None
    flow_max_pause: float = 5.0
    #: A session that takes nothing for stuck_timeout seconds while
    #: messages wait for it (a process stopped or hung with its connection
    #: open, a peer whose TCP window stays shut) is disconnected as a slow
    #: consumer: its queue, its session and its connection go, so neither
    #: the broker nor the kernel holds buffers for it for good.  0: never.
    stuck_timeout: float = 60.0
    #: A client session whose connection is lost (a network cut, a
    #: forwarder restarted) is kept this many seconds, its subscriptions
    #: and what is routed to it with it (within max_queue_bytes, and a
    #: quarter of that of what it was last sent): a client that comes back
    #: within it resumes, missing nothing (docs/PROTOCOL.md, "Resuming a
    #: session").  0: a lost connection ends the session at once.
    session_linger: float = 30.0
    #: A durable subscriber's session (``client.pubsub(durable="name")``)
    #: is kept this many seconds once its process is gone or closed it: a
    #: process that presents the name within it resumes where the last one
    #: stopped taking messages.  0: this broker keeps no durable sessions.
    durable_linger: float = 3600.0
    #: A directory to journal into (docs/PROTOCOL.md, "The journal"): a
    #: broker killed and started again with the same one loses nothing a
    #: client was told it took; its sessions linger again, with what they
    #: were owed.  None: no journal (a restart loses what was in flight).
    journal: str | None = None
    #: When the journal's writes reach the disk, as Redis's appendfsync:
    #: "always" (before anything is acknowledged), "everysec" (within a
    #: second: a kill -9 loses nothing, a power cut up to a second), "no"
    #: (the kernel's choice).
    fsync: str = "everysec"
    #: The journal's disk bound: past half of it, what sessions are still
    #: owed (up to a quarter of it) is rewritten and older segments deleted;
    #: what does not fit is told, at a restart, as a GAP with its exact count.
    journal_bytes: int = 1024 * 1024 * 1024
    #: Limits on what a peer may send.
    max_topic: int = 65535
    max_payload: int = 16 * 1024 * 1024
    max_message_bytes: int = P.MAX_MESSAGE_BYTES
    max_subscriptions: int = 1_000_000
    #: What subscriptions may cost, for every session alike (clients and
    #: downstream brokers): the key bytes one session may hold (each
    #: subscription counts its key's length + SUB_OVERHEAD), and all
    #: sessions together.  A subscription past max_subscriptions or these is
    #: refused: never confirmed, and the client is told (REFUSED, with the
    #: reason; docs/PROTOCOL.md).
    max_subscription_bytes: int = 64 * 1024 * 1024
    max_total_subscription_bytes: int = 1024 * 1024 * 1024
    #: Held groups (a sender's declaration: a queue group that keeps what
    #: no member can take, for one to come; docs/PROTOCOL.md "Held
    #: groups"): how many the broker holds, and what their backlogs may
    #: cost together (each record its bytes and a slot).  A record past
    #: the bound is not kept: the sender is answered so (507) and it is
    #: counted (drops.held_full).
    max_held_groups: int = 10_000
    max_held_bytes: int = 64 * 1024 * 1024
    #: Operations in one SUB frame (clients split larger changes): what one
    #: frame may cost to apply; the loop applies at most SUB_OPS_PER_TURN
    #: operations per turn, so others are served meanwhile.
    max_sub_ops: int = 4096
    #: Who may connect as a downstream broker (HELLO role "broker"), whose
    #: session gets our subscriptions forwarded: peer addresses (an IP
    #: address, a network such as "10.1.0.0/16", or "local" for loopback,
    #: ipc:// and inproc:// peers) and, with CURVE, public keys
    #: (curve_allowed_brokers, Z85; then the address list does not apply).
    #: By default nobody: a client that claims to be a broker is refused.
    allow_brokers: list[str] = field(default_factory=list)
    curve_allowed_brokers: list[str] | None = None
    #: Confirmed means in effect everywhere (docs/PROTOCOL.md): the broker
    #: confirms a subscription once every publisher whose filter lacked it
    #: (and every downstream broker) has acknowledged the change.  A
    #: publisher filters with the broker's view only under a lease of
    #: filter_lease seconds from its last answered ping, so one that does not
    #: acknowledge (stopped, or starved) is waited for at most this long: by
    #: then its lease has run out and it sends everything until it catches
    #: up.  upstream_confirm_timeout: how long a confirmation waits for the
    #: upstream broker's own (messages from above then flow once upstream
    #: applies the subscription; a broker that long silent is logged).
    filter_lease: float = 0.1
    upstream_confirm_timeout: float = 1.0
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
    #: Monitoring over HTTP ("127.0.0.1:8222"; None: off): /metrics
    #: (Prometheus), /varz, /connz, /subsz, /healthz and a live page at /
    #: (fastbus.monitor; README "Monitoring").  Loopback only unless
    #: allow_remote.  The loop publishes a snapshot about once a second
    #: (more often with a small http_max_age) and the HTTP threads read
    #: only that.
    http: str | None = None
    #: /healthz answers 503 when the loop's latest snapshot is older than
    #: this (seconds): the loop is stuck, or stopped.
    http_max_age: float = 3.0

    def check(self) -> None:
        """Raise :class:`~fastbus.errors.InvalidEndpoint` on a malformed
        endpoint, :class:`~fastbus.errors.InvalidConfig` on another setting
        that cannot work (both are ``ValueError``).  A str where a list is
        expected (``bind="tcp://..."``) is taken as a list of that one item."""
        for name in _LISTS:
            if isinstance(getattr(self, name), str):
                setattr(self, name, [getattr(self, name)])
        if not self.bind:
            raise InvalidConfig("the broker needs at least one endpoint to bind")
        self.resp = [resp_endpoint(ep) for ep in self.resp]
        for name in ("bind", "resp", "zmq_pub", "zmq_sub", "zmq_pull"):
            for ep in getattr(self, name):
                check_listen(ep, self.allow_remote, name)
        if self.resp and self.curve_secret_key:
            raise InvalidConfig("resp: a Redis-protocol endpoint is plain TCP; it cannot be used with CURVE "
                                "(a broker with --curve-cert listens for CURVE clients only)")
        if any(ep.startswith("inproc://") for ep in self.resp):
            raise InvalidConfig("resp: Redis clients connect over tcp:// or ipc:// (unix://), not inproc://")
        if (self.resp_password is not None or self.resp_users) and not self.resp:
            raise InvalidConfig("resp_password / resp_users need a Redis-protocol endpoint (resp, --resp)")
        if self.upstream is not None:
            try:
                check_connect(self.upstream)
            except InvalidEndpoint as exc:
                raise InvalidEndpoint(f"upstream: {exc}", exc.endpoint, setting="upstream") from None
        if self.slow_policy not in SLOW_POLICIES:
            raise InvalidConfig(f"slow_policy must be one of {SLOW_POLICIES}, not {self.slow_policy!r}")
        for name in ("max_messages", "max_bytes", "max_queue_bytes", "max_topic", "max_payload",
                     "max_message_bytes", "max_subscriptions"):
            if getattr(self, name) <= 0:
                raise InvalidConfig(f"{name} must be positive")
        if self.max_queue_bytes < 2 * self.max_bytes:
            # A blocked subscriber's batch grows to max_bytes: a bound that
            # cannot hold two would drop (or disconnect) on the first one.
            raise InvalidConfig(f"max_queue_bytes ({self.max_queue_bytes:,}) must be at least twice max_bytes "
                                f"({self.max_bytes:,}): a subscriber that falls behind is sent batches of up to "
                                f"max_bytes, and its queue must hold two")
        if self.max_payload + self.max_topic + P.FRAME_MARGIN > self.max_message_bytes:
            # A larger one could not arrive: its frame closes the connection.
            raise InvalidConfig(f"max_payload {self.max_payload:,} (with max_topic {self.max_topic:,}) is more than a "
                                f"message of max_message_bytes ({self.max_message_bytes:,} bytes) can carry: at most "
                                f"{self.max_message_bytes - self.max_topic - P.FRAME_MARGIN:,}")
        if not 0 <= self.max_delay <= 10:
            raise InvalidConfig("max_delay (the linger) must be between 0 (none) and 10 seconds")
        if self.flow_pause_bytes is not None and (
                self.flow_pause_bytes < 0 or
                (self.flow_pause_bytes and self.flow_pause_bytes >= self.max_queue_bytes)):
            raise InvalidConfig("flow_pause_bytes must be 0 (no flow control) or less than max_queue_bytes")
        if not 0 < self.flow_max_pause <= 600:
            raise InvalidConfig("flow_max_pause must be between 0 and 600 seconds")
        if not 0 <= self.stuck_timeout <= 86400:
            raise InvalidConfig("stuck_timeout must be between 0 (never) and 86400 seconds")
        if not 0 <= self.session_linger <= 86400:
            raise InvalidConfig("session_linger must be between 0 (sessions end with their connection) "
                                "and 86400 seconds")
        if self.fsync not in ("always", "everysec", "no"):
            raise InvalidConfig(f"fsync must be always, everysec or no, not {self.fsync!r}")
        if self.journal_bytes < 16 * 1024 * 1024:
            raise InvalidConfig("journal_bytes must be at least 16 MiB")
        if self.journal is not None and self.session_linger <= 0 and self.durable_linger <= 0:
            raise InvalidConfig("a journal keeps what lingering sessions are owed: it needs session_linger "
                                "or durable_linger above 0")
        if not 0 <= self.durable_linger <= 30 * 86400:
            raise InvalidConfig("durable_linger must be between 0 (no durable sessions) and 2592000 seconds (30 days)")
        for name in ("max_subscription_bytes", "max_total_subscription_bytes", "max_held_groups",
                     "max_held_bytes"):
            if getattr(self, name) <= 0:
                raise InvalidConfig(f"{name} must be positive")
        if self.max_sub_ops < P.MIN_SUB_OPS:
            # Clients split at MIN_SUB_OPS until WELCOME tells them more.
            raise InvalidConfig(f"max_sub_ops must be at least {P.MIN_SUB_OPS} (what every client may send "
                                f"in one frame before it learns the limit)")
        for entry in self.allow_brokers:
            broker_network(entry)                    # raises InvalidConfig with what is wrong
        if self.curve_allowed_brokers is not None and self.curve_secret_key is None:
            raise InvalidConfig("curve_allowed_brokers needs curve_secret_key and curve_public_key")
        if self.stats_interval < 0:
            raise InvalidConfig("stats_interval must be >= 0 (0: no periodic log)")
        if not 0.001 <= self.filter_lease <= 60:
            raise InvalidConfig("filter_lease must be between 0.001 and 60 seconds")
        if not 0 < self.upstream_confirm_timeout <= 600:
            raise InvalidConfig("upstream_confirm_timeout must be between 0 and 600 seconds")
        if not 0 < self.probe_interval <= 60 or not 0 < self.heartbeat_timeout <= 600:
            raise InvalidConfig("probe_interval and heartbeat_timeout must be positive (seconds)")
        if self.http is not None:
            from fastbus.monitor.http import parse_address
            try:
                parse_address(self.http, self.allow_remote)
            except ValueError as exc:
                raise InvalidConfig(f"http: {exc}") from None
        if not 0.05 <= self.http_max_age <= 3600:
            raise InvalidConfig("http_max_age must be between 0.05 and 3600 seconds")
        if (self.curve_secret_key is None) != (self.curve_public_key is None):
            raise InvalidConfig("CURVE needs both curve_secret_key and curve_public_key")
        if self.curve_allowed is not None and self.curve_secret_key is None:
            raise InvalidConfig("curve_allowed needs curve_secret_key and curve_public_key")
        if (self.upstream_curve_public_key is None) != (self.upstream_curve_secret_key is None):
            raise InvalidConfig("CURVE to the upstream needs both upstream_curve_public_key and "
                                "upstream_curve_secret_key")
        if self.upstream_curve_server_key is not None:
            if self.upstream is None:
                raise InvalidConfig("upstream_curve_server_key needs upstream (the broker to connect to)")
            if self.upstream_curve is None:
                raise InvalidConfig("upstream_curve_server_key needs this broker's keys: "
                                    "upstream_curve_public_key/secret_key, or curve_public_key/secret_key")
        elif self.upstream_curve_public_key is not None:
            raise InvalidConfig("upstream_curve_public_key/secret_key need upstream_curve_server_key "
                                "(the upstream broker's public key)")

    @property
    def upstream_curve(self) -> tuple[str, str, str] | None:
        """(server, public, secret) Z85 keys for the upstream connection, or
        None for a plain one."""
        if self.upstream_curve_server_key is None:
            return None
        public = self.upstream_curve_public_key or self.curve_public_key
        secret = self.upstream_curve_secret_key or self.curve_secret_key
        if public is None or secret is None:
            return None
        return self.upstream_curve_server_key, public, secret

    @property
    def flow_bytes(self) -> int:
        """The queue size that pauses publishers (0: no flow control)."""
        if self.flow_pause_bytes is not None:
            return self.flow_pause_bytes
        return min(4 << 20, self.max_queue_bytes // 4)


#: The rule for an endpoint to listen on (fastbus.endpoints), under the name
#: this module has always exported.
check_endpoint = check_listen


def broker_network(entry: str):
    """An allow_brokers entry as an ip_network, or "local"."""
    if entry == "local":
        return entry
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        raise InvalidConfig(f"allow_brokers: {entry!r} is not an IP address, a network (10.1.0.0/16) "
                         f"or 'local'") from None


def broker_allowed(entries: list, peer_address: str | None) -> bool:
    """May a peer at this address (ZeroMQ's Peer-Address; None or empty for
    ipc:// and inproc://) be a downstream broker?"""
    for entry in entries:
        net = broker_network(entry) if isinstance(entry, str) else entry
        if not peer_address:
            if net == "local":
                return True
            continue
        try:
            ip = ipaddress.ip_address(peer_address.split("%")[0])
        except ValueError:
            continue
        if net == "local":
            if ip.is_loopback:
                return True
        elif ip in net:
            return True
    return False
