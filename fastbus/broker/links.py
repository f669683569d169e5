"""Links, the broker's neighbours, each of a kind that knows how to reach
it (a client session, a downstream broker, the upstream broker, the
plain-ZeroMQ XPUB socket), and the table that numbers them.

A link's id is its subscriber id in the routing trie and the id of its
outbox in the router.  What the rest of the broker needs to know about a
kind is here, as attributes and methods, instead of checks of its role:

=================  ========  =======  =========  ===============================
kind               role      limited  is_broker  data goes out as
=================  ========  =======  =========  ===============================
ClientLink         client    yes      no         DATA seq batch
DownstreamLink     broker    yes      yes        DATA seq batch
UpstreamLink       upstream  no       yes        PUB batch
XPubLink           zmq-pub   no       no         one [channel, payload] a record
=================  ========  =======  =========  ===============================

``limited``: subscriptions count against the broker's subscription limits
(every session; not our own link to the upstream broker).
``is_broker``: another broker; it gets a forwarder of what every *other*
link wants, and its diffs (``want_frames``) are what we want from it.
``filters``: a publishing client, which gets the broker-wide WANT diffs and
FLOW pause/resume.

Changes of what we want from a link, or of what it may filter (WANT to a
publisher or a downstream broker, SUB to the upstream broker), are numbered
per link (``change_seq``, sent at ``change_at``); ``change_acked`` is the
latest the link said it has applied (ACK, or the upstream's CONFIRM).  A
confirmation waits for them (fastbus.broker.settle), from a session only
while a lease we granted it may still be running (the broker's
``lease_end``, kept by the data plane: fastbus.broker._relay):
without one it does not filter.  ``acks``: the peer
acknowledges (it said so in HELLO; our upstream link always does);
``holds_lease``: it filters only under a lease from us, so it is waited for
at most the lease (a session), not the upstream's confirmation timeout.
"""

from __future__ import annotations

import time

import zmq

from fastbus import protocol as P
from fastbus._core import batch_count


class Link:
    """A neighbour, and what the broker knows of it.  What is sent to it,
    and what waits for its socket, is the data plane's (fastbus.broker.sending)."""

    role = ""
    limited = False
    is_broker = False
    holds_lease = False

    __slots__ = ("link", "name", "sock", "publisher", "subs", "sub_bytes", "globs", "queues", "forwarder",
                 "address", "since", "acks", "headers", "headers_again", "groups", "change_seq", "change_at", "change_acked")

    def __init__(self, link: int, name: str, sock: zmq.Socket, publisher: bool = False) -> None:
        self.link = link
        self.name = name
        self.sock = sock
        self.publisher = publisher
        self.subs = 0                     # subscriptions it holds here
        self.sub_bytes = 0                # what they cost (key bytes + SUB_OVERHEAD each)
        self.globs: dict = {}             # glob -> [router's id for it, references, literal prefix]
        self.queues: dict = {}            # (group name, key, glob) -> references (Interest.groups)
        self.forwarder = None             # broker links: what we want from them
        self.address: str | None = None   # the peer's address (ZeroMQ Peer-Address), where known
        self.since = time.time()          # connected since (wall clock, for monitoring)
        self.acks = False                 # it acknowledges the changes we send it
        self.headers = False              # it reads message headers (its HELLO or WELCOME said so)
        self.headers_again = False        # ... and a repeat of the block before (flag bit 2; the same)
        self.groups = False               # a broker that takes queue group ops (its HELLO or WELCOME said so)
        self.change_seq = 0               # the latest change sent to it (WANT, or SUB upstream)
        self.change_at = 0.0              # when (time.monotonic())
        self.change_acked = 0             # the latest it acknowledged

    def _changed(self) -> int:
        """Number a change about to be sent to this link."""
        self.change_seq += 1
        self.change_at = time.monotonic()
        return self.change_seq

    @property
    def unacked(self) -> bool:
        """Did we send it a change it has not acknowledged yet (and may it
        still answer)?"""
        return self.acks and self.change_acked < self.change_seq and self.answering

    @property
    def answering(self) -> bool:
        """Is there a peer to acknowledge (not an upstream we are not
        connected to: no one waits for that)?"""
        return True

    @property
    def filters(self) -> bool:
        """A publishing client: gets WANT diffs of everything wanted here,
        and FLOW pause/resume."""
        return False

    @property
    def lingering(self) -> bool:
        """A session whose connection is gone, kept for its client to resume."""
        return False

    def probe(self, idle: bool) -> list | None:
        """What maintenance sends to check the link is alive, or None;
        ``idle``: nothing went to it for a probe interval, nor waits."""
        return None



