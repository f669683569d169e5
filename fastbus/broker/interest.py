"""Who wants what, and telling the neighbours: the routing trie, the
forwarders that turn subscription changes into minimal diffs, WANT diffs and
snapshots for publishing clients and downstream brokers, SUB diffs upstream.

Two kinds of forwarder (``fastbus.Forwarder``, subsume mode) follow the
trie.  One over all links gives the publishing clients the minimal set of
keys wanted here, so that they drop unwanted messages before the network.
One per broker link, over all *other* links, gives what we want from that
broker (split horizon: never what it wants itself); its diffs are WANT to a
downstream broker and SUB to the upstream one (``Link.want_frames``).

A glob (a subscriber's Redis pattern, ``P.GLOB``) is held in the trie under
its literal prefix by an id the router gives it (``Router.add_glob``): the
router matches it exactly when it delivers, and the forwarders hold the
prefix, so other brokers and the publishers' filters see only prefixes.

A queue group (``P.Queue``: a member's ``subscribe(channel, queue=name)``)
is held once, however many members it has: in the trie under its key by an
id the router gives it (``Router.add_group``), which the publishers'
forwarder sees as one subscriber; the router gives each record to one
member (``Router.group_join``).  Another broker is told of a group as a
group (its own op, ``announce``) while members other than itself exist,
and as a member it stands for the members behind it: the broker where a
record enters picks for the whole federation, and a record it gives to
another broker names the group in its ``:groups`` header, by the group's
mark (``group_mark``), for that broker to pick one of its members
(csrc/fb_router.h, "Queue groups across brokers").

A held group (``P.Queue`` with ``hold``: a sender's declaration, not a
membership) keeps what no member can take, in the router (``Router.
group_hold``): a member that joins gets that backlog first.  It stays
without members while its backlog holds records or its latest
declaration is younger than its expiry (``expire_held``); it is this
broker's alone (not announced to other brokers: the sender declares it on
the broker it sends to).  A held group may be bound to other channels
(``P.Queue`` with ``into``: a Channels layer's named channel in a group):
its id is held in the trie under each of them too, and the router gives
what they get to the group as published on the group's own channel
(``Router.set_group_topic``); a binding lasts its life unless bound again,
and keeps its group as a declaration does.

Every such message is built here (``want_diff``, ``want_reset``,
``upstream_snapshot``), numbered by its link for a peer that acknowledges,
and the link noted in ``LinkTable.unacked``: a confirmation waits for those
(fastbus.broker.settle).
"""

from __future__ import annotations

import hashlib
import time

from fastbus import protocol as P
from fastbus._core import SUBSCRIBE, UNSUBSCRIBE, Forwarder, Router, Trie, glob_prefix
from fastbus.errors import NotSubscribedError

from .config import SUB_OVERHEAD, BrokerConfig
from .links import Link, LinkTable


#: A leaving link's diff to the publishing clients goes in WANT frames of
#: about this many bytes of keys (``Interest.detach``).
DIFF_PART_BYTES = 1 << 20


def group_mark(name: bytes, key: bytes, glob: bool) -> bytes:
    """A queue group's name in every broker of a federation (the router's
    ``:groups`` header): 16 bytes of a hash of what it is."""
    return hashlib.sha256(b"fastbus group\x00%s\x00%s%s" % (name, b"g" if glob else b"c", key)).digest()[:16]


class Group:
    """A queue group held here: the router's id for it, where the trie
    holds it, and its members (link ids); a held group's expiry (ms, 0: not
    held) and its latest declaration (monotonic)."""

    __slots__ = ("gid", "key", "queue", "tkey", "prefix", "members", "hold_ms", "declared", "hold_cost", "binds")

    def __init__(self, gid: int, key: bytes, queue: P.Queue, tkey: bytes, prefix: bool) -> None:
        self.gid, self.key, self.queue, self.tkey, self.prefix = gid, key, queue, tkey, prefix
        self.members: set[int] = set()
        self.hold_ms = 0
        self.declared = 0.0
        self.hold_cost = 0          # what its declaration counts in Interest.total_bytes
        #: The channels bound to it: key -> [until (monotonic), capacity].
        self.binds: dict[bytes, list] = {}

    def wanted_by(self, link: Link) -> bool:
        """Does ``link`` (a broker) hear of this group: members besides it?"""
        return len(self.members) > (link.link in self.members)


