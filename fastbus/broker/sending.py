"""Everything leaving the broker: each link's batch at the end of a turn,
per-link send queues for links whose socket cannot take more, the
slow-consumer policy, and FLOW pause/resume for publishers.

All of it is sent by the data plane (fastbus.broker._relay, in C): the
links' batches, and the control messages Python builds (``Sender.send``
hands them to ``Relay.send``).  Python decides what only it can (which
links to remove, when to pause publishers, a WANT reset's snapshot), on
the relay's events.  The policy's rules over a link's queue (when it
holds publishers back, when it loses data or its session) are C's,
csrc/fb_links.h, with its unit tests.

Batches form by themselves (docs/PROTOCOL.md, "Batching and latency").  The
relay reads what its sockets hold, routing each received batch into the
links' outboxes (C, fastbus.Router), and sends every outbox that is due:
with no linger, every outbox that holds records.  So a message that
arrives at an idle broker leaves in the same turn, and under load each link
gets one batch per turn, as large as that turn made it.  An outbox that
fills up during a turn (``max_messages``/``max_bytes``) is sent at once, so
a flood never grows it past its limits.

A send never blocks.  When a link's socket refuses (EAGAIN: its ZeroMQ
pipe, 16 batches, is full), the message waits in the link's own queue in
the relay, counted in bytes, and the link is *held* in the router: its
outbox is then sent only when full, so what arrives meanwhile forms its
next batch.  The relay retries the queues as the socket reports room (its
commands' descriptor, at least every millisecond).  Past
``max_queue_bytes`` the slow-consumer policy applies: drop the oldest data
batches (reported with GAP; never the newest, whatever its size: a held
link's batch grows to max_bytes, and a queue holds at most
max_queue_bytes and that one batch) or disconnect.  Before that, flow control asks
the publishing clients to pause (FLOW) while any queue holds more than
``flow_bytes``, and to resume when all are down to a quarter of it.

Control messages are held to the same limit.  Those that describe a state
rather than an event do not pile up: a queue holds at most one WANT (diffs
that cannot go collapse into a *mark*; when it reaches the head of the
queue the relay asks for a reset snapshot, which Python builds then, so the
peer's filter ends up exactly right) and one FLOW (sent as the state at the
time it goes).  The others (CONFIRM, WELCOME, KICK...) count against
``max_queue_bytes`` like data, each with ``QUEUE_ENTRY_BYTES`` (256) for
its bookkeeping; if they alone exceed it, the peer is not reading at all,
and it is disconnected as a slow consumer whatever the policy (control
cannot be dropped without breaking the protocol).  The upstream link,
which has no session to end, is resynced instead (``overflowed``, taken by
the loop's maintenance).
"""

from __future__ import annotations

import logging
import time

from fastbus import protocol as P

from .config import BrokerConfig
from .links import Link, LinkTable

log = logging.getLogger("fastbus.broker")

_monotonic = time.monotonic

#: The relay's SLOW_REASONS index of a session disconnected by check_stuck.
STUCK = 2