class Session(Link):
    """A peer that said HELLO on the broker's ROUTER socket; frames go to it
    behind its routing id.  ROUTER_MANDATORY makes a send to a peer whose
    pipe is full raise EAGAIN, and one to a vanished peer EHOSTUNREACH.
    Every session's subscriptions count against the broker's limits."""

    limited = True
    holds_lease = True

    __slots__ = ("ident", "session_id", "user_id", "detached_at", "confirmed", "linger", "durable",
                 "claim", "consumed", "took")

    def __init__(self, link: int, ident: bytes, name: str, sock: zmq.Socket, publisher: bool) -> None:
        super().__init__(link, name, sock, publisher)
        self.ident = ident
        #: Resumable (its HELLO named a session): the id, and the CURVE key
        #: it was opened with (a resume must present the same one).
        self.session_id: str | None = None
        self.user_id: str | None = None
        #: Seconds it lingers once its connection is gone.
        self.linger = 0.0
        #: A durable subscriber's name (its session outlives its process),
        #: the claim of the process that holds it (drawn per PubSub: another
        #: process's is another claim), and how much of its stream that
        #: process's application took (its TAKEN): where the next one starts.
        self.durable: str | None = None
        self.claim: str | None = None
        self.consumed = 0
        #: When its connection was found lost (time.monotonic()): it
        #: lingers until resumed or its linger runs out.  None: connected.
        self.detached_at: float | None = None
        #: The seq of the latest CONFIRM handed to the data plane for it: a
        #: resumed WELCOME says it, for a CONFIRM that a cut connection lost.
        self.confirmed = 0
        #: The stream count its client last said it took (TAKEN, or its
        #: resuming HELLO): what was sent past it may never have been read.
        self.took = 0

    @property
    def lingering(self) -> bool:
        return self.detached_at is not None

    def probe(self, idle: bool) -> list | None:
        return [P.PING, b""] if idle else None

    def want_frames(self, ops) -> list:
        """WANT with a diff of what the peer may let through (a publishing
        client) or should send us (a downstream broker); numbered for a
        peer that acknowledges."""
        if self.acks:
            return [P.WANT, b"\x00", ops, P.pack_u64(self._changed())]
        return [P.WANT, b"\x00", ops]

    def want_reset_frames(self, ops) -> list:
        """WANT with the whole set."""
        if self.acks:
            return [P.WANT, bytes([P.WANT_RESET]), ops, P.pack_u64(self._changed())]
        return [P.WANT, bytes([P.WANT_RESET]), ops]


class ClientLink(Session):
    """A client session (HELLO role "client")."""

    role = "client"
    __slots__ = ()

    @property
    def filters(self) -> bool:
        return self.publisher


class RedisLink(ClientLink):
    """A Redis client on a --resp endpoint (HELLO role "redis", which its
    connection's C side says for it: csrc/fb_resp_session.h): a subscriber
    and publisher like a client, and what CLIENT SETNAME / SETINFO told."""

    role = "redis"
    __slots__ = ("client_name", "lib")

    def __init__(self, link: int, ident: bytes, name: str, sock: zmq.Socket, publisher: bool) -> None:
        super().__init__(link, ident, name, sock, publisher)
        self.client_name = ""
        self.lib: dict[str, str] = {}


class DownstreamLink(Session):
    """A broker below us (HELLO role "broker"): it subscribes here with what
    its side wants; we send it WANT with what our other links want."""

    role = "broker"
    is_broker = True
    __slots__ = ()


