"""Request/reply: a client's inbox and the messages a responder answers.

A request is a message whose headers name a reply channel (the protocol's
``:reply-to``, docs/PROTOCOL.md "Requests").  The reply channels of one
client are all under its inbox, ``_INBOX.<random>.``, followed by the
request's id; the client subscribes to the whole inbox once, the first time
it asks, so a request costs no subscription.  Replies are matched to their
requests by id in C (``fastbus._core.Replies``, csrc/fb_replies.h): the
inbox's batches go there whole, never through Python per message, and each
waiting thread sleeps on its own request without the interpreter lock.

A sync client's inbox is read by its native reader, which hands each
batch to the table as it reads it (csrc/fb_reader.h ``replies``): a reply
reaches its waiting thread with no other thread, and no interpreter lock,
on the way, however many wait; what it took is told the broker (TAKEN)
by the next request that finds one due.  Without a native reader (before
it starts, or an event loop's inbox) the thread that waits reads the
inbox's connection while no other waiting thread does (the table names
one leader at a time).  A request nobody subscribes to
is answered at once: by this client's filter (the broker's view) when it
says nobody wants the channel, else by the broker, which routed it to
nobody and replies ``:status 503``: :class:`~fastbus.NoResponders`.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

from fastbus import protocol as P
from fastbus._core import SUBSCRIBE, UNSUBSCRIBE, REPLY_CLOSED, REPLY_DONE, REPLY_LEAD, REPLY_NO_RESPONDERS, REPLY_WAITING, Replies
from fastbus._messages import to_bytes as to_key
from fastbus.client._items import Batch, InboxItem, Refused, Replied
from fastbus.client._pubsub import PubSub, queue_name
from fastbus.errors import ConnectionClosed, HoldRefused, NoResponders, QueueFull, RequestTimeout

if TYPE_CHECKING:
    from fastbus.client._connections import Connections

#: Every client's inbox starts so (NATS's name for the same thing).
INBOX_PREFIX = "_INBOX."
#: Requests one client may have waiting at once.
MAX_PENDING = 65536


class InboxMixin:
    """What the sync and the asyncio inbox share: a PubSub subscribed to a
    client's inbox, whose batches go to ``replies`` (matched by id, in C)
    instead of becoming messages.  Mixed in before the PubSub class."""

    def _open_inbox(self) -> None:
        self.prefix = f"{INBOX_PREFIX}{secrets.token_hex(8)}."
        self._prefix_b = self.prefix.encode()
        self.replies = Replies(self._prefix_b, MAX_PENDING)
        self._lead_rid = 0                        # the request of the thread reading now (0: none)
        self._holds: dict[int, str | None] = {}   # hold declarations' seqs -> why the broker refused (None: not)

    def reply_channel(self, rid: int) -> bytes:
        return self._prefix_b + str(rid).encode()

    def _deliver(self, item: InboxItem) -> None:
        """An item read from the broker (the session's lock held): a batch
        of replies goes to the table, which wakes what it completes; the
        refusal of a hold declaration, to its caller (held_outcome)."""
        if type(item) is not Batch:
            if type(item) is Refused and item.seq in self._holds:
                self._holds[item.seq] = item.reason
                return
            super()._deliver(item)               # type: ignore[misc]
            return
        self.replies.take(item.batch)
        self._replied()

    def _replied(self) -> None:
        """After a batch of replies: the reading thread's own reply ends
        its read (the table woke the other threads)."""
        if self._lead_rid and self.replies.state(self._lead_rid) != REPLY_WAITING:
            self._inbox.append(Replied())

    # -- held groups (docs/PROTOCOL.md, "Held groups") -----------------------

    def hold_nowait(self, channel: Any, queue: Any, expiry: float, release: bool = False) -> int:
        """Send the declaration that ``channel``'s queue group ``queue`` is
        held for ``expiry`` seconds (``release``: that it is no longer):
        the seq whose confirmation says it is in effect (then
        :meth:`hold_outcome`)."""
        name = queue_name(queue, {})
        if name is None:
            raise TypeError("hold() needs the queue group's name")
        return self._declare(channel, P.Queue(name, False, _ms(expiry, "a held group's expiry")), release)

    def bind_nowait(self, source: Any, channel: Any, queue: Any, life: float, capacity: int = 0,
                    unbind: bool = False) -> int:
        """Send the binding of channel ``source`` to ``channel``'s held group
        ``queue`` for ``life`` seconds (``unbind``: its end); the seq whose
        confirmation says it is in effect (then :meth:`hold_outcome`)."""
        name = queue_name(queue, {})
        if name is None:
            raise TypeError("bind() needs the queue group's name")
        if not isinstance(capacity, int) or not 0 <= capacity < 1 << 32:
            raise ValueError(f"a binding's capacity is 0 (no bound) to 2**32 - 1, not {capacity!r}")
        into = to_key(channel)
        return self._declare(source, P.Queue(name, False, _ms(life, "a binding's life"), into, capacity), unbind)

    def _declare(self, key: Any, op: P.Queue, end: bool) -> int:
        self._seq += 1
        seq = self._seq
        self._confirms[seq] = []                  # (nothing of it for get_message())
        self._holds[seq] = None
        s = self._session
        change = (UNSUBSCRIBE if end else SUBSCRIBE, to_key(key), op)
        s.post(lambda: s.change(seq, [change]))
        return seq

    def hold_outcome(self, seq: int) -> None:
        """After hold_nowait's wait (confirmed, or given up): forget it;
        HoldRefused if the broker refused the declaration."""
        reason = self._holds.pop(seq, None)
        if reason is not None:
            raise HoldRefused(reason)

    def held_outcome(self, channel: Any, rid: int, timeout: float) -> bool:
        """Forget enqueue request ``rid``: True if a member (or subscriber)
        has it, False if the group keeps it; QueueFull, NoResponders, ..."""
        state, headers, _payload = self.replies.close(rid, True, True)
        if state == REPLY_DONE:
            status = (headers or {}).get(":status")
            if status == P.STATUS_FULL:
                raise QueueFull(channel)
            return status != P.STATUS_KEPT       # (200; a responder's own answer: it has it)
        return self._failed(channel, state, timeout)

    def _failed(self, channel: Any, state: int, timeout: float):
        if state == REPLY_NO_RESPONDERS:
            raise NoResponders(channel)
        if state == REPLY_CLOSED:
            raise ConnectionClosed("the client closed while the request waited")
        raise RequestTimeout(channel, timeout)

    def _outcome(self, channel: Any, rid: int, timeout: float) -> dict:
        """Forget request ``rid``: its reply as a message dict, or the
        error that says why there is none."""
        utf8 = self._options.decode_responses
        state, headers, payload = self.replies.close(rid, utf8)
        if state == REPLY_DONE:
            return reply_message(self.reply_channel(rid), headers, payload, utf8)
        return self._failed(channel, state, timeout)

    def _take_control(self) -> None:
        """What came besides replies (confirmations, notices): nobody reads
        them here."""
        inbox = self._inbox
        while inbox:
            item = inbox.popleft()
            if type(item) is not Replied:
                self._take_item(item, False, [])
        self._control.clear()

    def shutdown(self, timeout: float = 5.0) -> None:
        self.replies.close_all()                  # (every waiting request: ConnectionClosed)
        super().shutdown(timeout)                # type: ignore[misc]


class Inbox(InboxMixin, PubSub):
    """A client's replies (see InboxMixin), matched by the native reader as
    it reads them; without one, the thread that waits for one reads the
    connection while no other waiting thread does, and the keeper takes
    what comes while none waits (a late reply, dropped)."""

    _wake_on_data = True

    def __init__(self, conns: Connections) -> None:
        self._open_inbox()
        super().__init__(conns, ignore_subscribe_messages=True)
        self.psubscribe(self.prefix + "*")        # confirmed: in effect for every publisher

    def _reader_replies(self) -> Any:
        # The native reader matches the inbox's DATA itself: a reply
        # reaches its thread with no thread reading for it (no interpreter
        # lock on the way), however many wait.
        return self.replies

    def lead(self, rid: int, deadline: float) -> None:
        """Read the inbox's connection (this thread leads) until request
        ``rid`` has its reply or ``deadline`` passes."""
        self._lead_rid = rid
        try:
            while self.replies.state(rid) == REPLY_WAITING and time.monotonic() < deadline:
                if not self._fill(deadline):
                    return
                self._take_control()
        finally:
            self._lead_rid = 0

    def wait(self, channel: Any, rid: int, timeout: float, outcome: Any = None) -> Any:
        """Wait for request ``rid``'s reply (leading while nobody else
        reads): the reply as a message dict (or what ``outcome`` makes of
        it: held_outcome); NoResponders, RequestTimeout, ConnectionClosed."""
        replies = self.replies
        deadline = time.monotonic() + timeout
        try:
            while True:
                state = replies.wait(rid, max(0.0, deadline - time.monotonic()))
                if state != REPLY_LEAD:
                    break
                try:
                    self.lead(rid, deadline)
                finally:
                    replies.unlead()
        except BaseException:
            replies.close(rid)
            raise
        s = self._session
        if s.native_taken_due():
            s.post(s.took_natively)               # (what the native reader took: its TAKEN)
        return (outcome or self._outcome)(channel, rid, timeout)


def _ms(seconds: Any, what: str) -> int:
    """A held group's expiry or a binding's life, in the protocol's ms."""
    if not isinstance(seconds, (int, float)) or not 0.001 <= seconds <= P.MAX_HOLD_MS / 1000:
        raise ValueError(f"{what} is 0.001 to {P.MAX_HOLD_MS // 1000} seconds, not {seconds!r}")
    return max(1, round(seconds * 1000))


def reply_message(channel: bytes, headers: dict | None, payload: bytes, utf8: bool) -> dict:
    """A reply as the message dict a PubSub would give for it."""
    if utf8:
        channel, payload = channel.decode(), payload.decode("utf-8", "surrogateescape")
    m = {"type": "message", "pattern": None, "channel": channel, "data": payload}
    if headers is not None:
        m["headers"] = headers
    return m
