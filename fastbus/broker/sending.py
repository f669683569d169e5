"""Everything leaving the broker: each link's batch at the end of a turn,
per-link send queues for links whose socket cannot take more, the
slow-consumer policy, and FLOW pause/resume for publishers.

Batches form by themselves (docs/PROTOCOL.md, "Batching and latency").  The loop reads what its
sockets hold, routing each received batch into the links' outboxes (C,
fastbus.Router); then ``flush_due`` sends every outbox that is due: with no
linger, every outbox that holds records.  So a message that arrives at an
idle broker leaves in the same turn, and under load each link gets one
batch per turn, as large as that turn made it.  An outbox that fills up
during a turn (``max_messages``/``max_bytes``) is sent at once
(``flush_full``), so a flood never grows it past its limits.

A send never blocks.  When a link's socket refuses (EAGAIN: its ZeroMQ
pipe, 16 batches, is full), the frames wait in the link's own queue,
counted in bytes, and the link is *held* in the router: its outbox is then
sent only when full, so what arrives meanwhile forms its next batch.  The
loop retries the queues (``drain``) when the socket reports progress.
Past ``max_queue_bytes`` the slow-consumer policy applies: drop the oldest
data batches (reported with GAP) or disconnect.  Before that, flow control
asks the publishing clients to pause (FLOW) while any queue holds more than
``flow_bytes``, and to resume when all are down to a quarter of it.

Control messages are held to the same limit.  Those that describe a state
rather than an event do not pile up: a queue holds at most one WANT (diffs
that cannot go collapse into a *mark* that sends a reset snapshot, built
when the socket takes it, so the peer's filter ends up exactly right) and
one FLOW (sent as the state at the time it goes).  The others (CONFIRM,
WELCOME, KICK...) count against ``max_queue_bytes`` like data, each with
``QUEUE_ENTRY_BYTES`` for its bookkeeping; if they alone exceed it, the
peer is not reading at all, and it is disconnected as a slow consumer
whatever the policy (control cannot be dropped without breaking the
protocol).  The upstream link, which has no session to end, is resynced
instead (``overflowed``, taken by the loop's maintenance).
"""

from __future__ import annotations

import logging
import time
from collections import deque

import zmq

from fastbus import protocol as P
from fastbus._core import Router

from .config import BrokerConfig
from .links import Link, LinkTable, Session

log = logging.getLogger("fastbus.broker")

_monotonic = time.monotonic

#: What one queued message costs the broker beyond its frames (the queue
#: entry, the list of frames, the frame objects: about 200 bytes measured),
#: counted in ``queued_bytes``, so that a flood of small control messages is
#: bounded by ``max_queue_bytes`` as data is.
QUEUE_ENTRY_BYTES = 256

#: Queue entries that stand for the latest state instead of frames (see the
#: module doc): built when they are sent.
_WANT_MARK = ("want: reset",)
_FLOW_MARK = ("flow: current state",)
_MARKED = {P.WANT: _WANT_MARK, P.FLOW: _FLOW_MARK}


