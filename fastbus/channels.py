"""A Django Channels channel layer on fastbus brokers.

(This file is over 700 lines because the Channels layer's contract (send,
receive, groups, flush, capacity, expiry) is one class over one set of
connections, as channels_redis's layer is; the per-loop state is
``_LoopLayer``, an inbox ``_Inbox``, the wire format ``_Serializer``.)

    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "fastbus.channels.ChannelLayer",
            "CONFIG": {"endpoint": "tcp://127.0.0.1:6464"},
        },
    }

Groups are pub/sub, as in channels_redis's ``RedisPubSubChannelLayer``: a
message reaches the receivers that exist when it is sent, through the
broker, and waits in the receiving process (up to ``capacity`` per
channel, at most ``expiry`` seconds) until a consumer takes it.  Named
channels are work queues, as in its default ``RedisChannelLayer``: each
message to one receiver, kept by the broker while none receives.  A
consumer's channel (``new_channel()``'s) goes to the loop that receives
it, and once that loop has closed the broker keeps what is sent to it for
the next loop of the process that receives it, as ``RedisChannelLayer``
keeps it in Redis (``named_channels="pubsub"``: named channels pub/sub
too, and a consumer's channel received only in the loop that made it).

How it maps onto fastbus (docs/channels.md says more):

* Each event loop that uses the layer has its own connections (a
  :class:`fastbus.aio.Client` and one subscribing connection per broker)
  and its own client prefix.  The channels ``new_channel()`` makes there
  all travel on one fastbus channel, ``{prefix}:specific:{client
  prefix}:``, each message carrying its channel's name, whose queue group
  the loop joins once: making a channel costs no round trip after the
  first.  When the loop closes with channels still open, it declares that
  group held (:meth:`fastbus.Client.hold`) before it leaves, and gives
  back what waited in them; another loop that receives one of them joins
  the group and gets what was kept.  (Pub/sub mode: one pattern
  subscription, ``{prefix}:specific:{client prefix}:*``.)
* A group is a fastbus channel, ``{prefix}:group:{name}``, subscribed by
  each loop that has a member of it.  ``group_send()`` publishes once: the
  message crosses each broker link once however many members a process
  has, and the receiving process hands it to each of its members.  A
  channel joins groups in the loop that receives it (a consumer adds its
  own channel_name); ``group_add()`` of any other channel raises, as
  channels_redis's pub/sub layer does.
* A named channel (without ``!``) is the fastbus channel
  ``{prefix}:channel:{name}``, a held queue group on its broker
  (:meth:`fastbus.Client.hold`): the loops that ``receive()`` it are its
  members, each message goes to one of them, and what is sent while none
  receives is kept (up to the sender's capacity: beyond, ChannelFull, in
  any process) for the first to come.  With ``named_channels="pubsub"``
  the loops subscribe to it: every receiver gets every message, and none
  is kept.
* With several endpoints, each channel and group lives on the broker
  :class:`fastbus.sharding.Ring` picks for it, and a loop's own channels on
  the broker its client prefix hashes to.
* ``capacity`` and ``channel_capacity`` bound a named channel's messages
  the broker keeps (above), and each other channel's messages
  waiting in the receiving process: beyond it, a ``send()`` from the same
  loop raises :class:`channels.exceptions.ChannelFull`, and a message that
  arrives is dropped and counted (``stats()["dropped_full"]``, and a log
  line at INFO), as channels_redis's ``group_send()`` drops.  ``expiry``:
  a message older than that (by the sender's clock) when a consumer asks
  for it is dropped and counted.  ``group_expiry``: a membership older
  than that ends (as in channels_redis; re-adding renews it).
* A ``receive()`` that is cancelled ends its channel in this loop (as in
  channels_redis's pub/sub layer: Channels cancels it when a consumer
  exits) and leaves its groups; a message that arrives for an ended
  channel is counted (``dropped_gone``).  One that cannot be read is
  dropped and counted (``malformed``).

When a broker restarts, the clients reconnect and subscribe again by
themselves; a message sent from the moment the broker went away until the
receiving loop has subscribed again may be lost.  A message is never
delivered twice.  A ``send()`` or ``group_send()`` waits in the client for
an unreachable broker only as long as its loop lives: an ``async_to_sync``
call's loop closes at once (and logs what the broker did not confirm).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import json
import logging
import secrets
import struct
import time
import types
import weakref
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer

from fastbus import protocol as P
from fastbus.client.aio import Client, PubSub
from fastbus.client.sharding import Ring
from fastbus.endpoints import check_connect
from fastbus.errors import ConnectionClosed, FlushTimeout, MessagesRejected, NoResponders, QueueFull

__all__ = ["ChannelFull", "ChannelLayer", "DEFAULT_ENDPOINT"]

log = logging.getLogger("fastbus.channels")

#: The broker a layer uses when its CONFIG names none (``fastbus broker``'s default).
DEFAULT_ENDPOINT = f"tcp://127.0.0.1:{P.DEFAULT_PORT}"

#: Each payload on the wire: the sender's time.time() (for ``expiry``), then
#: the serialized message.
_STAMP = struct.Struct("!d")
#: A consumer's channel's payload in queue mode: the stamp, then the
#: channel's name (its length first), then the serialized message.
_NAMED = struct.Struct("!dB")

def _unstamp(data: bytes) -> tuple[float, bytes]:
    """A payload as (its sender's time.time(), the serialized message)."""
    return _STAMP.unpack_from(data)[0], data[_STAMP.size:]


def _owner(channel: str, bang: int) -> str:
    """The client prefix of a consumer's channel (``prefix.OWNER!random``)."""
    return channel[:bang].rpartition(".")[2]


def _stamped(sent_at: float, data: bytes, name: str | None = None) -> bytes:
    """The wire payload of a message: its sender's time, then (a consumer's
    channel in queue mode, whose loop's channels share one fastbus channel)
    the channel's name, one length byte first, then the serialized message."""
    if name is None:
        return _STAMP.pack(sent_at) + data
    b = name.encode()
    return _NAMED.pack(sent_at, len(b)) + b + data


def _unname(data: bytes) -> tuple[str, tuple[float, bytes]]:
    """A consumer's channel's payload (queue mode) as (the channel, (its
    sender's time, the serialized message)); ValueError if it holds no
    whole name."""
    if len(data) <= _NAMED.size:
        raise ValueError("no channel name")
    sent_at, n = _NAMED.unpack_from(data)
    end = _NAMED.size + n
    if n < 1 or len(data) < end:
        raise ValueError("no channel name")
    return data[_NAMED.size:end].decode(), (sent_at, data[end:])


_COUNTERS = ("sent", "unwanted", "delivered", "received", "given_back", "dropped_full", "dropped_expired",
             "dropped_gone",
             "dropped_broker", "malformed", "undelivered_at_close")

#: Messages the reader hands out between two turns of the consumers: a
#: channel's capacity (100 by default) is not overrun by one read alone.
READ_BATCH = 64

#: The default ``max_inbox_bytes`` of the layer's connections (the
#: client's is 8 MiB): what a loop that falls behind may hold unread.
INBOX_BYTES = 1024 * 1024
#: The default ``max_buffer_bytes`` of the layer's clients (the client's is
#: 8 MiB): what a loop's sends may hold while the broker pauses them (its
#: flow control, for receivers that fall behind); past it, send() and
#: group_send() wait, so a producer runs at most this far ahead.
SEND_BUFFER_BYTES = 256 * 1024

#: ``named_channels``: a named channel is a work queue (RedisChannelLayer's
#: semantics) or pub/sub (RedisPubSubChannelLayer's).
NAMED_CHANNELS = ("queue", "pubsub")
#: The queue group of every named channel (queue mode): its receivers.
QUEUE_GROUP = b"channels"
#: Seconds a send() to a named channel waits for the broker's answer.
SEND_TIMEOUT = 10.0
#: A named channel's group membership lasts group_expiry, at most this
#: (the broker's bound of a binding's life: add it again to renew it).
BIND_LIFE_MAX = P.MAX_HOLD_MS / 1000
#: How many event loops' client prefixes a layer remembers (queue mode: a
#: channel of a loop it no longer remembers is not received elsewhere).
MADE_PREFIXES = 4096
#: How many channels of other loops' a loop keeps messages for that no
#: receive() of its has asked for (they came with one it receives): past
#: it, such a message is dropped and counted (``dropped_full``).
MAX_WAITING_CHANNELS = 1024
#: While a named channel has receivers (the broker's last answer said one
#: took the message), at most this many sends to it (and at most its
#: capacity) go without waiting for an answer before one waits again.
UNCHECKED_SENDS = 100


class _Serializer:
    """msgpack (channels_redis's default) or JSON, optionally encrypted with
    Fernet keys (``symmetric_encryption_keys``, as channels_redis takes them:
    the first key encrypts, any of them decrypts)."""

    def __init__(self, serializer_format: str, symmetric_encryption_keys: Any, expiry: float | None) -> None:
        if serializer_format == "msgpack":
            try:
                import msgpack
            except ImportError as exc:
                raise ImportError("fastbus.channels needs msgpack: pip install 'fastbus[channels]'") from exc
            self.dumps, self.loads = msgpack.packb, msgpack.unpackb
        elif serializer_format == "json":
            self.dumps = lambda m: json.dumps(m).encode()
            self.loads = json.loads
        else:
            raise ValueError(f"serializer_format must be 'msgpack' or 'json', not {serializer_format!r}")
        self.crypter = None
        self.ttl = None if expiry is None else int(expiry) + 10
        if symmetric_encryption_keys:
            if isinstance(symmetric_encryption_keys, (str, bytes)):
                raise ValueError("symmetric_encryption_keys must be a list of keys, not one key")
            try:
                from cryptography.fernet import Fernet, MultiFernet
            except ImportError as exc:
                raise ImportError("symmetric_encryption_keys needs the cryptography package") from exc
            import base64
            import hashlib
            fernets = [Fernet(base64.urlsafe_b64encode(hashlib.sha256(k.encode() if isinstance(k, str) else k).digest()))
                       for k in symmetric_encryption_keys]
            self.crypter = MultiFernet(fernets)

    def serialize(self, message: Any) -> bytes:
        data = self.dumps(message)
        return self.crypter.encrypt(data) if self.crypter else data

    def deserialize(self, data: bytes) -> Any:
        if self.crypter:
            data = self.crypter.decrypt(data, self.ttl)
        return self.loads(data)


class ChannelLayer(BaseChannelLayer):
    """A channel layer on one fastbus broker (``endpoint``) or several
    (a list of endpoints).  The other arguments are channels_redis's:
    ``prefix`` (of every fastbus channel the layer uses), ``expiry``
    (seconds a message may wait for a consumer), ``group_expiry`` (seconds
    a group membership lasts), ``capacity`` and ``channel_capacity`` (how
    many messages may wait per channel; ``{glob or regex: capacity}``),
    ``serializer_format`` (``"msgpack"`` or ``"json"``) and
    ``symmetric_encryption_keys``.  ``named_channels``: ``"queue"`` (each
    message of a named channel to one receiver, kept by the broker while
    none receives: RedisChannelLayer's rule) or ``"pubsub"`` (to every
    receiver there is when it is sent: RedisPubSubChannelLayer's).
    ``client_options`` go to each :class:`fastbus.aio.Client` (CURVE keys,
    buffer sizes, ...)."""

    extensions = ["groups", "flush"]

    def __init__(self, endpoint: str | list[str] = DEFAULT_ENDPOINT, *, prefix: str = "asgi", expiry: float = 60,
                 group_expiry: float = 86400, capacity: int = 100, channel_capacity: dict | None = None,
                 serializer_format: str = "msgpack", symmetric_encryption_keys: Any = None,
                 named_channels: str = "queue", client_options: dict | None = None, **unknown: Any) -> None:
        if unknown:
            hint = (" (channels_redis's 'hosts' are Redis servers: this layer takes 'endpoint', a fastbus broker's "
                    "tcp://host:port, or a list of them)") if "hosts" in unknown else ""
            raise TypeError(f"fastbus.channels.ChannelLayer: unknown CONFIG key(s) {', '.join(map(repr, unknown))}{hint}")
        super().__init__(expiry=expiry, capacity=capacity, channel_capacity=channel_capacity)
        # (a malformed endpoint is an InvalidEndpoint now, at startup, not at first use)
        self.endpoints = [check_connect(e) for e in ([endpoint] if isinstance(endpoint, str) else endpoint)]
        self._ring = Ring(self.endpoints)
        if not self.group_name_regex.match(prefix):
            raise ValueError(f"prefix {prefix!r}: use ASCII letters, digits, '-', '_' and '.'")
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity!r}")
        if named_channels not in NAMED_CHANNELS:
            raise ValueError(f"named_channels must be 'queue' or 'pubsub', not {named_channels!r}")
        self.named_channels = named_channels
        self.prefix = prefix
        self.group_expiry = group_expiry
        self.channel_capacity = self.compile_capacities(self.channel_capacity)
        # A loop that falls behind stops reading soon, so the broker's rules
        # for a slow subscriber apply instead of a backlog in this process.
        self.client_options = {"max_inbox_bytes": INBOX_BYTES, "max_buffer_bytes": SEND_BUFFER_BYTES,
                               **(client_options or {})}
        # Random from the OS: a program that seeds `random` gets new names.
        self.client_prefix = secrets.token_hex(6)
        self._serializer = _Serializer(serializer_format, symmetric_encryption_keys, expiry)
        self._layers: dict[asyncio.AbstractEventLoop, _LoopLayer] = {}
        # The client prefixes of the loops that made channels (the latest
        # MADE_PREFIXES): their channels may be received in any loop.
        self._made: dict[str, None] = {}
        self._wrapped: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()   # loops whose close closes ours
        _LIVE.add(self)
        self.counters = dict.fromkeys(_COUNTERS, 0)

    # -- what the Channels API calls -----------------------------------------

    async def send(self, channel: str, message: Any) -> None:
        """Send a message to a channel.  ChannelFull when it holds its
        capacity: a named channel's, kept by the broker for its receivers
        (any process's word: the broker answers each send), a channel of
        ``new_channel()``'s received in this event loop, here."""
        self.require_valid_channel_name(channel)
        await self._get_layer().send(channel, message)

    async def receive(self, channel: str) -> Any:
        """The next message of a channel (waits for one).  A channel of
        ``new_channel()`` is received in any event loop of this layer
        (queue mode: once the loop that made it has closed, what is sent
        to it waits at the broker for the next loop that receives it), in
        the loop that made it with ``named_channels="pubsub"``."""
        layer = self._get_layer()
        if channel not in layer.inboxes:       # (checked when it was opened)
            self.require_valid_channel_name(channel)
        return await layer.receive(channel)

    async def new_channel(self, prefix: str = "specific") -> str:
        """A new channel name for a consumer of this event loop; it receives
        from now on."""
        return await self._get_layer().new_channel(prefix)

    async def close_pools(self) -> None:
        """RedisChannelLayer's name for :meth:`close` (code written for
        channels_redis calls it)."""
        await self.close()

    async def group_add(self, group: str, channel: str) -> None:
        """Add a channel received in this event loop (a consumer's own) to a
        group, for ``group_expiry`` seconds or until its receive() is
        cancelled.  Once this returns, every later group_send() reaches it,
        from any process.  RuntimeError for a channel not received here."""
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        await self._get_layer().group_add(group, channel)

    async def group_discard(self, group: str, channel: str) -> None:
        """Remove a channel from a group (nothing happens if it is not in it)."""
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        await self._get_layer().group_discard(group, channel)

    async def group_send(self, group: str, message: Any) -> None:
        """Send a message to every channel of a group (those over capacity
        miss it: counted in ``stats()``)."""
        self.require_valid_group_name(group)
        await self._get_layer().group_send(group, message)

    async def flush(self) -> None:
        """Forget this event loop's channels, groups and waiting messages,
        drop what the broker keeps for the named channels this loop sent
        to, and close its connections (the layer opens new ones when used
        again).  Other processes and loops keep theirs."""
        layer = self._layers.pop(asyncio.get_running_loop(), None)
        if layer is not None:
            await layer.close(release=True)

    async def close(self) -> None:
        """Close this event loop's connections and forget its channels and
        groups (what the broker keeps for named channels stays)."""
        layer = self._layers.pop(asyncio.get_running_loop(), None)
        if layer is not None:
            await layer.close()

    # -- serialization and names -------------------------------------------

    def serialize(self, message: Any) -> bytes:
        return self._serializer.serialize(message)

    def deserialize(self, data: bytes) -> Any:
        return self._serializer.deserialize(data)

    def _group_key(self, group: str) -> bytes:
        """The fastbus channel of a group."""
        return f"{self.prefix}:group:{group}".encode()

    def stats(self) -> dict[str, int]:
        """Counters since the layer was made, over all its event loops:
        ``sent`` (send and group_send calls), ``unwanted`` (of those, how
        many no subscriber wanted, as the broker told the sender),
        ``delivered`` (messages put in a channel of this process),
        ``received`` (returned by receive()), ``given_back`` (a named
        channel's messages this process was given and no receiver here
        took: sent back to the broker for another), ``dropped_full``,
        ``dropped_expired``, ``dropped_gone`` (for a channel whose receive()
        was cancelled), ``dropped_broker`` (by the broker, for a loop that
        fell behind: its gap notices), ``malformed`` (unreadable: dropped);
        and ``channels`` and ``groups`` held now."""
        out = dict(self.counters)
        out["channels"] = sum(len(layer.inboxes) for layer in self._layers.values())
        out["groups"] = sum(len(layer.groups) for layer in self._layers.values())
        return out

    def _get_layer(self) -> _LoopLayer:
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            # A prefix of its own, drawn now: a process forked after the
            # layer was made (gunicorn --preload) does not share its parent's.
            layer = self._layers[loop] = _LoopLayer(self, secrets.token_hex(6))
            if loop not in self._wrapped:
                self._wrapped.add(loop)
                _close_with_loop(self, loop)
        return layer