class Sender:
    """Hands control messages to the data plane and acts on its events:
    ``remove(link, reason)`` takes a link out of the broker (a vanished
    peer, a slow consumer the relay disconnected); ``detach(link)``: a
    resumable session lost its connection (it lingers)."""

    def __init__(self, links: LinkTable, config: BrokerConfig, counters: dict, drops: dict, remove,
                 detach) -> None:
        self.links = links
        self.config = config
        self.counters = counters
        self.drops = drops
        self._remove = remove
        self._detach = detach
        self.relay = None                        # the data plane (fastbus.broker._relay), set by attach()
        self._R = None                           # ... and its module (its constants)
        self._pause_started = 0.0
        # While paused (check_flow): each holding link's unsent bytes at the
        # last look, when it was last seen taking, and the next look.
        self._unsent: dict[int, int] = {}
        self._taking: dict[int, float] = {}
        self._next_look = 0.0
        # check_stuck: each queued link's unsent bytes at the last look, and
        # when it was last seen taking.
        self._stuck_look: dict[int, tuple[int, float]] = {}
        #: link -> the frames of a WANT reset for it (whole snapshot), built
        #: when a queued reset mark reaches the head of its queue.
        self.want_reset = None
        #: Links without sessions that read not even their control
        #: messages: the loop resyncs them (the upstream link).
        self.overflowed: set[Link] = set()

    def attach(self, relay) -> None:
        """The data plane, with the slow-consumer policy."""
        from fastbus.broker import _relay        # (built with fastbus; the broker checked it loads)
        self.relay = relay
        self._R = _relay
        cfg = self.config
        relay.set_policy(cfg.max_queue_bytes, cfg.flow_bytes or 0, cfg.slow_policy == "disconnect")

    @property
    def paused(self) -> bool:
        """Are publishers asked to pause?"""
        return self.relay.paused

    # -- sending -----------------------------------------------------------------

    def send(self, link: Link, frames: list) -> None:
        """Send a control message to a link: now if it keeps up, else behind
        what waits for it."""
        status = self.relay.send(link.link, frames)
        if status == self._R.GONE:
            self._gone(link)
        elif status == self._R.DISCONNECTED:
            self.events()                        # the relay's EVENT_SLOW says why

    def _gone(self, link: Link) -> None:
        """A send found the peer vanished (EHOSTUNREACH): counted, removed."""
        if self.links.is_current(link):
            self.drops["unreachable"] += 1
            self._remove(link, "unreachable")

    def flush_link(self, link_id: int) -> None:
        """Send the batch a link's outbox holds, if any."""
        self.relay.flush_link(link_id)

    def flush_full(self, link_ids: list) -> None:
        """Outboxes that a batch Python routed filled: out now."""
        self.relay.flush_links(link_ids)

    def flush_due(self) -> None:
        """The end of a turn: every outbox that is due goes (what the relay
        routed went already; this is for what Python routed), and what the
        relay has to say is acted on."""
        self.relay.flush()
        self.events()

    def flush_everything(self) -> None:
        """On stop: whatever any outbox holds, due or not."""
        self.relay.flush_all()

    # -- the data plane's events -----------------------------------------------------

    def events(self) -> None:
        """Act on what the relay reports (Relay.events)."""
        R = self._R
        for kind, link_id, value in self.relay.events():
            if kind == R.EVENT_FLOW:
                self._update_flow()
                continue
            link = self.links.by_id.get(link_id)
            if link is None:
                continue
            if kind == R.EVENT_WANT:
                if self.relay.wants_reset(link_id):      # (not if its queue went meanwhile)
                    self.relay.fill_want(link_id, self.want_reset(link))
            elif kind == R.EVENT_GONE:
                self._gone(link)
            elif kind == R.EVENT_DETACHED:
                if self.links.is_current(link) and self.relay.resume_state(link_id)[0]:
                    self._detach(link)
            elif kind == R.EVENT_SLOW:
                self.drops["disconnected_slow"] += 1
                self._remove(link, R.SLOW_REASONS[value])
                if value == STUCK and link.role != "redis":   # (a Redis client's is closed by the removal)
                    close = getattr(link.sock, "close_peer", None)
                    if close is not None:
                        close(link.ident, True)
            elif kind == R.EVENT_OVERFLOW and link not in self.overflowed:
                self.overflowed.add(link)
                log.warning("%s (link %d) is not reading: %d bytes of control messages queued",
                            link.name, link.link, self.relay.queue_state(link_id)[0])

    def discard_queue(self, link: Link) -> None:
        """Forget what is queued for a link (a session that starts over)."""
        self.relay.discard_queue(link.link)
        self.overflowed.discard(link)

    def forget(self, link: Link) -> None:
        """A link that left the broker (its queue went with its slot in the
        relay)."""
        self.overflowed.discard(link)
        self._update_flow()

    # -- flow control ----------------------------------------------------------------

    def _update_flow(self) -> None:
        """Pause publishers while any link's queue holds them back; resume
        them when none does."""
        holding = self.relay.holding
        if holding and not self.paused:
            self.set_flow(True)
        elif self.paused and not holding:
            self.set_flow(False)

    def set_flow(self, paused: bool) -> None:
        """Ask the publishing clients connected here to pause or resume."""
        self.relay.paused = paused
        if paused:
            self._pause_started = self._next_look = _monotonic()
            self._unsent.clear()
            self._taking.clear()
            self.counters["flow_pauses"] += 1
        frames = [P.FLOW, P.FLOW_PAUSE if paused else P.FLOW_RESUME]
        for link in self.links.snapshot():
            if link.filters and self.links.is_current(link):
                self.send(link, list(frames))

    def check_flow(self, now: float) -> None:
        """A subscriber that took nothing for flow_max_pause seconds while
        publishers waited for it is stuck: it stops holding them back.  One
        that takes, however slowly, is slow, not stuck: it holds them back
        as long as it is behind.  Taking is seen in what the broker sends
        it (a queued batch handed to its connection) or, between, in its
        connection's unsent bytes falling (what the kernel still holds for
        it, looked at a few times per flow_max_pause)."""
        limit = self.config.flow_max_pause
        if not self.paused or now < self._next_look:
            return
        self._next_look = now + limit / 4
        unsent: dict[int, int] = {}
        for link_id, last_sent, queued, out in self.relay.held_back():
            was = self._unsent.get(link_id)
            if out >= 0:
                unsent[link_id] = out
                if was is not None and out < was:
                    self._taking[link_id] = now
            idle = now - max(last_sent, self._pause_started, self._taking.get(link_id, 0.0))
            if idle >= limit:
                self.relay.exempt(link_id)
                self.counters["flow_timeouts"] += 1
                link = self.links.by_id.get(link_id)
                log.warning("subscriber %s (link %d) took nothing for %.1f s while publishers waited; "
                            "it no longer holds them back (%d bytes queued for it)",
                            link.name if link is not None else "?", link_id, idle, queued)
        self._unsent = unsent
        self._update_flow()

    def check_stuck(self, now: float) -> None:
        """A session that took nothing for stuck_timeout seconds while
        messages waited for it is stuck for good (a process stopped or hung
        with its connection open, a TCP window that stays shut): it is
        disconnected as a slow consumer, and its connection is reset, so
        that neither its queue here nor the kernel's buffers wait for it for
        ever.  Taking is judged as in check_flow: a queued batch handed to
        its connection, or its connection's unsent bytes falling.  (The
        maintenance's, about once a second.)"""
        limit = self.config.stuck_timeout
        if not limit:
            return
        seen: dict[int, tuple[int, float]] = {}
        for link_id, last_sent, queued, out in self.relay.held_back(True):
            was_out, taking = self._stuck_look.get(link_id, (out, now))
            if out >= 0 and out < was_out:
                taking = now
            seen[link_id] = (out, taking)
            idle = now - max(last_sent, taking)
            if idle < limit:
                continue
            link = self.links.by_id.get(link_id)
            if link is None or link.role == "upstream" or link.lingering or not self.links.is_current(link):
                continue
            log.warning("subscriber %s (link %d) took nothing for %.1f s with %d bytes waiting for it: "
                        "disconnected as a slow consumer (--stuck-timeout)", link.name, link_id, idle, queued)
            if self.relay.kick_stuck(link_id):
                seen.pop(link_id, None)
        self._stuck_look = seen
        self.events()
