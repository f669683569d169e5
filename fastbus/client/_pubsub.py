"""The subscribing side of a client: ``PubSub``.

Its connection is a ``_subsession.SubSession``, owned with the client's
other sessions by its ``Connections``; a PubSub knows that, not the Client.

(This file is over 700 lines because ``PubSub`` is one class with
redis-py's whole API (subscribe, psubscribe and their waits, get_message,
listen, get_batch, handlers, run_in_thread) over one state: the names it
holds, the confirmations it waits for and the messages ready for the
caller.  What is not that state lives elsewhere: the wire and the
confirmations in ``_subsession.py``, decoding and pattern matching in
``fastbus._messages``.)
"""

from __future__ import annotations

import inspect
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from fastbus import _messages as M
from fastbus import protocol as P
from fastbus import _core, tracing
from fastbus._core import BATCH_F_HEADERS, SUBSCRIBE, UNSUBSCRIBE
from fastbus._decoders import Matcher, PubSubBase
from fastbus._messages import CONFIRM_KINDS, MessageBuffer, PubSubMessage, Request, decode, decode_matching, decode_messages
from fastbus._messages import glob_prefix
from fastbus._messages import names_given
from fastbus._messages import to_bytes as to_key
from fastbus.client._connections import Connections
from fastbus.client._items import Batch, Confirmed, Gap, InboxItem, Notice, Refused
from fastbus.client._session import driving
from fastbus.client._subsession import DURABLE_TAKEN_EVERY, HANDSHAKE_CHECK, SUB_OPS_DEFAULT, ConfirmWait, SubSession
from fastbus.client._subsession import batch_records
from fastbus.errors import ConnectionClosed

BATCH_MESSAGES = 8192     # get_batch(): about this many messages per call by default
SUBSCRIBE_KINDS = CONFIRM_KINDS

Handler = Callable[[PubSubMessage], Any]


def _broker_key(name: bytes, pattern: bool, queue: bytes | None = None) -> tuple:
    """``(key, kind)`` a subscription is held under at the broker: a
    channel exact (False); a pattern that is a literal prefix and ``*``
    as that prefix (True: patterns may share it); any other glob as itself
    (P.GLOB: the broker matches it, fastbus.broker.interest); a queue
    group member's as itself, with its group (P.Queue)."""
    if queue is not None:
        return name, P.Queue(queue, pattern)
    if not pattern:
        return name, False
    prefix, exact = glob_prefix(name)
    return (prefix, True) if exact else (name, P.GLOB)


def queue_name(queue: Any, handlers: dict) -> bytes | None:
    """subscribe()'s ``queue=`` (a group's name, str or bytes) as bytes.
    A callable there is the handler of a channel named "queue" (redis-py's
    keywords are channels), put back among ``handlers``."""
    if queue is None:
        return None
    if callable(queue):
        handlers["queue"] = queue
        return None
    if not isinstance(queue, (str, bytes)):
        raise TypeError(f"queue must be a str or bytes (a queue group's name), not {type(queue).__name__}")
    name = queue.encode() if isinstance(queue, str) else queue
    if not 0 < len(name) <= P.MAX_QUEUE_NAME:
        raise ValueError(f"a queue group's name is 1 to {P.MAX_QUEUE_NAME} bytes, not {len(name)}")
    return name


def _subscriptions(names: tuple, handlers: dict) -> tuple[list, dict]:
    """subscribe()'s arguments (a list first, as redis-py takes) with
    redis-py's ``Subscription(name, handler)`` objects (given
    positionally) moved to the handlers."""
    plain = []
    for n in names_given(names):
        if not isinstance(n, (str, bytes)) and hasattr(n, "name") and hasattr(n, "handler"):
            if n.handler is None:
                plain.append(n.name)
            else:
                handlers = {**handlers, n.name: n.handler}
        else:
            plain.append(n)
    return plain, handlers


