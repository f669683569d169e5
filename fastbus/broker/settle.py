"""Confirmations that wait until a change is in effect everywhere.

A subscriber's ``subscribe()`` returns at its CONFIRM, and from then on
every message any client publishes must reach it (docs/PROTOCOL.md,
"Confirmed means in effect everywhere").  Applying the SUB here is not
enough: publishers drop unwanted messages before they reach the network,
with the view of what is wanted that our WANT messages gave them, and a
downstream broker forwards up only what our WANT asked it for.  So the
CONFIRM of a SUB that added subscriptions waits until every peer we sent a
change to has acknowledged it (ACK with the WANT's number; the upstream
broker's CONFIRM of our SUB), counted per link (``Link.change_seq``,
``change_acked``; fastbus.broker.links).

A peer that does not answer must not hold everybody up.  A session that
filters (a publishing client, a downstream broker) does so only under a
lease: its filter counts for ``filter_lease`` seconds from the moment it
sent a ping we answered (PONG, or WELCOME for its HELLO), and our answers
travel behind our WANT messages.  So ``filter_lease`` after a WANT was
queued, every lease granted before it has run out, and a peer that has not
applied it sends everything: the wait for a session ends there, whatever
it does (stopped with SIGSTOP, starved of its interpreter lock).  The
upstream broker holds no lease of ours (it routes what reaches it): its
confirmation is waited for ``upstream_confirm_timeout`` at most.

The same waiting answers a WANT from upstream (ACK, once our own
publishers and downstream brokers have it), so a subscription confirmed at
one leaf of a tree is in the filters of the publishers on every other.

Replies to one source go in the order of its changes.  Waits go only away
from the source (never back over the link the change came from), so in a
tree of brokers they never wait on each other in a circle.

What a source can make the broker hold is bounded: past
``MAX_PENDING`` replies waiting for one source, a new change's waits merge
into the last one (each link's latest change, the later deadline), and its
reply goes with that one's: at most ``MAX_PENDING`` x links wait entries
per source, however fast it sends SUBs.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable

from .links import Link, LinkTable

log = logging.getLogger("fastbus.broker")

#: Replies one source may have waiting before new ones merge (module doc).
MAX_PENDING = 64


class _Pending:
    """Replies (CONFIRM, or ACK upstream; more than one once merged) and the
    acknowledgements they wait for: ``[link, seq, deadline]`` each."""

    __slots__ = ("replies", "waits")

    def __init__(self, reply: list, waits: list) -> None:
        self.replies = [reply]
        self.waits = waits

    def merge(self, reply: list, waits: list) -> None:
        """A later change's reply and waits, answered with these."""
        self.replies.append(reply)
        mine = {w[0].link: w for w in self.waits}
        for link, seq, deadline in waits:
            w = mine.get(link.link)
            if w is None or w[0] is not link:
                self.waits.append([link, seq, deadline])
            else:
                w[1] = max(w[1], seq)
                w[2] = max(w[2], deadline)


class Settler:
    """The replies waiting for acknowledgements, per source link, and when
    the next one times out (``next_deadline``, time.monotonic(); inf:
    none).  ``send(link, frames)`` is how a reply leaves
    (fastbus.broker.sending.Sender.send); ``lease_end(link)`` is when the
    last lease granted to a session ends (the broker's: Python and the data
    plane both grant them)."""

    def __init__(self, links: LinkTable, send, lease: float, upstream_timeout: float, counters: dict,
                 lease_end: Callable[[Link], float]) -> None:
        self.links = links
        self._send = send
        self.lease_end = lease_end
        self.lease = lease
        self.upstream_timeout = upstream_timeout
        self._counters = counters
        self._queues: dict[int, tuple[Link, deque[_Pending]]] = {}
        self.next_deadline = math.inf
        #: An acknowledgement came in: settle() at the end of the loop's
        #: turn (once for all the ACKs a turn read, not once each).
        self.dirty = False

    @property
    def waiting(self) -> int:
        """Replies not sent yet."""
        return sum(len(q) for _source, q in self._queues.values())

    def reply_when_settled(self, source: Link, reply: list, added: bool) -> None:
        """Send ``reply`` to ``source`` once the change it made is in effect
        everywhere: at once if it added nothing (an unsubscribe needs no
        wait) or every other link has acknowledged what it was sent; after
        the replies to its earlier changes in any case."""
        waits = self._waits(source) if added else []
        entry = self._queues.get(source.link)
        if entry is not None and entry[0] is not source:      # a link id reused: the old one is gone
            del self._queues[source.link]
            entry = None
        if entry is None:
            if not waits:
                self._send(source, reply)
                return
            entry = (source, deque())
            self._queues[source.link] = entry
        if len(entry[1]) >= MAX_PENDING:
            entry[1][-1].merge(reply, waits)
        else:
            entry[1].append(_Pending(reply, waits))
        for _link, _seq, deadline in waits:
            if deadline < self.next_deadline:
                self.next_deadline = deadline

    def _waits(self, source: Link) -> list:
        """What a change from ``source`` waits for: every other link's
        latest change, where not acknowledged yet; from a session, only
        while a lease we granted it may still run (one with none does not
        filter: it sends everything, and its next lease comes behind our
        WANT)."""
        waits = []
        unacked = self.links.unacked
        now = time.monotonic()
        for link_id, link in list(unacked.items()):
            if not link.unacked or not self.links.is_current(link):
                del unacked[link_id]
            elif link is not source:
                if link.holds_lease:
                    lease_end = self.lease_end(link)
                    if now >= lease_end:
                        continue              # no lease of ours may run: it does not filter
                    waits.append([link, link.change_seq, min(link.change_at + self.lease, lease_end)])
                else:
                    waits.append([link, link.change_seq, link.change_at + self.upstream_timeout])
        return waits

    def acked(self, link: Link, seq: int) -> None:
        """A link acknowledged its changes up to ``seq``."""
        if seq > link.change_acked:
            link.change_acked = min(seq, link.change_seq)
            if not link.unacked and self.links.unacked.get(link.link) is link:
                del self.links.unacked[link.link]
            if self._queues:
                self.dirty = True

    def settle(self, now: float) -> None:
        """Send every reply whose waits are over (acknowledged, timed out,
        the link gone, or an upstream we lost), in order per source."""
        next_deadline = math.inf
        self.dirty = False
        for source_id, (source, queue) in list(self._queues.items()):
            while queue:
                pending = queue[0]
                left = []
                for wait in pending.waits:
                    link, seq, deadline = wait
                    if link.change_acked >= seq or not link.answering or not self.links.is_current(link):
                        continue
                    if now >= deadline:
                        self._counters["ack_timeouts"] += 1
                        log.debug("%s (link %d) did not acknowledge change %d within %.3f s: not waited for "
                                  "longer", link.name, link.link, seq, now - deadline + (
                                      self.lease if link.holds_lease else self.upstream_timeout))
                        continue
                    left.append(wait)
                    if deadline < next_deadline:
                        next_deadline = deadline
                pending.waits = left
                if left:
                    break
                queue.popleft()
                for reply in pending.replies:
                    if self.links.is_current(source):
                        self._send(source, reply)
            if not queue and self._queues.get(source_id, (None,))[0] is source:
                del self._queues[source_id]
        self.next_deadline = next_deadline

    def forget(self, link: Link) -> None:
        """A link that left, or starts over: no replies owed to it."""
        entry = self._queues.get(link.link)
        if entry is not None and entry[0] is link:
            del self._queues[link.link]
