"""Spreading channels over several brokers (the horizontal scaling of "A Tale of Two Queues").

    client = fastbus.ShardedClient(["tcp://127.0.0.1:6464", "tcp://127.0.0.1:6465"])
    client.publish("room.42", "hi")          # goes to the broker that owns "room.42"
    p = client.pubsub()
    p.subscribe("room.42")                    # subscribes on that same broker
    p.psubscribe("room.*")                    # a pattern may match channels on any broker: all of them

A channel's broker is chosen by consistent hashing (``fastbus._core.shard_hash``,
CRC-32C mixed by MurmurHash3's finaliser, of the channel and of ``replicas``
points per broker on a ring), so every process agrees, and adding a broker
moves only about 1/N of the channels.  Processes that share brokers must
agree on the hash: it was CRC-32C alone until 2026-11-27 (uneven shares),
so do not mix clients from before and after that change.  Order is kept per
channel, since a channel always uses one broker.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Iterator

from fastbus import _messages as M
from fastbus._core import shard_hash
from fastbus._messages import CONFIRM_KINDS, MessageBuffer, PubSubMessage, names_given, to_bytes, to_text
from fastbus._messages import to_bytes as _key
from fastbus.client import Client, ConnectionClosed, PubSub
from fastbus.client._client import close_leaving
from fastbus.client._session import driving, wait_many
from fastbus.errors import FlushTimeout, MessagesRejected

__all__ = ["Ring", "ShardedClient", "ShardedPubSub"]


class Ring:
    """Which of several brokers owns a channel: ``replicas`` points per
    endpoint on a hash ring (consistent hashing).  Every client built over
    the same endpoint list agrees; :class:`ShardedClient` and
    :class:`fastbus.channels.ChannelLayer` use it."""

    def __init__(self, endpoints: list[str], replicas: int = 64) -> None:
        if not endpoints:
            raise ValueError("sharding needs at least one endpoint")
        if len(set(endpoints)) != len(endpoints):
            raise ValueError(f"duplicate endpoint in {endpoints!r}")
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        ring = sorted((shard_hash(f"{e}#{i}".encode()), n) for n, e in enumerate(endpoints) for i in range(replicas))
        self._points = [p for p, _n in ring]
        self._owners = [n for _p, n in ring]

    def shard(self, channel) -> int:
        """Index (in the endpoint list) of the broker that owns a channel."""
        i = bisect.bisect(self._points, shard_hash(_key(channel))) % len(self._points)
        return self._owners[i]


class ShardedClient:
    """One :class:`fastbus.Client` per broker endpoint; other keyword
    arguments go to each Client."""

    def __init__(self, endpoints: list[str], *, replicas: int = 64, **client_kwargs) -> None:
        self._ring = Ring(endpoints, replicas)
        self.endpoints = list(endpoints)
        self.clients = [Client(endpoint=e, **client_kwargs) for e in endpoints]

    def shard(self, channel) -> int:
        """Index of the broker that owns a channel."""
        return self._ring.shard(channel)

    def publish(self, channel, message, headers=None) -> int:
        """Client.publish on the broker that owns the channel."""
        return self.clients[self.shard(channel)].publish(channel, message, headers)

    def publish_many(self, messages) -> int:
        """Client.publish_many, each message to its channel's broker."""
        by_shard: dict[int, list] = {}
        for item in messages:
            by_shard.setdefault(self.shard(item[0]), []).append(item)
        return sum(self.clients[i].publish_many(items) for i, items in by_shard.items())

    def flush(self, timeout: float | None = 10.0) -> None:
        for c in self.clients:
            c.flush(timeout)

    def pubsub(self, ignore_subscribe_messages: bool = False, durable: str | None = None) -> ShardedPubSub:
        """A subscriber over every shard (``durable``: one durable session
        of that name on each shard's broker; see Client.pubsub)."""
        return ShardedPubSub(self, ignore_subscribe_messages, durable)

    def close(self, timeout: float | None = None) -> int:
        """Close every shard's client (as Client.close: without ``timeout``,
        FlushTimeout names what could not be delivered, once all are
        closed; with it, the count is returned)."""
        lost = 0
        failures = []
        for c in self.clients:
            try:
                lost += c.close(timeout)
            except (FlushTimeout, MessagesRejected) as exc:
                lost += exc.pending if isinstance(exc, FlushTimeout) else exc.count
                failures.append(exc)
        if failures:
            raise FlushTimeout("; ".join(str(f) for f in failures), lost) from failures[0]
        return lost

    def __enter__(self) -> ShardedClient:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        close_leaving(self.close, exc_type is not None)