class PubSub(PubSubBase):
    """Subscriptions and received messages, shaped like redis-py's PubSub.

    ``subscribe`` takes exact channels; ``psubscribe`` Redis's glob
    patterns (``"news.*"``, ``"user.*.events"``, ``"room.?"``,
    ``"[ab]*"``).  Messages are dicts ``{'type', 'pattern', 'channel',
    'data'}``: types ``subscribe``, ``psubscribe``, ``unsubscribe``,
    ``punsubscribe`` (confirmations, ``data`` = subscriptions held),
    ``message`` / ``pmessage``, ``pong`` (ping()), and fastbus's ``gap``
    (``data`` = ``{"lost": messages lost because this subscriber fell
    behind, "down_s": None}``), ``reconnect`` (the subscriptions were resent
    to a restarted or reconnected broker) and ``refused``.  The kinds, their
    builders and the buffering live in :mod:`fastbus._messages`.

    A message matching several subscriptions is delivered once: as
    ``message`` if a channel matches exactly, else as ``pmessage`` with the
    matching pattern of the longest literal prefix (the first subscribed of
    those).  The broker matches globs exactly, as Redis does; other brokers
    and the publishers' filters hold them as their literal prefix.
    ``get_batch()`` returns data messages many at a time as ``(channel,
    data)`` tuples, for high-throughput consumers.

    The thread that calls ``get_message()``, ``get_batch()`` or ``listen()``
    reads the connection itself: a message reaches it with no hand-over
    between threads.  One thread at a time should read a PubSub; others may
    subscribe and unsubscribe meanwhile.
    """

    #: Data that arrives while nobody reads wakes the keeper, which takes it
    #: (a client's inbox of replies, fastbus.client._requests).
    _wake_on_data = False

    def _reader_replies(self) -> Any:
        """The table the native reader hands data to (a sync client's inbox,
        fastbus.client._requests), or None: data is this PubSub's."""
        return None

    def __init__(self, conns: Connections, ignore_subscribe_messages: bool = False,
                 durable: str | None = None) -> None:
        if durable is not None and not P.valid_durable_name(durable):
            raise ValueError(f"a durable name is 1 to {P.DURABLE_NAME_CHARS} printable characters, "
                             f"not {durable!r}")
        self._conns = conns
        #: OpenTelemetry's CONSUMER spans for messages with trace context
        #: (fastbus.tracing; None when it is not configured).
        self._tracing = tracing.consumer()
        self._options = conns.options
        self.ignore_subscribe_messages = ignore_subscribe_messages
        self._responder: Any = None
        self._request = Request.answered_by(None)       # (decode_messages' maker of requests)

        #: A durable subscriber's name (see Client.pubsub), or None.
        self.durable = durable
        #: Channels and patterns held (str with decode_responses), each
        #: mapped to its handler or None.
        self.channels: dict = {}
        self.patterns: dict = {}
        self._open()

    def _open(self) -> None:
        """A fresh connection and empty state (at creation, and for a
        subscribe() after close(), as redis-py reconnects)."""
        self._handlers = 0                        # channels/patterns with a handler
        self._subscribed = False
        # Our subscriptions.  A name (channel, or pattern) is held at the
        # broker under a key (_broker_key): the channel, a "prefix*"
        # pattern's prefix (patterns may share one), or a glob itself.
        # What the decoder reads, in C (fastbus._decoders.Matcher): the
        # local keys (channel or literal prefix) -> ids, the ids' entries,
        # and its answer per channel met (cleared on (un)subscribe).
        self._matcher = Matcher(self._options.decode_responses)
        self._local = self._matcher.trie
        self._byid: dict[int, tuple] = self._matcher.entries   # id -> (name, is pattern, local key, is glob, broker key)
        self._classes: dict = self._matcher.classes
        self._ids: dict[tuple[bytes, bool], int] = {}             # (name, is pattern) -> id
        self._under: dict[tuple, set[int]] = {}   # broker key -> ids held under it
        self._next_id = itertools.count(1)
        # A durable subscriber's SUBs are numbered from the clock (µs): a
        # process that takes the name over numbers past its predecessor's,
        # whose numbers the data it is sent again still carries.
        self._seq = time.time_ns() // 1000 if self.durable is not None else 0
        self._confirms: dict[int, list] = {}      # seq -> (key, prefix, refusals seen, confirmation dict)
        self._refused: dict[int, tuple] = {}      # seq -> (refused (key, prefix) set, reason), until its CONFIRM
        self._refusals_seen = 0
        self._unsub_seqs: deque[int] = deque()    # seqs of unsubscribes not yet confirmed
        #: Queue group subscriptions left, still matched until their
        #: unsubscribe is in effect: (seq, ids).  What the group gave this
        #: member before is its own to take (nobody else will get it).
        self._leaving: deque[tuple[int, list[int]]] = deque()
        # What the session read and nobody took yet: filled by the reader
        # (the holder of the session's lock), emptied by the user's thread.
        # The byte count has one writer each way, so neither loses updates.
        self._inbox: deque = deque()
        self._in_bytes = 0
        self._out_bytes = 0
        # Decoded, not yet returned (fastbus._messages.MessageBuffer):
        # notices (confirmations, gaps, reconnects) for get_message,
        # (channel, data) tuples in bytes (get_batch), message dicts.
        self._buf = MessageBuffer()
        self._control = self._buf.notices
        self._pending = self._buf.pairs
        self._dicts = self._buf.dicts
        self._closed = False
        self.handled: list = []                   # awaitables handlers returned, not yet awaited
        self._session = SubSession(self._conns, self._deliver, self._inbox_full, self.durable,
                                   wake_on_data=self._wake_on_data, replies=self._reader_replies())
        self._session.seq = self._seq
        self._conns.open(self._session)
        self._conns.join(self)

    # -- subscriptions -----------------------------------------------------

    def _change(self, op: int, entries: list[tuple[bytes, bool, str]],
                handlers: dict | None = None, queue: bytes | None = None) -> int:
        """Request (un)subscriptions; returns the seq of the last SUB, whose
        CONFIRM says they are in effect (0: nothing was sent)."""
        if self._closed:
            if op == UNSUBSCRIBE:
                return 0                          # nothing is held after close()
            self.open()                           # as redis-py: a closed PubSub connects again
        if op == SUBSCRIBE:
            for name, pattern, _kind in entries:
                i = self._ids.get((name, pattern))
                if i is not None and self._byid[i][4] != _broker_key(name, pattern, queue):
                    held = self._byid[i][4][1]
                    how = (f"in queue group {held.name.decode(errors='replace')!r}" if isinstance(held, P.Queue)
                           else "without a queue group")
                    raise ValueError(f"{self._out(name)!r} is subscribed {how} on this PubSub: unsubscribe it first")
            self._subscribed = True
        # At most the operations the broker takes in one SUB frame each.
        size = self._session.limit("max_sub_ops", SUB_OPS_DEFAULT)
        seq = 0
        for i in range(0, len(entries), size):
            seq = self._change_one(op, entries[i:i + size], handlers, queue)
        return seq

    def _change_one(self, op: int, entries: list[tuple[bytes, bool, str]],
                    handlers: dict | None = None, queue: bytes | None = None) -> int:
        ops = []
        confirms = []
        leaving = []
        for name, pattern, kind in entries:
            table = self.patterns if pattern else self.channels
            i = self._ids.get((name, pattern))
            # (Unsubscribing: under the key it is held by, its group's too.)
            bkey = _broker_key(name, pattern, queue) if i is None else self._byid[i][4]
            if op == SUBSCRIBE and i is None:
                if self._hold(name, pattern, bkey):
                    ops.append((SUBSCRIBE, *bkey))
            elif op == UNSUBSCRIBE and i is not None:
                member = isinstance(bkey[1], P.Queue)
                if member:
                    leaving.append(i)
                if self._drop(i, keep_matching=member):
                    ops.append((UNSUBSCRIBE, *bkey))
            shown = self._out(name)
            if op == SUBSCRIBE:
                handler = handlers.get(shown) if handlers else None
                if (table.get(shown) is not None) != (handler is not None):
                    self._handlers += 1 if handler is not None else -1
                table[shown] = handler
            elif shown in table:
                if table.pop(shown) is not None:
                    self._handlers -= 1
            confirms.append((*bkey, self._refusals_seen,
                             M.confirmation(kind, shown, len(self.channels) + len(self.patterns))))
        self._classes.clear()
        self._seq += 1
        seq = self._seq
        self._confirms[seq] = confirms
        if op == UNSUBSCRIBE and ops:
            self._unsub_seqs.append(seq)
        if leaving:
            self._leaving.append((seq, leaving))
        s = self._session
        s.post(lambda: s.change(seq, ops))
        return seq

    def _hold(self, name: bytes, pattern: bool, bkey: tuple) -> bool:
        """Hold ``name`` under broker key ``bkey``; True if the broker must
        be told (nothing was held under that key)."""
        i = next(self._next_id)
        local, exact = glob_prefix(name) if pattern else (name, True)
        self._ids[name, pattern] = i
        self._byid[i] = (name, pattern, local, not exact, bkey)
        self._local.add(local, i, prefix=pattern)
        under = self._under.setdefault(bkey, set())
        under.add(i)
        return len(under) == 1

    def _drop(self, i: int, keep_matching: bool = False) -> bool:
        """Stop holding subscription ``i``; True if the broker must be told
        (it was the last held under its key).  ``keep_matching``: what
        arrives for it is still matched until ``_left`` (a queue group's
        member that leaves)."""
        name, pattern, local, _glob, bkey = self._byid[i] if keep_matching else self._byid.pop(i)
        del self._ids[name, pattern]
        if not keep_matching:
            self._local.remove(local, i, prefix=pattern)
        under = self._under[bkey]
        under.discard(i)
        if under:
            return False
        del self._under[bkey]
        return True

    def _forget(self, keys: set) -> int:
        """Subscriptions the broker refused (broker keys): nothing held
        under them is held.  Returns how many names that was."""
        forgotten = 0
        for key, prefix in keys:
            for i in list(self._under.get((key, prefix), ())):
                name, pattern = self._byid[i][:2]
                self._drop(i)
                forgotten += 1
                table = self.patterns if pattern else self.channels
                shown = self._out(name)
                if shown in table and table.pop(shown) is not None:
                    self._handlers -= 1
        self._classes.clear()
        return forgotten

    def _out(self, value):
        if self._options.decode_responses and isinstance(value, bytes):
            return value.decode("utf-8")
        return value

    def subscribe(self, *channels: Any, queue: str | bytes | None = None, **handlers: Handler) -> None:
        """Subscribe to exact channels (bytes, str or numbers), and return
        once the subscriptions are in effect: from then on, every message
        any client publishes to them reaches this PubSub (one round trip
        for any number of channels).  The ``subscribe`` confirmations still
        come through get_message()/listen().  BrokerUnavailable if no
        broker answers within the client's ``socket_connect_timeout``;
        BrokerTimeout if the broker does not confirm within its
        ``subscribe_timeout`` (the subscription stays requested).

        As in redis-py, ``subscribe(**{"ch": handler})`` subscribes to
        ``ch`` with a handler: its messages are passed to
        ``handler(message)`` by the reading calls instead of being
        returned; redis-py's ``Subscription(name, handler)`` objects (any
        object with ``name`` and ``handler``) may be given positionally.  A
        subscribe() after close() connects again.

        ``queue="workers"`` subscribes as a member of the queue group
        ``workers`` (NATS's queue subscribers): of the group's members, in
        any process, each message goes to one, chosen by the broker (round
        robin over those that take messages now), while plain subscribers
        of the channel each still get it.  A channel is held one way on a
        PubSub: unsubscribe it to change its group."""
        self.wait_confirmed(self.subscribe_nowait(*channels, queue=queue, **handlers))

    def psubscribe(self, *patterns: Any, queue: str | bytes | None = None, **handlers: Handler) -> None:
        """Subscribe to glob patterns, matched as Redis matches them (bytes,
        not text): ``*`` any run of bytes, ``?`` one byte, ``[abc]``,
        ``[^a]``, ``[a-z]`` classes, ``\\`` escaping the next character.
        ``"news.*"`` matches every channel starting with ``news.``; ``"*"``
        matches all.  Returns once in effect, and
        ``psubscribe(**{"news.*": handler})`` and ``queue=``, as
        subscribe()."""
        self.wait_confirmed(self.psubscribe_nowait(*patterns, queue=queue, **handlers))

    def subscribe_nowait(self, *channels: Any, queue: str | bytes | None = None, **handlers: Handler) -> int:
        """subscribe() without waiting: the subscriptions are requested.
        Returns what :meth:`wait_confirmed` waits for.  (For drivers that
        wait their own way, such as the asyncio twin and the sharded
        client; applications call subscribe().)"""
        qname = queue_name(queue, handlers)
        if not channels and not handlers:
            raise ValueError("subscribe() needs at least one channel")
        channels, handlers = _subscriptions(channels, handlers)
        names = [to_key(c) for c in channels] + [to_key(c) for c in handlers]
        return self._change(SUBSCRIBE, [(n, False, "subscribe") for n in names], self._handler_map(handlers), qname)

    def psubscribe_nowait(self, *patterns: Any, queue: str | bytes | None = None, **handlers: Handler) -> int:
        """psubscribe() without waiting (see subscribe_nowait)."""
        qname = queue_name(queue, handlers)
        if not patterns and not handlers:
            raise ValueError("psubscribe() needs at least one pattern")
        patterns, handlers = _subscriptions(patterns, handlers)
        names = [to_key(p) for p in patterns] + [to_key(p) for p in handlers]
        return self._change(SUBSCRIBE, [(n, True, "psubscribe") for n in names], self._handler_map(handlers), qname)

    def wait_confirmed(self, seq: int) -> None:
        """Block until the broker has confirmed the request ``seq`` (from
        subscribe_nowait()), and with it everything requested before; the
        errors of subscribe().  This thread reads the connection meanwhile
        unless another one is reading it (then it is woken by that one)."""
        if not seq:
            return
        s = self._session
        wait = ConfirmWait(s, seq)
        s.awaiting += 1
        try:
            while s.confirmed < seq:
                # (The native reader holds the lock for moments only: worth
                # a short wait before falling back to being woken.)
                with driving([s], time.monotonic() + 0.002) as held:
                    if held:
                        wait.check(locked=True)
                        s.run_posted()
                        s.read()
                        if s.confirmed < seq:
                            s.wait(wait.wake_by())
                            s.read()
                        continue
                # Another thread reads the connection: its reading wakes us.
                wait.check(locked=False)
                s.wait_read_elsewhere(seq, min(time.monotonic() + 0.05, wait.wake_by()))
        finally:
            s.awaiting -= 1

    def _handler_map(self, handlers: dict) -> dict | None:
        """Handlers keyed as ``channels``/``patterns`` are."""
        if not handlers:
            return None
        for name, h in handlers.items():
            if not callable(h):
                raise TypeError(f"the handler of {name!r} is not callable: {h!r}")
            if not self.awaits_handlers and inspect.iscoroutinefunction(h):
                raise TypeError(f"the handler of {name!r} is a coroutine function: a PubSub of "
                                f"fastbus.aio awaits it, this one cannot")
        return {self._out(to_key(k)): h for k, h in handlers.items()}

    def unsubscribe(self, *channels) -> None:
        """Unsubscribe from channels (all of them without arguments; a list
        first, as redis-py takes)."""
        self.unsubscribe_nowait(*channels)

    def unsubscribe_nowait(self, *channels) -> int:
        """unsubscribe(), returning what :meth:`wait_confirmed` waits for:
        once confirmed, what the broker routed here before the unsubscribe
        took effect (a queue group's share of this member too) has arrived."""
        names = [to_key(c) for c in (names_given(channels) or list(self.channels))]
        return self._change(UNSUBSCRIBE, [(n, False, "unsubscribe") for n in names]) if names else 0

    def punsubscribe(self, *patterns) -> None:
        """Unsubscribe from patterns (all of them without arguments; a list
        first, as redis-py takes)."""
        names = [to_key(p) for p in (names_given(patterns) or list(self.patterns))]
        if names:
            self._change(UNSUBSCRIBE, [(n, True, "punsubscribe") for n in names])

    @property
    def subscribed(self) -> bool:
        """True from a subscribe()/psubscribe() until the confirmation of
        an unsubscribe that left nothing held has been read (redis-py's
        rule), or close()."""
        return self._subscribed

    def ping(self, message: Any = None) -> None:
        """Ask the broker for a ``pong`` message (``data``: ``message`` as
        bytes, or ``b""``), read by get_message() after everything the
        broker sent before it: a round trip through this connection."""
        if self._closed:
            raise ConnectionClosed("pubsub is closed")
        data = self._out(b"" if message is None else to_key(message))
        self._seq += 1
        seq = self._seq
        self._confirms[seq] = [(None, None, self._refusals_seen, M.pong(data))]
        s = self._session
        s.post(lambda: s.change(seq, []))

    # -- the inbox (filled by whoever reads the session) ---------------------

    def _deliver(self, item: InboxItem) -> None:
        """An item read from the broker (the session's lock held)."""
        self._inbox.append(item)
        if type(item) is Batch:
            self._in_bytes += len(item.batch)

    def _inbox_full(self, times: int = 1) -> bool:
        return self._in_bytes - self._out_bytes > times * self._options.max_inbox_bytes

    def _fill(self, deadline: float | None) -> bool:
        """Read the connection in this thread until the inbox holds
        something (True) or ``deadline`` passes (False); ConnectionClosed
        once closed with nothing left."""
        s = self._session
        if self.durable is not None:
            self._tell_taken()                    # (all it was given is taken)
        with driving([s], deadline) as held:
            if not held:
                return bool(self._inbox)
            polled = False
            inbox = self._inbox
            reader = s.reader
            while not inbox:
                if self._closed:
                    raise ConnectionClosed("pubsub is closed")
                if s.refused is not None:
                    raise s.refused
                if s.posted:
                    s.run_posted()
                elif reader is not None and reader.queued:
                    # What the native reader took while nobody read: first.
                    s.handle(reader.pop())
                elif s.more:
                    s.read_one()              # one at a time: it goes to its reader at once
                elif polled and deadline is not None and time.monotonic() >= deadline:
                    return False
                elif s.monitor is not None and not s.instance:
                    # CURVE, not welcomed yet: look at the handshake every
                    # HANDSHAKE_CHECK seconds (a refused key is said, not
                    # left as silence).
                    self._check_handshake(s)
                    soon = time.monotonic() + HANDSHAKE_CHECK
                    s.wait(soon if deadline is None or deadline > soon else deadline)
                    polled = True
                else:
                    s.wait(deadline)          # returns at once if the socket holds something
                    polled = True
        return True

    def _check_handshake(self, s) -> None:
        """KeyRefused if the broker refused this CURVE subscriber (never
        welcomed, the handshake failed; the lock held)."""
        why = s.handshake_failure()
        if why:
            from fastbus.errors import KeyRefused
            endpoint = self._options.endpoint
            raise KeyRefused(f"the broker at {endpoint} {why}", endpoint)

    def _take(self, as_dicts: bool = False, sink: list | None = None) -> None:
        """Move the oldest inbox item into ``sink`` or _pending (tuples),
        _dicts (message dicts) or _control (the inbox is not empty)."""
        if self.durable is None:
            self._take_item(self._inbox.popleft(), as_dicts, sink)
            return
        # A durable subscriber counts what its application took (TAKEN).
        s = self._session
        item, n = self._skip_taken(self._inbox.popleft())
        self._take_item(item, as_dicts, sink)
        s.moved += n
        if self._consumed() - s.consumed_told >= DURABLE_TAKEN_EVERY:
            self._tell_taken()

    def _take_item(self, item: InboxItem, as_dicts: bool, sink: list | None) -> None:
        kind = type(item)
        if kind is Batch:
            acked, batch = item.acked, item.batch
            self._out_bytes += len(batch)
            if self._confirms and next(iter(self._confirms)) <= acked:
                # Routed under a SUB whose CONFIRM is still to come (it
                # waits until the SUB is in effect everywhere): the SUB was
                # applied, so its confirmations come first, as in Redis.
                self._emit_confirms(acked)
            while self._unsub_seqs and self._unsub_seqs[0] <= acked:
                self._unsub_seqs.popleft()
            if self._leaving and self._leaving[0][0] <= acked:
                self._left(acked)
            if as_dicts:
                # Classification also drops what no subscription matches.
                # (A request's dict becomes a Request, with respond(): in the
                # decoder's call, one Python call a request.)
                dicts = decode_messages(batch, self._classes, self._matcher, self._options.decode_responses,
                                        self._request)
                if self._tracing is not None and memoryview(batch)[3] & BATCH_F_HEADERS:
                    self._tracing.dicts(dicts)
                self._dicts.extend(dicts)
                return
            if self._unsub_seqs or self._session.adopted:
                # Routed before an unsubscribe took effect (or under another
                # process's subscriptions): keep only what still matches ours.
                records = decode_matching(batch, self._classes, self._matcher)
            else:
                records = decode(batch)
            if self._tracing is not None and memoryview(batch)[3] & BATCH_F_HEADERS:
                self._tracing.tuples(records)
            (self._pending if sink is None else sink).extend(records)
        elif kind is Confirmed:
            self._emit_confirms(item.seq)
        elif kind is Refused:
            forgotten = self._forget(item.refused)
            self._refused[item.seq] = (item.refused, item.reason, self._refusals_seen)
            self._refusals_seen += forgotten
        elif kind is Gap:
            self._control.append(M.gap(lost=item.lost))
        elif kind is Notice:
            self._control.append(M.notice(item.kind, self._out(item.why)))

    # -- a durable subscriber: what its application took --------------------

    def _skip_taken(self, item: InboxItem) -> tuple[InboxItem, int]:
        """A durable subscriber's inbox item, less what a process it took
        the name over from had taken of it (the first batch of a takeover
        may hold some), and the records it counts in the stream."""
        s = self._session
        if type(item) is Gap:
            return item, item.lost
        if type(item) is not Batch:
            return item, 0
        batch = item.batch
        n = batch_records(batch)
        if s.skip:
            skip, s.skip = min(s.skip, n), max(0, s.skip - n)
            item = Batch(item.acked, _core.encode(_core.decode(batch)[skip:]))
        return item, n

    def _consumed(self) -> int:
        """The records of its stream the application took: moved out of the
        inbox and returned."""
        return max(0, self._session.moved - len(self._pending) - len(self._dicts))

    def _tell_taken(self) -> None:
        """TAKEN with what the application took (a durable subscriber), by
        whoever holds the session next."""
        s = self._session
        consumed = self._consumed()
        s.consumed = consumed
        if consumed > s.consumed_told:
            s.post(lambda: s.tell_consumed(consumed))

    def _left(self, upto: int) -> None:
        """The queue group subscriptions left by SUBs up to seq ``upto``
        are no longer matched: those unsubscribes are in effect."""
        while self._leaving and self._leaving[0][0] <= upto:
            for i in self._leaving.popleft()[1]:
                entry = self._byid.pop(i, None)
                if entry is not None:
                    self._local.remove(entry[2], i, prefix=entry[1])
            self._classes.clear()

    def _emit_confirms(self, upto: int) -> None:
        """The confirmations (or refusals, or pong) of every SUB up to seq
        ``upto``, in order, each once."""
        self._left(upto)
        confirms = self._confirms
        while confirms:
            seq = next(iter(confirms))
            if seq > upto:
                return
            entries = confirms.pop(seq)
            refused, reason, before = self._refused.pop(seq, ((), "", self._refusals_seen))
            here = 0
            for key, prefix, seen, msg in entries:
                if key is None:                    # ping()
                    self._control.append(msg)
                elif (key, prefix) in refused and msg["type"] in ("subscribe", "psubscribe"):
                    # Never confirmed: the refusal takes its confirmation's place.
                    here += 1
                    self._control.append(M.notice("refused", self._out(reason.encode()), msg["channel"]))
                else:
                    # The count made at subscribe() held what was refused since.
                    msg["data"] -= before - seen + here
                    self._control.append(msg)
                    if msg["type"] in ("unsubscribe", "punsubscribe") and not (self.channels or self.patterns):
                        self._subscribed = False   # redis-py: when the confirmation is read

    def _message(self, channel: bytes, data: bytes, headers: dict | None = None) -> PubSubMessage | None:
        cls = self._matcher(channel)
        if cls is None:
            return None
        if self._options.decode_responses:
            if headers is not None:
                headers = M.headers_as_text(headers)
            return M.message(channel.decode("utf-8"), data.decode("utf-8"), cls[1], headers)
        return M.message(channel, data, cls[1], headers)

    # -- receiving ---------------------------------------------------------

    def ready_message(self, ignore_subscribe_messages: bool = False) -> PubSubMessage | None:
        """The next message that needs no reading, or None: get_message()
        without reading or waiting (the half of it both twins share)."""
        ignore = ignore_subscribe_messages or self.ignore_subscribe_messages
        buf = self._buf
        while True:
            msg = buf.next_message(ignore, self._message)
            if msg is not None:
                if self._handlers and self._handle(msg):
                    if self.handled:
                        return None               # (awaited before the next one)
                    continue
                return msg
            if not self._inbox:
                return None
            self._take(as_dicts=True)

    #: Does this PubSub await what a handler returns (the asyncio twin)?
    awaits_handlers = False

    def _handle(self, msg: PubSubMessage) -> bool:
        """Pass a data message to its subscription's handler, if it has one
        (an awaitable it returns waits in ``handled``, for the asyncio twin
        to await: ready_message() then returns None)."""
        kind = msg["type"]
        if kind == "message":
            handler = self.channels.get(msg["channel"])
        elif kind == "pmessage":
            handler = self.patterns.get(msg["pattern"])
        else:
            return False
        if handler is None:
            return False
        result = handler(msg)
        if result is not None and inspect.isawaitable(result):
            if not self.awaits_handlers:
                getattr(result, "close", lambda: None)()
                raise TypeError(f"the handler of {msg['channel'] if kind == 'message' else msg['pattern']!r} "
                                f"returned an awaitable: a PubSub of fastbus.aio awaits it, this one cannot")
            self.handled.append(result)
        return True

    # get_message() is PubSubBase's (fastbus/_decoders.pyx): a ready message
    # in one C call, else _next_message() below.

    def _next_message(self, ignore_subscribe_messages: bool, timeout: float | None,
                      while_subscribed: bool) -> PubSubMessage | None:
        """get_message(); with ``while_subscribed``, None as soon as nothing
        is subscribed and nothing is ready (listen()'s end)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            msg = self.ready_message(ignore_subscribe_messages)
            if msg is not None:
                return msg
            if while_subscribed and not self._subscribed:
                return None
            if not self._fill(deadline):
                return None

    def listen(self) -> Iterator[PubSubMessage]:
        """Messages as they arrive, while anything is subscribed (redis-py's
        rule: it ends after the confirmation of the unsubscribe that left
        nothing held has been read, and at close())."""
        dicts = self._dicts
        while self._subscribed or self.has_ready():   # (the last confirmations come together)
            while dicts and not self._control and not self._pending and not self._handlers:
                yield dicts.popleft()
            try:
                msg = self._next_message(False, None, True)
            except ConnectionClosed:
                return
            if msg is not None:
                yield msg

    def ready_batch(self, max_messages: int | None = None) -> list:
        """Data messages that need no reading, or []: get_batch() without
        reading or waiting (the half of it both twins share)."""
        limit = max_messages if max_messages is not None else BATCH_MESSAGES
        if self._dicts:                            # left by get_message(): keep the order
            out = self._buf.batch_from_dicts(limit)
            if out:
                return self._handle_pairs(out) if self._handlers else out
        pending = self._pending
        if pending:                                # left by get_message()/max_messages: first
            if len(pending) <= limit:
                out = list(pending)
                pending.clear()
            else:
                return [pending.popleft() for _ in range(limit)]
        else:
            out = []
        # What has arrived by now, and no more: a sender as fast as this
        # reader must not keep the call from returning.
        for _ in range(len(self._inbox)):
            if len(out) >= limit:
                break
            self._take(sink=out)
        if max_messages is not None and len(out) > max_messages:
            pending.extendleft(reversed(out[max_messages:]))
            del out[max_messages:]
        if out and self._options.decode_responses:
            out = [M.item_as_text(item) for item in out]
        if out and self._handlers:
            out = self._handle_pairs(out)
        return out

    def _handle_pairs(self, pairs: list) -> list:
        """get_batch(): the messages of subscriptions with a handler go to it."""
        rest = []
        for item in pairs:
            channel, data = item[0], item[1]
            key = channel.encode("utf-8") if isinstance(channel, str) else channel
            msg = self._message(key, data.encode("utf-8") if isinstance(data, str) else data,
                                item[2] if len(item) == 3 else None)
            if msg is None or not self._handle(msg):
                rest.append(item)
        return rest

    def get_batch(self, timeout: float | None = None, max_messages: int | None = None) -> list:
        """Data messages many at a time, as ``(channel, data)`` tuples (bytes,
        or str with decode_responses), ``(channel, data, headers)`` for a
        message published with headers; [] if none arrive within ``timeout``.
        At most ``max_messages``, or by default what has arrived up to about
        8192 (whole received batches), so a call never takes long.
        Confirmations and notices wait for get_message()."""
        if max_messages is not None and max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            out = self.ready_batch(max_messages)
            if out:
                return out
            if not self._fill(deadline):
                return []

    def require_handlers(self, caller: str) -> None:
        """NoHandlerError unless every channel and pattern held has a
        handler (what ``caller``, a loop that only calls handlers, needs)."""
        missing = [k for k, h in list(self.channels.items()) + list(self.patterns.items()) if h is None]
        if missing:
            from fastbus.errors import NoHandlerError
            raise NoHandlerError(f"{caller}: no handler for {', '.join(map(repr, missing))}: "
                                 f"subscribe with subscribe(**{{name: handler}})")

    def open(self) -> None:
        """Connect again after close(), as a subscribe() after close() does
        (nothing while open)."""
        if self._closed:
            if self._conns.closed:
                raise ConnectionClosed(f"the client of this pubsub ({self._options.endpoint}) is closed")
            self._open()

    def check_health(self) -> None:
        """redis-py's: is this PubSub's connection usable?  ConnectionClosed
        once closed.  (Its health is checked by the pings it sends its
        broker every ``ping_interval``, which ``health_check_interval`` sets:
        a restarted or lost broker shows as a ``reconnect`` message.)"""
        if self._closed:
            raise ConnectionClosed("pubsub is closed")

    def take_notices(self) -> list[PubSubMessage]:
        """The notices waiting for get_message() (gaps, reconnects,
        refusals, and confirmations unless ignored), taken: for a reader
        that takes its data with get_batch() and must still hear of losses."""
        out = list(self._control)
        self._control.clear()
        if self.ignore_subscribe_messages:
            out = [m for m in out if m["type"] not in CONFIRM_KINDS]
        return out

    def has_ready(self) -> bool:
        """Is anything ready for get_message()/get_batch() without reading?"""
        return bool(self._control or self._pending or self._dicts or self._inbox)

    # -- hooks for the asyncio twin (fastbus.aio) and other drivers -----------

    @property
    def closed(self) -> bool:
        """Has close() run (or the client's)?"""
        return self._closed

    @property
    def responder(self) -> Any:
        """The client a received request's ``respond()`` publishes with
        (``Client.pubsub`` sets it), or None."""
        return self._responder

    @responder.setter
    def responder(self, client: Any) -> None:
        self._responder = client
        self._request = Request.answered_by(client)

    @property
    def session(self) -> SubSession:
        """The connection of this PubSub.  Its ``fd``, ``lock``, ``serve()``
        and ``due_in()`` let an event loop drive it instead of the keeper
        thread (as :mod:`fastbus.aio` does).  Not needed by applications."""
        return self._session

    def read_nowait(self) -> bool:
        """Read what the connection holds now, without waiting, unless
        another thread is reading it; True if something arrived for
        get_message()/get_batch() to take.  ConnectionClosed once closed
        with nothing left.  (An event loop's reader calls it when the
        connection's ``fd`` says so, and awaits otherwise.)"""
        if self._inbox:
            return True
        if self._closed:
            raise ConnectionClosed("pubsub is closed")
        if self._session.refused is not None:
            raise self._session.refused
        if self.durable is not None:
            self._tell_taken()
        with self._session.attempt() as held:
            if held:
                self._session.read()
        return bool(self._inbox)

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Unsubscribe from everything and close this connection."""
        self.shutdown(5.0)

    def shutdown(self, timeout: float = 5.0) -> None:
        """close() with a bound: waits at most ``timeout`` seconds for a
        thread that is reading the connection to let go of it (the client's
        close() calls it for each of its PubSubs)."""
        if self._closed:
            return
        if self.durable is not None:
            self._session.consumed = self._consumed()   # (its BYE keeps the session from there)
        self._closed = True
        # As redis-py's reset(): nothing is held any more.
        self.channels.clear()
        self.patterns.clear()
        self._handlers = 0
        self._subscribed = False
        s = self._session
        s.close_within(timeout)                    # (a reader blocked in wait() is woken: it sees _closed)
        self._conns.forget(s)
        self._conns.leave(self)

    reset = close   # redis-py's name

    def run_in_thread(self, sleep_time: float = 0.0, daemon: bool = False,
                      exception_handler: Callable[[BaseException, Any, Any], None] | None = None
                      ) -> PubSubWorkerThread:
        """As redis-py: a started thread that reads this PubSub and passes
        every message to its subscription's handler, until its ``stop()``
        (which closes the PubSub).  Every channel and pattern needs a
        handler (``subscribe(**{"ch": handler})``), else
        :class:`fastbus.errors.NoHandlerError`.  ``sleep_time`` is how long
        one read waits for a message (0: a short wait, 0.1 s, so that stop()
        is seen); an exception from a handler or the read goes to
        ``exception_handler(exc, pubsub, thread)``, or ends the thread."""
        self.require_handlers("run_in_thread")
        thread = PubSubWorkerThread(self, sleep_time, daemon, exception_handler)
        thread.start()
        return thread

    def __enter__(self) -> PubSub:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PubSubWorkerThread(threading.Thread):
    """The thread of :meth:`PubSub.run_in_thread` (redis-py's name)."""

    def __init__(self, pubsub: PubSub, sleep_time: float, daemon: bool = False,
                 exception_handler: Callable[[BaseException, Any, Any], None] | None = None) -> None:
        super().__init__(daemon=daemon, name="fastbus-pubsub-worker")
        self.pubsub = pubsub
        self.sleep_time = sleep_time
        self.exception_handler = exception_handler
        self._running = threading.Event()

    def run(self) -> None:
        if self._running.is_set():
            return
        self._running.set()
        pubsub = self.pubsub
        wait = self.sleep_time if self.sleep_time > 0 else 0.1
        try:
            while self._running.is_set():
                try:
                    pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)
                except ConnectionClosed:
                    break                         # stop(), or the PubSub or its client closed
                except BaseException as exc:
                    if self.exception_handler is None:
                        raise
                    self.exception_handler(exc, pubsub, self)
        finally:
            pubsub.close()

    def stop(self) -> None:
        """Stop the thread (it closes its PubSub when its read returns)."""
        self._running.clear()