class Sender:
    """Sends frames and batches to links; queues what a socket refuses.
    ``remove(link, reason)`` takes a link out of the broker (a vanished
    peer, a slow consumer under the disconnect policy)."""

    def __init__(self, router: Router, links: LinkTable, config: BrokerConfig, counters: dict, drops: dict,
                 remove) -> None:
        self.router = router
        self.links = links
        self.config = config
        self.counters = counters
        self.drops = drops
        self._remove = remove
        self.blocked: dict[int, Link] = {}       # links with a queue or an unreported loss
        self._holding: set[int] = set()          # links whose queue keeps publishers paused
        self.flow_bytes = config.flow_bytes
        self.paused = False
        self.relay = None                        # the C data plane (fastbus.broker._relay), set by the broker
        self._pause_started = 0.0
        #: link -> the frames of a WANT reset for it (whole snapshot), built
        #: when a queued reset mark is sent; None: WANT is queued as is.
        self.want_reset = None
        self._marks: dict[int, set] = {}         # link id -> marks in its queue
        #: Links without sessions whose control messages alone went over
        #: max_queue_bytes: the loop resyncs them (the upstream link).
        self.overflowed: set[Link] = set()

    # -- frames ----------------------------------------------------------------

    def send(self, link: Link, frames: list, records: int = 0) -> None:
        """Send now if the link keeps up, else queue; records > 0 marks a
        data batch, which the slow-consumer policy may drop."""
        if link.queue or link.lost:
            # Behind others already queued, or behind a pending loss notice.
            self._enqueue(link, frames, records)
        elif not self._try(link, frames):
            self._enqueue(link, frames, records)
        elif records:
            self._count_out(link, records, frames)

    def _count_out(self, link: Link, records: int, frames: list) -> None:
        """A data batch (its last frame) went to a link's socket: counted
        (in the data plane's books, Relay.count_out) as sent only now, so
        a queued batch that the slow-consumer policy drops is counted once,
        as a drop."""
        self.relay.count_out(link.link, records, len(frames[-1]))

    def _try(self, link: Link, frames: list) -> bool:
        """True if the frames went (or the link is gone), False on EAGAIN."""
        try:
            link.send(frames)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            self._gone(link, exc)
            return True
        link.last_sent = _monotonic()
        return True

    def _gone(self, link: Link, exc: zmq.ZMQError) -> None:
        """A send failed for good: a peer that vanished (EHOSTUNREACH) is
        counted and removed; anything else is raised."""
        if exc.errno != zmq.EHOSTUNREACH:
            raise exc
        self.drops["unreachable"] += 1
        self._remove(link, "unreachable")

    # -- batches -----------------------------------------------------------------

    def flush_link(self, link_id: int) -> None:
        """Send the batch a link's outbox holds, if any."""
        batch = self.router.take(link_id)
        if batch is not None:
            self.send_batch(link_id, batch, batch.count)

    def send_batch(self, link_id: int, batch, n: int) -> None:
        """Send a batch of n records taken from a link's outbox."""
        link = self.links.by_id.get(link_id)
        if link is None:
            return
        self.send(link, link.data_frames(batch), n)

    def flush_full(self, link_ids: list) -> None:
        """Outboxes that a received batch filled: out now, before reading on."""
        for link_id in link_ids:
            self.flush_link(link_id)

    def flush_due(self) -> None:
        """The end of a turn: every outbox that is due goes (with no linger,
        every one that holds records, except held links' partial batches)."""
        # The relay sent what it could; these are Python's (other kinds of
        # links, held ones, refused sends).
        for link_id, batch, n in self.relay.flush():
            self.send_batch(link_id, batch, n)

    def flush_everything(self) -> None:
        """On stop: whatever any outbox holds, due or not."""
        while links := self.router.pending():
            for link_id in links:
                self.flush_link(link_id)

    # -- queues --------------------------------------------------------------------

    def _enqueue(self, link: Link, frames: list, records: int) -> None:
        if records or not self._collapse(link, frames):
            size = QUEUE_ENTRY_BYTES
            for f in frames:
                size += len(f)
            link.queue.append((frames, records, size))
            link.queued_bytes += size
        if link.link not in self.blocked:
            self.blocked[link.link] = link
            self.router.hold(link.link)
        flow = self.flow_bytes
        if records and flow and link.queued_bytes > flow and not link.flow_exempt and \
                link.link not in self._holding:
            self._holding.add(link.link)
            if not self.paused:
                self.set_flow(True)
        limit = self.config.max_queue_bytes
        if link.queued_bytes <= limit:
            return
        if self.config.slow_policy == "disconnect":
            self._disconnect_slow(link, "slow consumer")
            return
        # drop the oldest data batches until under the limit; control stays
        kept: deque = deque()
        while link.queue and link.queued_bytes > limit:
            f, recs, sz = link.queue.popleft()
            if recs:
                link.lost += recs
                link.queued_bytes -= sz
                self.drops["slow_consumer"] += recs
            else:
                kept.append((f, recs, sz))
        link.queue.extendleft(reversed(kept))
        if link.queued_bytes > limit:
            # Control messages alone: the peer reads nothing at all.
            if isinstance(link, Session):
                self._disconnect_slow(link, "slow consumer (not reading its control messages)")
            elif link not in self.overflowed:
                self.overflowed.add(link)
                log.warning("%s (link %d) is not reading: %d bytes of control messages queued",
                            link.name, link.link, link.queued_bytes)

    def _disconnect_slow(self, link: Link, reason: str) -> None:
        """The slow-consumer disconnect: the queue goes, the peer is told
        (if its socket takes it) and removed."""
        self.drops["disconnected_slow"] += 1
        link.queue.clear()
        link.queued_bytes = 0
        self._marks.pop(link.link, None)
        frames = link.kick_frames(reason)
        if frames is not None:
            try:
                self._try(link, frames)
            except zmq.ZMQError:
                pass
        self._remove(link, reason)

    def _collapse(self, link: Link, frames: list) -> bool:
        """A control message that a later one of its kind makes moot (WANT,
        FLOW; see the module doc): make sure the link's queue holds one mark
        for it, where the first such message was queued, and nothing else of
        its kind.  True if the message was taken care of so."""
        mark = _MARKED.get(frames[0]) if type(frames[0]) is bytes else None
        if mark is None or (mark is _WANT_MARK and (self.want_reset is None or not isinstance(link, Session))):
            return False
        self.counters["control_collapsed"] += 1
        marks = self._marks.setdefault(link.link, set())
        if mark in marks:
            return True
        cmd = frames[0]
        queue: deque = deque()
        placed = False
        for entry in link.queue:
            f = entry[0]
            if not entry[1] and type(f) is list and f[0] == cmd:
                link.queued_bytes -= entry[2]          # replaced by the mark
                if placed:
                    continue
                entry, placed = (mark, 0, QUEUE_ENTRY_BYTES), True
                link.queued_bytes += QUEUE_ENTRY_BYTES
            queue.append(entry)
        if not placed:
            queue.append((mark, 0, QUEUE_ENTRY_BYTES))
            link.queued_bytes += QUEUE_ENTRY_BYTES
        link.queue.clear()
        link.queue.extend(queue)
        marks.add(mark)
        return True

    def _send_mark(self, link: Link, mark) -> bool:
        """Send what a mark stands for, as _try does frames."""
        if mark is _FLOW_MARK:
            return self._try(link, [P.FLOW, P.FLOW_PAUSE if self.paused else P.FLOW_RESUME])
        # A WANT reset.  The snapshot is built only once the socket has
        # taken the routing id: then the whole message goes (ROUTER checks
        # its high-water mark on the first frame only), and a peer that
        # never reads costs no snapshot per retry.
        sock = link.sock
        try:
            sock.send(link.ident, zmq.NOBLOCK | zmq.SNDMORE)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            self._gone(link, exc)
            return True
        frames = self.want_reset(link)
        for f in frames[:-1]:
            sock.send(f, zmq.NOBLOCK | zmq.SNDMORE, copy=False)      # the ops: no copy
        sock.send(frames[-1], zmq.NOBLOCK, copy=False)
        link.last_sent = _monotonic()
        return True

    def drain(self) -> None:
        """Retry the queued frames of every blocked link, in order, each
        loss reported (GAP) before the data that follows it."""
        for link_id, link in list(self.blocked.items()):
            if not self.links.is_current(link):
                self.blocked.pop(link_id, None)
                continue
            queue = link.queue
            while True:
                if link.lost and (not queue or queue[0][1]):
                    if not self._try(link, [P.GAP, P.pack_u64(link.lost)]):
                        break
                    self.counters["gap_notices"] += 1
                    link.lost = 0
                if not queue:
                    break
                frames, recs, size = queue[0]
                if type(frames) is tuple:             # a mark
                    if not self._send_mark(link, frames) or not self.links.is_current(link):
                        break
                    marks = self._marks.get(link_id)
                    if marks:
                        marks.discard(frames)
                elif not self._try(link, frames) or not self.links.is_current(link):
                    break
                elif recs:
                    self._count_out(link, recs, frames)
                queue.popleft()
                link.queued_bytes -= size
            if link.queued_bytes <= self.flow_bytes // 4:
                self._holding.discard(link_id)
                link.flow_exempt = False
            if not queue and not link.lost and self.blocked.pop(link_id, None) is not None:
                self.router.hold(link_id, False)     # its next batch goes at the end of a turn
        if self.paused and not self._holding:
            self.set_flow(False)

    def discard_queue(self, link: Link) -> None:
        """Forget what is queued for a link (a session that starts over)."""
        link.queue.clear()
        link.queued_bytes = 0
        link.lost = 0
        self._marks.pop(link.link, None)
        self.overflowed.discard(link)
        if self.blocked.pop(link.link, None) is not None:
            self.router.hold(link.link, False)

    def forget(self, link: Link) -> None:
        """A link that left the broker."""
        self.blocked.pop(link.link, None)
        self._marks.pop(link.link, None)
        self.overflowed.discard(link)
        self._holding.discard(link.link)
        if self.paused and not self._holding:
            self.set_flow(False)

    # -- flow control ----------------------------------------------------------------

    def set_flow(self, paused: bool) -> None:
        """Ask the publishing clients connected here to pause or resume."""
        self.paused = paused
        if paused:
            self._pause_started = _monotonic()
            self.counters["flow_pauses"] += 1
        frames = [P.FLOW, P.FLOW_PAUSE if paused else P.FLOW_RESUME]
        for link in self.links.snapshot():
            if link.filters:
                self.send(link, list(frames))

    def check_flow(self, now: float) -> None:
        """A subscriber that took nothing for flow_max_pause seconds while
        publishers waited for it is stuck: it stops holding them back."""
        limit = self.config.flow_max_pause
        if not self.paused or now - self._pause_started < limit:
            return
        for link_id in list(self._holding):
            link = self.links.by_id.get(link_id)
            if link is None:
                self._holding.discard(link_id)
            elif now - max(link.last_sent, self._pause_started) >= limit:
                link.flow_exempt = True
                self._holding.discard(link_id)
                self.counters["flow_timeouts"] += 1
                log.warning("subscriber %s (link %d) took nothing for %.1f s while publishers waited; "
                            "it no longer holds them back (%d bytes queued for it)", link.name, link_id,
                            now - max(link.last_sent, self._pause_started), link.queued_bytes)
        if not self._holding:
            self.set_flow(False)