_LIVE: weakref.WeakSet[ChannelLayer] = weakref.WeakSet()


@atexit.register
def _shutdown_at_exit() -> None:
    """A server that exits without closing its loop (daphne does): the
    connections still say goodbye, so the broker counts no peer as lost."""
    for owner in list(_LIVE):
        for layer in list(owner._layers.values()):
            layer.shutdown()


def _close_with_loop(owner: ChannelLayer, loop: asyncio.AbstractEventLoop) -> None:
    """Close a loop's connections when the loop closes (as async_to_sync's
    loops do after each call), so nothing is left behind."""
    original = loop.close

    def close(self: asyncio.AbstractEventLoop) -> None:
        layer = owner._layers.pop(self, None)
        if layer is not None and not self.is_closed() and not self.is_running():
            try:
                self.run_until_complete(layer.close())
            except Exception as exc:      # (asyncio.run has shut the executor a flush may need)
                log.warning("fastbus.channels: closing at the event loop's close, unconfirmed by the "
                            "broker: %s", exc)
                layer.shutdown()
        self.close = original            # type: ignore[method-assign]
        original()

    loop.close = types.MethodType(close, loop)   # type: ignore[method-assign]


def _drop(p: PubSub, name: bytes, pattern: bool) -> None:
    """Unsubscribe now, from plain code: the sync class's (un)subscribe
    only sends the request (the asyncio twin's coroutine adds nothing to
    wait for)."""
    sync = super(PubSub, p)
    sync.punsubscribe(name) if pattern else sync.unsubscribe(name)