def _whole(forwarder: Forwarder):
    """A forwarder's whole upstream set as one ops batch (empty if none)."""
    snapshot = forwarder.snapshot(ops=True)
    return P.encode_ops([]) if snapshot is None else snapshot


class Interest:
    """The subscriptions of every link and the diffs they cause.  ``send``
    is how a diff leaves (fastbus.broker.sending.Sender.send)."""

    def __init__(self, trie: Trie, router: Router, links: LinkTable, send, config: BrokerConfig, counters: dict,
                 drops: dict) -> None:
        self.trie = trie
        self.router = router
        self.links = links
        self._send = send
        self._max_subs = config.max_subscriptions
        self._max_bytes = config.max_subscription_bytes
        self._max_total = config.max_total_subscription_bytes
        self._counters = counters
        self._drops = drops
        self._max_held = config.max_held_groups
        self.flush_full = None                   # the broker's: sends the outboxes a backlog given filled
        self.journal = None                      # the broker's --journal: held groups' declarations go there
        self.total_bytes = 0                     # what every session's subscriptions cost (SUB_OVERHEAD)
        self.released = 0                        # subscriptions removed, ever (the broker's memory trim)
        self.released_bytes = 0                  # and what they cost (SUB_OVERHEAD counted)
        # Every link: the publishers' filter.  It works over the routing trie
        # itself (each key stored once): its calls are the trie's changes.
        self.all = Forwarder("subsume", trie=trie)
        #: Queue groups: (name, key, glob) -> Group
        self.groups: dict[tuple, Group] = {}
        #: The held ones among them.
        self.held: dict[tuple, Group] = {}

    # -- links come and go -------------------------------------------------

    def attach(self, link: Link) -> None:
        """A new link.  A broker link gets a forwarder of what every other
        link wants; the caller sends its snapshot (``link_snapshot``)."""
        if not link.is_broker:
            return
        fwd = Forwarder("subsume")
        for other in self.links.by_id.values():
            if other is not link:
                for key, prefix, refs in self.trie.subscriber_keys(other.link):
                    for _ in range(refs):
                        fwd.subscribe(other.link, key, prefix=prefix)
                for _gid, refs, key in other.globs.values():
                    for _ in range(refs):
                        fwd.subscribe(other.link, key, prefix=True)
        link.forwarder = fwd

    def detach(self, link: Link) -> None:
        """A link that went (already out of the table): its subscriptions
        go (from the routing trie too: ``self.all`` works over it), and the
        publishing clients hear of it.  A diff names every key that went, so
        when the link held more than everybody else (a client leaving with
        64 MiB of keys makes a 64 MiB diff, and the broker's memory would
        double while it goes) they get what is left instead, whole (a WANT
        reset), and the keys go without a copy (``drop_peer``).  Otherwise
        the diff goes in parts of DIFF_PART_BYTES of keys, each sent before
        the next is built (``remove_peer_parts``): the broker then holds one
        part beside the keys, not a copy of them, a diff and its frames as
        large."""
        publishers = [o for o in self.links.snapshot() if o.filters]
        whole = not publishers or link.sub_bytes > self.total_bytes - link.sub_bytes
        peers = [gid for gid, _refs, _key in link.globs.values()] + [link.link]
        for peer in peers:
            if whole:
                self.all.drop_peer(peer)
            else:
                for ops in self.all.remove_peer_parts(peer, DIFF_PART_BYTES):
                    self._emit_all(ops)
        for gid in peers[:-1]:
            self.router.remove_glob(gid)
        link.globs.clear()
        diff: list = []
        diffs: dict[Link, list] = {}
        for group in list(link.queues):
            self._leave_group(link, group, diff, diffs)
        link.queues.clear()
        if diff and not whole:
            self._emit_all(P.encode_ops(diff))
        for other, d in diffs.items():
            if self.links.is_current(other):
                self._emit_link(other, d)
        self.released += link.subs
        self.released_bytes += link.sub_bytes
        self.total_bytes -= link.sub_bytes
        link.sub_bytes = link.subs = 0
        if whole and publishers:
            snapshot = _whole(self.all)
            for pub in publishers:                 # a send may find another link dead
                if self.links.is_current(pub):
                    self._send(pub, self.want_reset(pub, snapshot))
        for other in self.links.snapshot():
            if other.forwarder is not None:
                self._emit_link(other, other.forwarder.remove_peer(link.link))

    # -- the messages that carry it ----------------------------------------

    def want_diff(self, link: Link, ops) -> list:
        """The frames of a change (an ops batch) of what we want from a link
        or let it filter: WANT to a session, SUB to the upstream broker."""
        frames = link.want_frames(ops)
        if link.acks:
            self.links.unacked[link.link] = link
        return frames

    def want_reset(self, link: Link, snapshot=None) -> list:
        """A WANT reset for a session (built when it is sent: a queued
        backlog of diffs collapses into one, fastbus.broker.sending): for a
        downstream broker what we want from it, for a publishing client
        what it should let through (``snapshot``, if the caller has it)."""
        if snapshot is None:
            groups = self._group_ops(link) if link.is_broker else []
            snapshot = (P.encode_ops(link.forwarder.snapshot() + groups) if groups else
                        _whole(link.forwarder if link.is_broker else self.all))
        frames = link.want_reset_frames(snapshot)
        if link.acks:
            self.links.unacked[link.link] = link
        return frames

    def upstream_snapshot(self, link: Link) -> list:
        """What we want from the upstream broker, whole, as SUB frames of at
        most the operations it takes in one (its max_sub_ops)."""
        ops = link.forwarder.snapshot() + self._group_ops(link)
        size = link.sub_ops
        chunks = [P.encode_ops(ops[i:i + size]) for i in range(0, len(ops), size)] or [P.encode_ops([])]
        return [self.want_diff(link, chunk) for chunk in chunks]

    # -- subscription changes ----------------------------------------------

    def _refusal(self, link: Link, cost: int) -> str | None:
        """Why a subscription of this cost cannot be held, or None."""
        if link.subs >= self._max_subs:
            return (f"too many subscriptions: this connection holds {link.subs:,}, the broker's limit "
                    f"(max_subscriptions)")
        if link.sub_bytes + cost > self._max_bytes:
            return (f"subscriptions of this connection would take {link.sub_bytes + cost:,} bytes, over the "
                    f"broker's limit of {self._max_bytes:,} (max_subscription_bytes)")
        if self.total_bytes + cost > self._max_total:
            return (f"the broker's subscriptions would take {self.total_bytes + cost:,} bytes, over its "
                    f"limit of {self._max_total:,} (max_total_subscription_bytes)")
        return None

    def apply(self, link: Link, ops) -> list:
        """(Un)subscriptions of a link: routing trie, then the forwarders,
        then the diffs to whoever they concern.  Returns the subscriptions
        refused (over a limit) as ``(key, prefix, reason)``; a link of ours
        (the upstream broker's wants) is not limited."""
        diff_all: list = []
        diffs: dict[Link, list] = {}
        refused: list = []
        brokers = [o for o in self.links.by_id.values() if o.forwarder is not None and o is not link]
        limited = link.limited
        fwd_all, key_id = self.all, link.link
        for op, key, prefix in ops:
            if isinstance(prefix, P.Queue):
                self._apply_queue(link, op, key, prefix, diff_all, refused, diffs)
                continue
            glob = prefix == P.GLOB
            if op == SUBSCRIBE:
                cost = len(key) + SUB_OVERHEAD
                if limited:
                    why = self._refusal(link, cost)
                    if why is not None:
                        self._drops["too_many_subscriptions"] += 1
                        refused.append((key, prefix, why))
                        continue
                if glob:
                    key, prefix = self._hold_glob(link, key, diff_all), True   # the forwarders hold its prefix
                else:
                    diff_all += fwd_all.subscribe(key_id, key, prefix=prefix)   # and the routing trie
                link.subs += 1
                link.sub_bytes += cost
                self.total_bytes += cost
                self._counters["subscribe_ops"] += 1
                for other in brokers:
                    d = other.forwarder.subscribe(key_id, key, prefix=prefix)
                    if d:
                        diffs.setdefault(other, []).extend(d)
            else:
                try:
                    if glob:
                        held = self._drop_glob(link, key, diff_all)
                    else:
                        diff_all += fwd_all.unsubscribe(key_id, key, prefix=prefix)
                except NotSubscribedError:
                    self._drops["not_subscribed"] += 1
                    continue
                link.subs -= 1
                self.released += 1
                self.released_bytes += len(key) + SUB_OVERHEAD
                link.sub_bytes -= len(key) + SUB_OVERHEAD
                self.total_bytes -= len(key) + SUB_OVERHEAD
                self._counters["unsubscribe_ops"] += 1
                if glob:
                    key, prefix = held, True
                for other in brokers:
                    d = other.forwarder.unsubscribe(key_id, key, prefix=prefix)
                    if d:
                        diffs.setdefault(other, []).extend(d)
        self._emit_all(P.encode_ops(diff_all) if diff_all else None)
        for other, d in diffs.items():
            if self.links.is_current(other):      # a send above may have found it gone
                self._emit_link(other, d)
        return refused

    # -- queue groups --------------------------------------------------------

    def _apply_queue(self, link: Link, op: int, key: bytes, queue: P.Queue, diff_all: list, refused: list,
                     diffs: dict) -> None:
        """One queue group op of a link (see apply): the link joins the
        group (held once per link: more subscriptions only count) or
        leaves it; the group is held while it has members.  A broker link
        joins for the members behind it."""
        if queue.into is not None:
            self._apply_bind(op, key, queue, diff_all, refused)
            return
        group = (queue.name, key, queue.glob)
        if queue.hold:
            if op == SUBSCRIBE:
                self._declare_held(group, key, queue, diff_all, refused)
            else:
                self._release_held(group, diff_all)
            return
        cost = len(key) + len(queue.name) + SUB_OVERHEAD
        if op == SUBSCRIBE:
            if link.limited:
                why = self._refusal(link, cost)
                if why is not None:
                    self._drops["too_many_subscriptions"] += 1
                    refused.append((key, queue, why))
                    return
            refs = link.queues.get(group, 0)
            if refs and link.is_broker:
                return                  # (a broker's announcements are a state, not references)
            if not refs:
                g = self.groups.get(group) or self._new_group(group, key, queue, diff_all)
                self.router.group_join(g.gid, link.link)
                g.members.add(link.link)
                if g.hold_ms:
                    self._give(g)
                self._announce(g, link, diffs)
            link.queues[group] = refs + 1
            link.subs += 1
            link.sub_bytes += cost
            self.total_bytes += cost
            self._counters["subscribe_ops"] += 1
        else:
            refs = link.queues.get(group)
            if refs is None:
                self._drops["not_subscribed"] += 1
                return
            if refs > 1:
                link.queues[group] = refs - 1
            else:
                del link.queues[group]
                self._leave_group(link, group, diff_all, diffs)
            link.subs -= 1
            self.released += 1
            self.released_bytes += cost
            link.sub_bytes -= cost
            self.total_bytes -= cost
            self._counters["unsubscribe_ops"] += 1

    def _new_group(self, group: tuple, key: bytes, queue: P.Queue, diff_all: list) -> Group:
        """A group that is not held yet: in the router and the trie (the
        publishers' diff to ``diff_all``)."""
        tkey, prefix = (glob_prefix(key)[0], True) if queue.glob else (key, False)
        g = self.groups[group] = Group(self.router.add_group(key if queue.glob else None), key,
                                       P.Queue(queue.name, queue.glob), tkey, prefix)
        self.router.set_group_mark(g.gid, group_mark(*group))
        diff_all += self.all.subscribe(g.gid, tkey, prefix=prefix)
        return g

    def _remove_group(self, group: tuple, diff_all: list) -> None:
        g = self.groups.pop(group)
        if self.held.pop(group, None) is not None:
            self._unhold(g)
        self._unbind_all(g, diff_all)
        diff_all += self.all.unsubscribe(g.gid, g.tkey, prefix=g.prefix)
        self.router.remove_group(g.gid)

    # -- held groups -----------------------------------------------------------

    def _declare_held(self, group: tuple, key: bytes, queue: P.Queue, diff_all: list, refused: list) -> None:
        """A sender's declaration that ``group`` is held, for ``queue.hold``
        ms at least: the group (made if need be) keeps what no member can
        take, and outlives its members that long after this."""
        g = self.groups.get(group)
        if g is None or not g.hold_ms:
            # A declaration costs as a subscription does, against the
            # broker's total (it is no session's), and the held groups'
            # own count bounds them.
            cost = len(key) + len(queue.name) + SUB_OVERHEAD
            why = (f"too many held groups: the broker holds {len(self.held):,}, its limit (max_held_groups)"
                   if len(self.held) >= self._max_held else
                   f"the broker's subscriptions would take {self.total_bytes + cost:,} bytes, over its limit of "
                   f"{self._max_total:,} (max_total_subscription_bytes)"
                   if self.total_bytes + cost > self._max_total else None)
            if why is not None:
                self._drops["too_many_subscriptions"] += 1
                refused.append((key, queue, why))
                return
            if g is None:
                g = self._new_group(group, key, queue, diff_all)
            self.router.group_hold(g.gid)
            self.held[group] = g
            g.hold_cost = cost
            self.total_bytes += cost
        g.hold_ms = max(g.hold_ms, queue.hold)
        g.declared = time.monotonic()
        if self.journal is not None:
            self.journal.held_declared(group, g)

    def restore_held(self, group: tuple, hold_ms: int, age_s: float) -> Group | str:
        """A held group read back from the journal (at start, before anything
        is served), declared ``age_s`` ago for ``hold_ms``: the group, or
        why a bound refuses it now."""
        name, key, glob = group
        refused: list = []
        diff_all: list = []
        journal, self.journal = self.journal, None          # (not journaled again: the start's snapshot is)
        try:
            self._declare_held(group, key, P.Queue(name, glob, hold=max(1, hold_ms)), diff_all, refused)
        finally:
            self.journal = journal
        self._emit_all(P.encode_ops(diff_all) if diff_all else None)
        g = self.held.get(group)
        if refused or g is None:
            return refused[0][2] if refused else "not held"
        g.hold_ms = hold_ms
        g.declared = time.monotonic() - max(0.0, age_s)
        return g

    def _release_held(self, group: tuple, diff_all: list) -> None:
        """A sender's word that ``group`` is no longer held (a Channels
        layer's flush()): what it kept is dropped (counted: held_purged);
        without members it goes."""
        g = self.held.pop(group, None)
        if g is None:
            return
        self._counters["held_purged"] += self.router.group_release(g.gid)
        self._unhold(g)
        self._unbind_all(g, diff_all)
        if not g.members:
            self._remove_group(group, diff_all)

    # -- bound channels ------------------------------------------------------

    def _apply_bind(self, op: int, key: bytes, queue: P.Queue, diff_all: list, refused: list) -> None:
        """Bind channel ``key`` to held group ``queue.name`` of channel
        ``queue.into`` for ``queue.hold`` ms (again: renewed, the new
        capacity applies), or unbind it.  The group must be held (declare
        it first, in the same SUB or before); a binding costs what a
        subscription does, against the broker's total."""
        group = (queue.name, queue.into, False)
        g = self.held.get(group)
        if op != SUBSCRIBE:
            if g is not None and key in g.binds:
                self._unbind(g, key, diff_all)
                self._note_held(group, g)
            else:
                self._drops["not_subscribed"] += 1
            return
        why = None
        if g is None:
            why = (f"channel {queue.into[:200]!r} has no held group {queue.name[:100]!r} to bind to "
                   f"(declare it held first: Client.hold)")
        elif key == queue.into:
            why = "a held group takes its own channel already: bind another"
        elif key not in g.binds:
            cost = len(key) + SUB_OVERHEAD
            if self.total_bytes + cost > self._max_total:
                why = (f"the broker's subscriptions would take {self.total_bytes + cost:,} bytes, over its limit "
                       f"of {self._max_total:,} (max_total_subscription_bytes)")
        if why is not None:
            if g is not None and key != queue.into:
                self._drops["too_many_subscriptions"] += 1
            refused.append((key, queue, why))
            return
        until = time.monotonic() + queue.hold / 1000
        bind = g.binds.get(key)
        if bind is None:
            diff_all += self.all.subscribe(g.gid, key, prefix=False)
            g.binds[key] = [until, queue.capacity]
            self.total_bytes += len(key) + SUB_OVERHEAD
        else:
            bind[0], bind[1] = max(bind[0], until), queue.capacity
        self.router.set_group_topic(g.gid, g.key, self._bound_capacity(g))
        self._note_held(group, g)

    def _bound_capacity(self, g: Group) -> int:
        """The count bound of what a group keeps from its bound channels:
        the smallest its bindings name (0: none names one)."""
        caps = [c for _until, c in g.binds.values() if c]
        return min(caps) if caps else 0

    def _unbind(self, g: Group, key: bytes, diff_all: list) -> None:
        del g.binds[key]
        diff_all += self.all.unsubscribe(g.gid, key, prefix=False)
        self.total_bytes -= len(key) + SUB_OVERHEAD
        self.released += 1
        self.released_bytes += len(key) + SUB_OVERHEAD
        self.router.set_group_topic(g.gid, g.key if g.binds else None, self._bound_capacity(g))

    def _unbind_all(self, g: Group, diff_all: list) -> None:
        for key in list(g.binds):
            self._unbind(g, key, diff_all)

    def restore_binds(self, group: tuple, binds: list) -> None:
        """A held group's bindings read back from the journal: ``(key,
        ms left, capacity)`` each."""
        diff_all: list = []
        refused: list = []
        journal, self.journal = self.journal, None
        try:
            for key, left_ms, capacity in binds:
                if left_ms > 0:
                    self._apply_bind(SUBSCRIBE, key, P.Queue(group[0], False, min(P.MAX_HOLD_MS, max(1, left_ms)),
                                                             group[1], capacity), diff_all, refused)
        finally:
            self.journal = journal
        self._emit_all(P.encode_ops(diff_all) if diff_all else None)

    def _note_held(self, group: tuple, g: Group) -> None:
        if self.journal is not None:
            self.journal.held_declared(group, g)

    def _unhold(self, g: Group) -> None:
        if self.journal is not None:
            self.journal.held_ended(g)
        g.hold_ms = 0
        self.total_bytes -= g.hold_cost
        self.released += 1
        self.released_bytes += g.hold_cost
        g.hold_cost = 0

    def resumed(self, link: Link) -> None:
        """A member's session resumed: the held groups it is in give it
        (and their other members) what they kept while it was away."""
        for key in link.queues:
            g = self.groups.get(key)
            if g is not None and g.hold_ms:
                self._give(g)

    def _give(self, g: Group) -> None:
        """A held group has a member: what it kept goes to its members."""
        if not self.router.group_held(g.gid):
            return
        _n, full = self.router.group_give(g.gid)
        if full and self.flush_full is not None:
            self.flush_full(full)

    def expire_held(self, now: float) -> int:
        """What held groups kept longer than their expiry goes (returns how
        many); a held group without members, backlog or a declaration
        within its expiry goes too."""
        dropped = 0
        diff_all: list = []
        now_ns = time.monotonic_ns()
        for group, g in list(self.held.items()):
            dropped += self.router.group_expire(g.gid, max(0, now_ns - g.hold_ms * 1_000_000))
            gone = [key for key, (until, _c) in g.binds.items() if until < now]
            for key in gone:
                self._unbind(g, key, diff_all)
            if gone:
                self._note_held(group, g)
            if not g.members and not g.binds and not self.router.group_held(g.gid) and \
                    now - g.declared > g.hold_ms / 1000:
                self._remove_group(group, diff_all)
        self._emit_all(P.encode_ops(diff_all) if diff_all else None)
        return dropped

    def held_messages(self) -> int:
        return sum(self.router.group_held(g.gid) for g in self.held.values())

    def _leave_group(self, link: Link, group: tuple, diff_all: list, diffs: dict) -> None:
        """A link is no longer a member of ``group``; the last member's
        going takes the group (the publishers' diff to ``diff_all``, other
        brokers' to ``diffs``)."""
        g = self.groups[group]
        self.router.group_leave(g.gid, link.link)
        g.members.discard(link.link)
        self._announce(g, link, diffs)
        if g.members or g.hold_ms:
            return                              # (a held group stays: expire_held)
        self._remove_group(group, diff_all)

    def _announce(self, g: Group, changed: Link, diffs: dict) -> None:
        """``changed`` joined or left ``g``: tell each broker for which that
        changed whether the group has members besides it (split horizon).
        Only the sole other member's coming or going changes it: at most
        two brokers a change, whatever the group's size."""
        joined = changed.link in g.members
        others = len(g.members) - joined        # members besides ``changed``, before and after
        if others > 1:
            return
        if others == 0:
            # ``changed`` is (or was) the only member: every broker but it
            # hears of the group now, or no longer.
            targets = [o for o in self.links.by_id.values() if o.forwarder is not None and o is not changed]
        else:
            # One other member: only it (if a broker) gains or loses
            # ``changed`` as its one member besides itself.
            (only,) = g.members - {changed.link}
            other = self.links.by_id.get(only)
            targets = [other] if other is not None and other.forwarder is not None else []
        for other in targets:
            if other.groups:
                diffs.setdefault(other, []).append((SUBSCRIBE if joined else UNSUBSCRIBE, g.key, g.queue))

    def announce_groups(self, link: Link) -> None:
        """A broker link that now says it takes queue group ops (its
        WELCOME, after our wants went): the groups it hears of.  (Its
        joining is idempotent, see _apply_queue: once too many is none.)"""
        ops = self._group_ops(link)
        if ops:
            self._emit_link(link, ops)

    def _group_ops(self, link: Link) -> list:
        """The groups a broker link hears of, as the ops of a snapshot."""
        if not link.groups:
            return []
        return [(SUBSCRIBE, g.key, g.queue) for g in self.groups.values() if g.wanted_by(link)]

    def _hold_glob(self, link: Link, pattern: bytes, diff: list) -> bytes:
        """A link's glob, held (once per link: a second subscription only
        counts); returns its literal prefix.  The routing trie holds that
        prefix for the glob's id (the router matches the glob itself), by
        way of the publishers' forwarder, whose diff goes to ``diff``."""
        entry = link.globs.get(pattern)
        if entry is None:
            key = glob_prefix(pattern)[0]
            gid = self.router.add_glob(link.link, pattern)
            diff += self.all.subscribe(gid, key, prefix=True)
            entry = link.globs[pattern] = [gid, 0, key]
        entry[1] += 1
        return entry[2]

    def _drop_glob(self, link: Link, pattern: bytes, diff: list) -> bytes:
        """One subscription of a link's glob less (NotSubscribedError if it
        holds none); returns its literal prefix (the forwarder's diff of
        the last one to ``diff``)."""
        entry = link.globs.get(pattern)
        if entry is None:
            raise NotSubscribedError(f"subscriber {link.link} does not hold glob {pattern!r}")
        entry[1] -= 1
        if not entry[1]:
            gid, _refs, key = link.globs.pop(pattern)
            diff += self.all.unsubscribe(gid, key, prefix=True)
            self.router.remove_glob(gid)
        return entry[2]

    def set_wants(self, link: Link, wanted: set, reset: bool) -> None:
        """Make a link's subscriptions a given set of (key, prefix) (the
        upstream link: what upstream wants from us): subscriptions first,
        so that nothing is dropped in between; with ``reset`` the keys not
        in the set go."""
        current = {(k, p) for k, p, _refs in self.trie.subscriber_keys(link.link)}
        current |= {(key, P.Queue(name, glob)) for name, key, glob in link.queues}
        add = [(SUBSCRIBE, k, p) for k, p in wanted - current]
        rem = [(UNSUBSCRIBE, k, p) for k, p in current - wanted] if reset else []
        self.apply(link, add + rem)

    # -- diffs out -----------------------------------------------------------

    def _emit_all(self, ops) -> None:
        """Tell the publishing clients what is now (un)wanted: ``ops``, an
        ops batch (one for all of them, sent without a copy), or None."""
        if ops is None:
            return
        for link in self.links.snapshot():       # a send may find another link dead
            if link.filters and self.links.is_current(link):
                self._send(link, self.want_diff(link, ops))

    def _emit_link(self, link: Link, diff: list) -> None:
        """A broker link: what we want from it changed (to the upstream
        broker: SUB frames of at most the operations it takes in one)."""
        size = getattr(link, "sub_ops", None) or len(diff) or 1
        for i in range(0, len(diff), size):
            self._send(link, self.want_diff(link, P.encode_ops(diff[i:i + size])))