class UpstreamLink(Link):
    """Our DEALER connection to the broker above (fastbus.broker.federation):
    its WANT set becomes this link's subscriptions; what our other links
    want we subscribe there with SUB."""

    role = "upstream"
    is_broker = True
    __slots__ = ("instance", "sub_ops", "hello_gen")

    def __init__(self, link: int, sock: zmq.Socket) -> None:
        super().__init__(link, "upstream", sock, publisher=True)
        self.acks = True                  # every broker confirms a SUB
        self.instance = b""               # upstream's WELCOME instance: empty until welcomed
        self.sub_ops = P.MIN_SUB_OPS      # operations per SUB frame (upstream's WELCOME says its limit)
        self.hello_gen = 0                # how many HELLOs we said: pings carry it (fastbus.broker.federation)

    @property
    def answering(self) -> bool:
        return bool(self.instance)

    def want_frames(self, ops) -> list:
        return [P.SUB, P.pack_u64(self._changed()), ops]

    def probe(self, idle: bool) -> list | None:
        # Its PONG tells us whether upstream restarted, or lost our HELLO.
        return [P.PING, self.ping_token(b"probe")]

    def ping_token(self, what: bytes) -> bytes:
        """A ping's token that says which of our HELLOs it follows."""
        return what + P.pack_u64(self.hello_gen)

    def follows_last_hello(self, token: bytes) -> bool:
        """Was the ping this PONG answers sent after our latest HELLO?"""
        return len(token) > 8 and token[-8:] == P.pack_u64(self.hello_gen) and \
            token[:-8] in (b"probe", b"hello")


class XPubLink(Link):
    """Plain ZeroMQ SUB sockets behind our XPUB socket, as one link whose
    subscriptions are their prefixes (fastbus.broker.compat)."""

    role = "zmq-pub"
    limited = True                        # a refusal is counted and logged: plain SUB sockets hear nothing
    __slots__ = ()


def count_in(relay, link: Link, batch) -> None:
    """A batch received from a link and routed by Python: counted in the
    data plane's books (fastbus.broker._relay Relay.count_in)."""
    try:
        records = batch_count(batch)
    except ValueError:                    # refused by the router already (counted there)
        records = 0
    relay.count_in(link.link, records, len(batch))


#: The fields of Broker.peer_rows(), in order (and of /connz's entries).
PEER_FIELDS = ("link", "name", "role", "address", "publisher", "subscriptions", "queued_bytes", "slow",
               "holding_publishers", "flow_exempt", "lost_unreported", "connected_since", "batches_in",
               "messages_in", "bytes_in", "batches_out", "messages_out", "bytes_out")


def peer_dicts(rows: list[tuple]) -> list[dict]:
    """Broker.peer_rows() as dicts (any thread)."""
    return [dict(zip(PEER_FIELDS, row)) for row in rows]


class LinkTable:
    """Every link by id, sessions also by routing id.  Ids are small and
    reused, as the router and the trie want them dense."""

    def __init__(self) -> None:
        self.by_id: dict[int, Link] = {}
        self.by_ident: dict[bytes, Session] = {}
        #: Resumable sessions by the id their HELLO named.
        self.by_session: dict[str, Session] = {}
        #: Links sent a change they may not have acknowledged yet (see
        #: Link.unacked; fastbus.broker.settle drops the others as it meets them).
        self.unacked: dict[int, Link] = {}
        self._free: list[int] = []
        self._next = 1

    def new_id(self) -> int:
        if self._free:
            return self._free.pop()
        link = self._next
        self._next += 1
        return link

    def add(self, link: Link) -> None:
        self.by_id[link.link] = link
        if isinstance(link, Session):
            self.by_ident[link.ident] = link
            if link.session_id is not None:
                self.by_session[link.session_id] = link

    def rebind(self, link: Session, ident: bytes) -> None:
        """A resumed session's new connection (routing id)."""
        if self.by_ident.get(link.ident) is link:
            del self.by_ident[link.ident]
        link.ident = ident
        self.by_ident[ident] = link

    def is_current(self, link: Link) -> bool:
        return self.by_id.get(link.link) is link

    def remove(self, link: Link) -> None:
        del self.by_id[link.link]
        if self.unacked.get(link.link) is link:
            del self.unacked[link.link]
        if isinstance(link, Session):
            if self.by_ident.get(link.ident) is link:
                del self.by_ident[link.ident]
            if link.session_id is not None and self.by_session.get(link.session_id) is link:
                del self.by_session[link.session_id]
        self._free.append(link.link)

    def snapshot(self) -> list[Link]:
        """The links now (safe to iterate while sends remove dead ones)."""
        return list(self.by_id.values())

    def __len__(self) -> int:
        return len(self.by_id)