class _Inbox:
    """One channel's waiting messages in this loop: (sent at, payload)."""

    __slots__ = ("queue", "receivers")

    def __init__(self, capacity: int) -> None:
        self.queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(capacity)
        self.receivers = 0


class _LoopLayer:
    """The layer's state in one event loop: its connections, the channels
    received here (inboxes), the groups with members here."""

    def __init__(self, channel_layer: ChannelLayer, client_prefix: str) -> None:
        self.channel_layer = channel_layer
        cl = channel_layer
        self.client_prefix = client_prefix
        n = len(cl.endpoints)
        self.clients: list[Client | None] = [None] * n
        self.pubsubs: list[PubSub | None] = [None] * n
        self.readers: list[asyncio.Task | None] = [None] * n
        self.inboxes: dict[str, _Inbox] = {}
        self.groups: dict[str, dict[str, float]] = {}     # group -> {channel: added at, monotonic}
        self.topics: set[tuple[bytes, int]] = set()        # (topic, shard) subscribed
        self._locks = [asyncio.Lock() for _ in range(n)]   # subscribing, one at a time per broker
        self.queues = channel_layer.named_channels == "queue"
        self.held: set[tuple[bytes, int]] = set()          # (named channel's topic, shard) declared held (queue mode)
        self.unchecked: dict[bytes, int] = {}              # topic -> sends left that need no answer
        self._returning: collections.deque[tuple[bytes, str | None, tuple[float, bytes]]] = collections.deque()
        self._returner: asyncio.Task | None = None         # gives _returning back to the broker
        self.member_of: dict[str, set[str]] = {}           # channel -> its groups here
        self.ended: set[str] = set()                       # other loops' channels whose receive() ended here
        self.waiting: set[str] = set()                     # other loops' channels no receive() here asked for yet
        p = cl.prefix
        self.mine = f"{p}:specific:{client_prefix}:"       # this loop's channels' topics start so
        self._mine_b = self.mine.encode()
        self._specific_b = f"{p}:specific:".encode()
        self._group_b = f"{p}:group:".encode()
        self._channel_b = f"{p}:channel:".encode()

    # -- topics ---------------------------------------------------------------

    def _topic(self, channel: str) -> tuple[bytes, int]:
        """The fastbus channel a Channels channel travels on, and its
        broker.  A consumer's channel travels on its loop's (its client
        prefix's) channel: in queue mode that one, a held group with the
        channel's name in each message, in pub/sub mode one per channel
        under it."""
        bang = channel.find("!")
        if bang < 0:
            topic = self._channel_b + channel.encode()
            return topic, self.channel_layer._ring.shard(topic)
        home = self._home(channel, bang)
        return (home if self.queues else home + channel.encode()), self.channel_layer._ring.shard(home)

    def _home(self, channel: str, bang: int) -> bytes:
        """The fastbus channel under which a consumer's channel's loop's go."""
        return self._specific_b + _owner(channel, bang).encode() + b":"

    def _client(self, shard: int) -> Client:
        c = self.clients[shard]
        if c is None:
            c = self.clients[shard] = Client(endpoint=self.channel_layer.endpoints[shard],
                                             **self.channel_layer.client_options)
        return c

    async def _subscribe(self, topic: bytes, shard: int, pattern: bool, queue: bytes | None = None) -> None:
        """Subscribe a topic once (returns when the broker has confirmed it
        for every publisher), as a member of queue group ``queue`` if
        given.  A failed or cancelled subscribe leaves nothing subscribed."""
        if (topic, shard) in self.topics:
            return
        async with self._locks[shard]:            # (one broker's slowness holds up no other)
            if (topic, shard) in self.topics:
                return
            p = self.pubsubs[shard]
            if p is None:
                p = self.pubsubs[shard] = self._client(shard).pubsub(ignore_subscribe_messages=True)
            seq = p.psubscribe_nowait(topic + b"*") if pattern else p.subscribe_nowait(topic, queue=queue)
            try:
                await p.wait_confirmed(seq)
            except BaseException:
                if not p.closed:                  # it stays requested otherwise
                    _drop(p, topic + b"*" if pattern else topic, pattern)
                raise
            self.topics.add((topic, shard))
            reader = self.readers[shard]
            if reader is None or reader.done():
                self.readers[shard] = asyncio.get_running_loop().create_task(self._read(p))

    def _unsubscribe(self, topic: bytes) -> None:
        """Drop a topic's subscriptions, on every broker that has one (the
        broker needs no answer)."""
        for shard, p in enumerate(self.pubsubs):
            if (topic, shard) in self.topics:
                self.topics.discard((topic, shard))
                if p is not None and not p.closed:
                    _drop(p, topic, False)

    async def _publish(self, topic: bytes, shard: int, message: Any, name: str | None = None) -> None:
        cl = self.channel_layer
        payload = _stamped(time.time(), cl.serialize(message), name)
        cl.counters["sent"] += 1
        if not await self._client(shard).publish(topic, payload):
            cl.counters["unwanted"] += 1

    # -- the API, in this loop -------------------------------------------------

    async def send(self, channel: str, message: Any) -> None:
        if self.queues and "!" not in channel:
            await self._enqueue(channel, message)
            return
        inbox = self.inboxes.get(channel)
        if inbox is not None and inbox.queue.full():
            raise ChannelFull(channel)
        topic, shard = self._topic(channel)
        # (queue mode: a plain message to its loop's held group, which the
        # broker keeps while that loop is gone)
        await self._publish(topic, shard, message, channel if self.queues else None)
        if "!" not in channel:
            # (pub/sub mode: answered once the broker has routed it, as
            # RedisPubSubChannelLayer's PUBLISH is -- what is sent before
            # a receiver subscribes is not kept for it)
            await self._client(shard).flush(SEND_TIMEOUT)

    async def _enqueue(self, channel: str, message: Any) -> None:
        """A named channel's message (queue mode): to one of its receivers,
        or kept by the broker for one, within the channel's capacity, whose
        excess is ChannelFull."""
        cl = self.channel_layer
        topic, shard = self._topic(channel)
        payload = _STAMP.pack(time.time()) + cl.serialize(message)
        cl.counters["sent"] += 1
        left = self.unchecked.get(topic, 0)
        if left:
            # A receiver took the last one checked: a plain message (the
            # broker keeps it if no receiver is left by then), no round trip.
            self.unchecked[topic] = left - 1
            await self._client(shard).publish(topic, payload)
            return
        capacity = cl.get_capacity(channel)
        try:
            delivered = await self._put(topic, shard, payload, capacity)
        except QueueFull:
            raise ChannelFull(channel) from None
        if delivered:
            self.unchecked[topic] = min(capacity, UNCHECKED_SENDS) - 1

    async def _put(self, topic: bytes, shard: int, payload: bytes, capacity: int) -> bool:
        """A named channel's payload to its held group (declared once per
        loop: again if the broker let the declaration expire): True if a
        receiver took it, False if the broker keeps it."""
        cl = self.channel_layer
        client = self._client(shard)
        for again in (False, True):
            if (topic, shard) not in self.held:
                await client.hold(topic, QUEUE_GROUP, expiry=cl.expiry or 60)
                self.held.add((topic, shard))
            try:
                return await client.enqueue(topic, payload, capacity, timeout=SEND_TIMEOUT)
            except NoResponders:
                self.held.discard((topic, shard))   # (its declaration ran out at the broker)
                if again:
                    raise
        raise AssertionError("unreachable")

    async def group_send(self, group: str, message: Any) -> None:
        topic = self.channel_layer._group_key(group)
        await self._publish(topic, self.channel_layer._ring.shard(topic), message)

    async def new_channel(self, prefix: str) -> str:
        name = f"{prefix}.{self.client_prefix}!{secrets.token_hex(12)}"
        cl = self.channel_layer
        cl.require_valid_channel_name(name)
        await self._open(name)
        if self.client_prefix not in cl._made:
            cl._made[self.client_prefix] = None
            if len(cl._made) > MADE_PREFIXES:
                del cl._made[next(iter(cl._made))]
        return name

    async def _open(self, channel: str) -> _Inbox:
        """The channel's inbox, subscribing what it needs first."""
        inbox = self.inboxes.get(channel)
        if inbox is not None:
            return inbox
        topic, shard = self._topic(channel)
        if "!" in channel and self.queues:
            # The channel's loop's queue group: this loop joins it, its
            # maker at new_channel(), another once the maker has closed
            # (the maker declared it held then, so what was sent
            # meanwhile waited; joining renews that).
            foreign = topic != self._mine_b
            if foreign:
                owner, cl = _owner(channel, channel.find("!")), self.channel_layer
                if owner not in cl._made:
                    raise AssertionError(f"{channel!r} was not made by new_channel() of this layer (in any event "
                                         f"loop of this process)")
                if any(other.client_prefix == owner for other in cl._layers.values()):
                    # (two loops taking turns at one loop's channels would
                    # each get some of every consumer's messages)
                    raise AssertionError(f"{channel!r} is received in the event loop that made it while that loop "
                                         f"is open; another loop receives it once that one has closed")
            if (topic, shard) not in self.topics:
                if foreign and (topic, shard) not in self.held:
                    await self._client(shard).hold(topic, QUEUE_GROUP, expiry=self.channel_layer.expiry or 60)
                    self.held.add((topic, shard))
                await self._subscribe(topic, shard, pattern=False, queue=QUEUE_GROUP)
            self.ended.discard(channel)
        elif "!" in channel:
            if not topic.startswith(self._mine_b):
                raise AssertionError(f"{channel!r} was not made by new_channel() in this event loop: "
                                     f"with named_channels='pubsub' a specific channel is received where it was made")
            await self._subscribe(self._mine_b, shard, pattern=True)
        elif self.queues:
            # One receiver a message, kept by the broker until one is here:
            # what it gives this loop is this loop's (no bound here but
            # the connection's: the broker's slow-consumer rules).  A
            # member on every broker: its own sends come through its home
            # broker, its groups' messages through each group's (_bind).
            for s in [shard] + [s for s in range(len(self.pubsubs)) if s != shard]:
                await self._subscribe(topic, s, pattern=False, queue=QUEUE_GROUP)
            return self.inboxes.setdefault(channel, _Inbox(0))
        else:
            await self._subscribe(topic, shard, pattern=False)
        return self.inboxes.setdefault(channel, _Inbox(self.channel_layer.get_capacity(channel)))

    async def receive(self, channel: str) -> Any:
        cl = self.channel_layer
        inbox = self.inboxes.get(channel)
        if inbox is None:
            inbox = await self._open(channel)
        self.waiting.discard(channel)
        queue = inbox.queue
        inbox.receivers += 1
        try:
            while True:
                # (a message waiting is taken without a turn of the loop)
                sent_at, payload = queue.get_nowait() if queue.qsize() else await queue.get()
                if cl.expiry is not None and time.time() - sent_at > cl.expiry:
                    cl.counters["dropped_expired"] += 1
                    continue
                try:
                    message = cl.deserialize(payload)
                except Exception as exc:         # one bad payload must not end the consumer
                    cl.counters["malformed"] += 1
                    log.warning("fastbus.channels: a message for %s could not be read (%s: %s): dropped",
                                channel, type(exc).__name__, exc)
                    continue
                cl.counters["received"] += 1
                return message
        except asyncio.CancelledError:
            # Channels cancels a consumer's receive() when the consumer
            # exits: its channel ends here, and leaves its groups
            # (channels_redis's pub/sub rule).
            if inbox.receivers == 1 and self.inboxes.get(channel) is inbox:
                self._end(channel)
            raise
        finally:
            inbox.receivers -= 1

    def _end(self, channel: str, unsubscribe: bool = True) -> None:
        """A channel ends in this loop: its inbox, memberships and
        subscriptions go (what a named channel's inbox holds goes back to
        the broker, for another receiver)."""
        inbox = self.inboxes.pop(channel)
        self.waiting.discard(channel)
        if self.queues and "!" not in channel:
            topic = self._topic(channel)[0]
            while inbox.queue.qsize():
                self._give_back(topic, inbox.queue.get_nowait())
        if self.queues and "!" in channel and self._topic(channel)[0] != self._mine_b:
            self.ended.add(channel)            # (what comes for it here now is dropped, not kept)
        for group in self.member_of.pop(channel, ()):
            members = self.groups.get(group)
            if members is not None:
                members.pop(channel, None)
                if not members:
                    del self.groups[group]
                    self._unsubscribe(self.channel_layer._group_key(group))
        if "!" not in channel and unsubscribe:
            self._unsubscribe(self._topic(channel)[0])

    async def group_add(self, group: str, channel: str) -> None:
        if self.queues and "!" not in channel:
            await self._bind(group, channel)
            return
        if channel not in self.inboxes:
            # Membership lives in the loop that receives the channel: held
            # anywhere else it would end with that loop, or deliver twice.
            raise RuntimeError(
                f"group_add({group!r}, {channel!r}): the channel is not received in this event loop. "
                f"Call it where the channel is received, as consumers do: "
                f"self.channel_layer.group_add(group, self.channel_name); from elsewhere (a sync view, a "
                f"task), send the consumer a message that makes it join")
        members = self.groups.setdefault(group, {})
        members[channel] = time.monotonic()
        topic = self.channel_layer._group_key(group)
        try:
            await self._subscribe(topic, self.channel_layer._ring.shard(topic), pattern=False)
        except BaseException:
            if members.pop(channel, None) is not None and not members:
                self.groups.pop(group, None)
            raise
        if channel in self.inboxes:               # (it may have ended meanwhile)
            self.member_of.setdefault(channel, set()).add(group)
        else:
            members.pop(channel, None)

    async def group_discard(self, group: str, channel: str) -> None:
        if self.queues and "!" not in channel:
            await self._bind(group, channel, unbind=True)
            return
        members = self.groups.get(group)
        if members is None or members.pop(channel, None) is None:
            return
        self.member_of.get(channel, set()).discard(group)
        if not members:
            del self.groups[group]
            self._unsubscribe(self.channel_layer._group_key(group))

    async def _bind(self, group: str, channel: str, unbind: bool = False) -> None:
        """A named channel's membership of a group (queue mode): kept by the
        broker where the group's messages are published, as a binding of
        the group's fastbus channel to the named channel's held group
        there (Client.bind), for ``group_expiry`` (at most a day): every
        message sent to the group goes to one receiver of the channel, in
        whatever process, or is kept for one, within the channel's
        capacity.  Any process may add or discard it."""
        cl = self.channel_layer
        topic = self._topic(channel)[0]
        key = cl._group_key(group)
        shard = cl._ring.shard(key)
        client = self._client(shard)
        if unbind:
            await client.unbind(key, topic, QUEUE_GROUP)
            return
        await client.hold(topic, QUEUE_GROUP, expiry=cl.expiry or 60)    # (declared, or renewed)
        self.held.add((topic, shard))
        life = min(cl.group_expiry or BIND_LIFE_MAX, BIND_LIFE_MAX)
        await client.bind(key, topic, QUEUE_GROUP, life=life, capacity=cl.get_capacity(channel))

    # -- a named channel's messages no receiver here takes (queue mode) ---------

    def _give_back(self, topic: bytes, item: tuple[float, bytes], name: str | None = None) -> None:
        """A held group's message the broker gave this loop, which no
        receiver here will take (a named channel's receive() ended; the
        loop closes): back to the broker, as it was sent (its time kept,
        for ``expiry``; ``name``, a consumer's channel's), for another
        receiver, or kept for one."""
        self._returning.append((topic, name, item))
        if self._returner is None or self._returner.done():
            self._returner = asyncio.get_running_loop().create_task(self._return_all())

    async def _return_all(self) -> None:
        counters = self.channel_layer.counters
        ring = self.channel_layer._ring
        while self._returning:
            topic, name, (sent_at, data) = self._returning.popleft()
            try:
                await self._put(topic, ring.shard(topic), _stamped(sent_at, data, name), 0)
                counters["given_back"] += 1
            except Exception as exc:            # (the broker gone, the loop closing)
                counters["dropped_gone"] += 1
                log.warning("fastbus.channels: a message of %r this process could not give back: %s", topic, exc)

    async def _leave_held(self) -> None:
        """Closing (queue mode): this loop stops receiving its named
        channels and its consumers' channels, and what the broker gave it
        for them that no receiver here took (waiting in their inboxes, or on
        its way until the unsubscribe took effect) goes back, for another
        receiver (a consumer's channel's: for the next loop that receives
        it).  What came for a consumer's channel whose receive() ended is
        dropped (``dropped_gone``)."""
        for task in self.readers:                 # (what is left is read here)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self.readers = [None] * len(self.readers)
        for channel in [c for c in self.inboxes if "!" not in c]:
            self._end(channel, unsubscribe=False)
        # The consumers' channels still open here are kept by the broker
        # from now on, for the next loop that receives them: their loop's
        # group is declared held while this loop is still its member (so
        # nothing is kept twice), then left.  (A process that exits
        # without closing its loop, or is killed, declares nothing: its
        # channels end with it.)
        for topic, shard in {self._topic(c) for c in self.inboxes} - self.held:
            if (topic, shard) in self.topics:
                try:
                    await asyncio.wait_for(self._client(shard).hold(topic, QUEUE_GROUP,
                                                                    expiry=self.channel_layer.expiry or 60),
                                           SEND_TIMEOUT)
                    self.held.add((topic, shard))
                except Exception as exc:
                    log.warning("fastbus.channels: what is sent to this loop's channels from now on is not kept "
                                "(the broker did not hold them: %s)", exc)
        for channel, inbox in self.inboxes.items():
            topic = self._topic(channel)[0]
            while inbox.queue.qsize():
                self._give_back(topic, inbox.queue.get_nowait(), channel)
        for shard, p in enumerate(self.pubsubs):
            topics = [t for t, sh in self.topics
                      if sh == shard and (t.startswith(self._channel_b) or t.startswith(self._specific_b))]
            if p is None or p.closed or not topics:
                continue
            for t in topics:
                self.topics.discard((t, shard))
            try:
                await asyncio.wait_for(p.wait_confirmed(p.unsubscribe_nowait(*topics)), SEND_TIMEOUT)
            except Exception as exc:              # (the broker gone: it gave nothing more)
                log.warning("fastbus.channels: leaving held channels unconfirmed: %s", exc)
            while batch := p.ready_batch():
                for topic, data, *_h in batch:
                    try:
                        if topic.startswith(self._channel_b):
                            self._give_back(topic, _unstamp(data))
                        elif topic.startswith(self._specific_b):
                            name, item = _unname(data)
                            if name in self.inboxes or (topic != self._mine_b and name not in self.ended):
                                self._give_back(topic, item, name)
                            else:
                                self.channel_layer.counters["dropped_gone"] += 1
                    except (ValueError, UnicodeDecodeError, struct.error):
                        self.channel_layer.counters["malformed"] += 1
        if self._returner is not None:
            await asyncio.gather(self._returner, return_exceptions=True)

    # -- arriving messages -----------------------------------------------------

    async def _read(self, p: PubSub) -> None:
        """Hand what arrives on a subscribing connection to its channels, a
        bounded batch at a time, letting the consumers run between batches:
        while they keep up, nothing waits in front of their channels; while
        this whole loop cannot, the connection's reader stops reading and
        the broker's rules for a slow subscriber apply (a ``gap``, logged
        and counted as ``dropped_broker``)."""
        counters = self.channel_layer.counters
        while True:
            try:
                batch = await p.get_batch(max_messages=READ_BATCH)
            except ConnectionClosed:
                return
            except asyncio.CancelledError:
                raise
            except Exception:                       # keep the loop's channels served
                log.exception("fastbus.channels: reading from the broker failed")
                await asyncio.sleep(0.1)
                continue
            for topic, data in batch:
                try:
                    if len(data) < _STAMP.size:
                        raise ValueError(f"{len(data)} bytes")
                    if topic.startswith(self._group_b):
                        self._deliver_group(topic[len(self._group_b):].decode(), data)
                    elif self.queues and topic.startswith(self._specific_b):
                        self._deliver_specific(topic, data)
                    elif topic.startswith(self._mine_b):
                        self._deliver(topic[len(self._mine_b):].decode(), data)
                    elif topic.startswith(self._channel_b):
                        self._deliver(topic[len(self._channel_b):].decode(), data, named=topic)
                except Exception as exc:            # (from anyone who can publish there)
                    counters["malformed"] += 1
                    log.warning("fastbus.channels: dropped a malformed message on %r: %s", topic[:200], exc)
            for notice in p.take_notices():
                if notice["type"] == "gap":
                    lost = notice["data"]["lost"]
                    counters["dropped_broker"] += lost or 0
                    log.warning("fastbus.channels: the broker dropped %s messages for this process, which fell "
                                "behind (its slow-subscriber rule)", "some" if lost is None else lost)
            await asyncio.sleep(0)                  # the consumers' turn

    def _deliver(self, channel: str, data: bytes, item: tuple[float, bytes] | None = None,
                 named: bytes | None = None) -> bool:
        """Put a message in a channel's inbox; False if it was full.
        ``named``: a named channel's topic (a message for it no receiver
        here takes any more goes back, in queue mode)."""
        counters = self.channel_layer.counters
        inbox = self.inboxes.get(channel)
        if inbox is None:
            if named is not None and self.queues:
                self._give_back(named, _unstamp(data))
            else:
                counters["dropped_gone"] += 1
            return True
        queue = inbox.queue
        if queue.full():
            counters["dropped_full"] += 1
            return False
        queue.put_nowait(item or _unstamp(data))
        counters["delivered"] += 1
        return True

    def _deliver_specific(self, home: bytes, data: bytes) -> None:
        """A consumer's channel's message (queue mode), from its loop's
        held group.  A channel of another loop's (one that has gone) that
        no receive() here asked for yet waits here for one, or goes back
        when this loop closes."""
        name, item = _unname(data)
        if name in self.inboxes:                  # (the common case: checked when it was opened)
            self._deliver(name, data, item)
            return
        bang = name.find("!")
        if bang < 0 or self._home(name, bang) != home:
            raise ValueError(f"channel {name[:200]!r} on {home[:200]!r}")
        if home != self._mine_b and name not in self.ended:
            if len(self.waiting) >= MAX_WAITING_CHANNELS:
                self.channel_layer.counters["dropped_full"] += 1
                return
            self.inboxes[name] = _Inbox(self.channel_layer.get_capacity(name))
            self.waiting.add(name)
        self._deliver(name, data, item)

    def _deliver_group(self, group: str, data: bytes) -> None:
        """Put a group message in each member's inbox (once unpacked)."""
        members = self.groups.get(group)
        if not members:
            return
        cl = self.channel_layer
        too_old = time.monotonic() - cl.group_expiry if cl.group_expiry else None
        full = 0
        item = _unstamp(data)     # one for all members
        for channel, added in list(members.items()):
            if too_old is not None and added < too_old:
                del members[channel]
                self.member_of.get(channel, set()).discard(group)
            else:
                full += not self._deliver(channel, data, item)
        if full:
            log.info("%d of %d channels over capacity in group %s", full, len(members), group)
        if not members:
            del self.groups[group]
            self._unsubscribe(cl._group_key(group))

    # -- closing ---------------------------------------------------------------

    def shutdown(self) -> None:
        """Close the connections without the loop (at interpreter exit):
        each client first, which closes its publishing connection before
        its PubSubs (see Client.shutdown)."""
        for c in self.clients:
            if c is not None:
                c.shutdown(1.0)
        for p in self.pubsubs:
            if p is not None:
                p.shutdown(1.0)

    async def close(self, release: bool = False) -> None:
        """Close this loop's connections; with ``release`` (flush()), what
        the broker keeps for the named channels this loop sent to is
        dropped first."""
        if self.queues:
            await self._leave_held()
        if release:
            # (not another loop's channels', which this loop only received)
            for topic, shard in self.held:
                if topic.startswith(self._specific_b) and topic != self._mine_b:
                    continue
                c = self.clients[shard]
                if c is not None and not c.closed:
                    try:
                        await c.release(topic, QUEUE_GROUP)
                    except Exception as exc:      # (the broker gone: nothing is kept there either)
                        log.warning("fastbus.channels: flush() could not release %r: %s", topic, exc)
            self.held.clear()
        for task in self.readers:
            if task is not None:
                task.cancel()
        for task in self.readers:
            if task is not None:
                try:
                    await task
                except BaseException:
                    pass
        for p in self.pubsubs:
            if p is not None:
                await p.aclose()
        for c in self.clients:
            if c is not None:
                try:
                    await c.close()
                except (FlushTimeout, MessagesRejected) as exc:
                    # Closing goes on (every connection closes); the loss
                    # is counted and said, not raised into the app's shutdown.
                    n = getattr(exc, "pending", None) or getattr(exc, "count", 0)
                    self.channel_layer.counters["undelivered_at_close"] += n
                    log.warning("fastbus.channels: %s", exc)
        self.readers = [None] * len(self.readers)
        self.pubsubs = [None] * len(self.pubsubs)
        self.clients = [None] * len(self.clients)
        self.inboxes.clear()
        self.waiting.clear()
        self.ended.clear()
        self.groups.clear()
        self.member_of.clear()
        self.topics.clear()