class ShardedPubSub:
    """A PubSub over every shard.  Channels subscribe on their own shard,
    patterns on all.  Confirmations come as from one redis-py connection:
    one per channel or pattern, in call order, each with the running count
    of subscriptions held over all shards (a pattern is confirmed once, when
    every shard has confirmed it)."""

    def __init__(self, client: ShardedClient, ignore_subscribe_messages: bool = False,
                 durable: str | None = None) -> None:
        self._client = client
        self.ignore_subscribe_messages = ignore_subscribe_messages
        self._subs: list[PubSub] = [c.pubsub(durable=durable) for c in client.clients]
        self._decode = bool(client.clients[0].decode_responses)
        self.channels: dict = {}
        self.patterns: dict = {}
        # Calls not confirmed yet, in call order: [kind, name, count, shards
        # still to confirm, the refusal that replaces the confirmation].
        self._expect: deque[list] = deque()
        self._buf = MessageBuffer()
        self._subscribed = False
        self._next = 0

    def _wait_any(self, deadline: float | None) -> bool:
        """Read every shard's connection in this thread until one of them
        has something (True) or ``deadline`` passes (False)."""
        subs = self._subs
        sessions = [p.session for p in subs]
        with driving(sessions, deadline) as held:
            if not held:
                return False
            while not any(p.has_ready() for p in subs):
                if any(p.closed for p in subs):
                    raise ConnectionClosed("pubsub is closed")
                for s in sessions:
                    s.run_posted()
                    s.read()
                if any(p.has_ready() for p in subs):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                wait_many(sessions, deadline)
        return True

    def _name(self, value) -> bytes | str:
        return to_text(to_bytes(value), self._decode)

    def _expecting(self, kind: str, name, shards) -> None:
        self._expect.append([kind, name, len(self.channels) + len(self.patterns), set(shards), None])

    def _wait_confirmed(self, seqs: dict[int, int]) -> None:
        """Until every shard confirmed its request (shard -> seq): the
        requests went out together, so this is one round trip."""
        for shard, seq in seqs.items():
            self._subs[shard].wait_confirmed(seq)

    def subscribe(self, *channels, queue: str | bytes | None = None) -> None:
        """Subscribe to exact channels, each on the broker that owns it;
        returns once in effect on each (PubSub.subscribe; a list first, as
        redis-py takes; ``queue``: as a member of that queue group)."""
        channels = names_given(channels)
        if not channels:
            raise ValueError("subscribe() needs at least one channel")
        self._subscribed = True
        seqs: dict[int, int] = {}
        for ch in channels:
            name = self._name(ch)
            self.channels[name] = None
            shard = self._client.shard(ch)
            self._expecting("subscribe", name, (shard,))
            seqs[shard] = self._subs[shard].subscribe_nowait(ch, queue=queue)
        self._wait_confirmed(seqs)

    def unsubscribe(self, *channels) -> None:
        """Unsubscribe from channels (all of them without arguments)."""
        for ch in names_given(channels) or list(self.channels):
            name = self._name(ch)
            self.channels.pop(name, None)
            shard = self._client.shard(ch)
            self._expecting("unsubscribe", name, (shard,))
            self._subs[shard].unsubscribe(ch)

    def psubscribe(self, *patterns, queue: str | bytes | None = None) -> None:
        """Subscribe to glob patterns (as PubSub.psubscribe), on every broker; returns once in
        effect on every one (``queue``: as a member of that queue group on each)."""
        patterns = names_given(patterns)
        if not patterns:
            raise ValueError("psubscribe() needs at least one pattern")
        for pat in patterns:
            to_bytes(pat)                         # validate before subscribing anywhere
        self._subscribed = True
        seqs: dict[int, int] = {}
        for pat in patterns:
            name = self._name(pat)
            self.patterns[name] = None
            self._expecting("psubscribe", name, range(len(self._subs)))
            for shard, p in enumerate(self._subs):
                seqs[shard] = p.psubscribe_nowait(pat, queue=queue)
        self._wait_confirmed(seqs)

    def punsubscribe(self, *patterns) -> None:
        """Unsubscribe from patterns (all of them without arguments)."""
        for pat in names_given(patterns) or list(self.patterns):
            name = self._name(pat)
            self.patterns.pop(name, None)
            self._expecting("punsubscribe", name, range(len(self._subs)))
            for p in self._subs:
                p.punsubscribe(pat)

    @property
    def subscribed(self) -> bool:
        """True from a subscribe() until the confirmation of an unsubscribe
        that left nothing held has been read (as redis-py)."""
        return self._subscribed

    def _confirmed(self, index: int, msg: PubSubMessage) -> None:
        """A shard's confirmation (or refusal): the calls every shard has
        confirmed, oldest first, become confirmations with running counts."""
        kind = msg["type"]
        kinds = ("subscribe", "psubscribe") if kind == "refused" else (kind,)
        for entry in self._expect:
            if entry[0] in kinds and entry[1] == msg["channel"] and index in entry[3]:
                entry[3].discard(index)
                if kind == "refused":
                    entry[4] = msg
                    table = self.patterns if entry[0] == "psubscribe" else self.channels
                    table.pop(entry[1], None)
                break
        while self._expect and not self._expect[0][3]:
            kind, name, count, _shards, refusal = self._expect.popleft()
            self._buf.notices.append(refusal if refusal is not None else M.confirmation(kind, name, count))
            if kind in ("unsubscribe", "punsubscribe") and not (self.channels or self.patterns):
                self._subscribed = False

    def _ready(self, ignore: bool) -> PubSubMessage | None:
        """The next message that needs no reading, or None."""
        notices = self._buf.notices
        n = len(self._subs)
        while True:
            while notices:
                m = notices.popleft()
                if not (ignore and m["type"] in CONFIRM_KINDS):
                    return m
            for k in range(n):
                i = (self._next + k) % n
                msg = self._subs[i].get_message(timeout=0.0)
                if msg is not None:
                    self._next = (i + 1) % n
                    if msg["type"] in CONFIRM_KINDS or msg["type"] == "refused":
                        self._confirmed(i, msg)
                        break
                    return msg
            else:
                return None

    def get_message(self, ignore_subscribe_messages: bool = False,
                    timeout: float | None = 0.0) -> PubSubMessage | None:
        """The next message from any shard, or None if none arrives within
        ``timeout`` seconds (0: do not wait; None: wait for ever)."""
        ignore = ignore_subscribe_messages or self.ignore_subscribe_messages
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            msg = self._ready(ignore)
            if msg is not None:
                return msg
            if deadline is not None and time.monotonic() >= deadline:
                return None
            self._wait_any(deadline)

    def listen(self) -> Iterator[PubSubMessage]:
        """Messages as they arrive, while anything is subscribed (as
        redis-py's: it ends once the last unsubscribe is confirmed, and at
        close())."""
        while self._subscribed:
            try:
                # (Bounded: a confirmation ignored by ignore_subscribe_messages
                # may end it without a message to return.)
                msg = self.get_message(timeout=0.5)
            except ConnectionClosed:
                return
            if msg is not None:
                yield msg

    def get_batch(self, timeout: float | None = None, max_messages: int | None = None) -> list:
        """Data messages of every shard as ``(channel, data)`` tuples; [] if
        none arrive within ``timeout``.  Confirmations wait for get_message()."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            out = []
            for p in self._subs:
                out.extend(p.get_batch(timeout=0.0, max_messages=max_messages))
            if out:
                return out
            if (deadline is not None and time.monotonic() >= deadline) or not self._wait_any(deadline):
                return []

    def close(self) -> None:
        """Close every shard's connection; nothing is held any more."""
        for p in self._subs:
            p.close()
        self.channels.clear()
        self.patterns.clear()
        self._expect.clear()
        self._buf.clear()
        self._subscribed = False

    def __enter__(self) -> ShardedPubSub:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
