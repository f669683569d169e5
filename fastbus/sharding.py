"""Spreading channels over several brokers (seed 000's horizontal scaling).

    client = fastbus.ShardedClient(["tcp://127.0.0.1:6464", "tcp://127.0.0.1:6465"])
    client.publish("room.42", "hi")          # goes to the broker that owns "room.42"
    p = client.pubsub()
    p.subscribe("room.42")                    # subscribes on that same broker
    p.psubscribe("room.*")                    # a pattern may match channels on any broker: all of them

A channel's broker is chosen by consistent hashing (CRC-32C of the channel
on a ring of ``replicas`` points per broker), so every process agrees, and
adding a broker moves only about 1/N of the channels.  Order is kept per
channel, since a channel always uses one broker.
"""

from __future__ import annotations

import bisect
import threading
import time

from fastbus._core import crc32c
from fastbus.client import Client, ConnectionClosed, PubSub, _key, pattern_prefix

__all__ = ["ShardedClient", "ShardedPubSub"]


class ShardedClient:
    """One :class:`fastbus.Client` per broker endpoint; other keyword
    arguments go to each Client."""

    def __init__(self, endpoints: list[str], *, replicas: int = 64, **client_kwargs) -> None:
        if not endpoints:
            raise ValueError("ShardedClient needs at least one endpoint")
        if len(set(endpoints)) != len(endpoints):
            raise ValueError("duplicate endpoint in ShardedClient")
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        self.endpoints = list(endpoints)
        self.clients = [Client(endpoint=e, **client_kwargs) for e in endpoints]
        ring = sorted((crc32c(f"{e}#{i}".encode()), n) for n, e in enumerate(endpoints) for i in range(replicas))
        self._points = [p for p, _n in ring]
        self._owners = [n for _p, n in ring]

    def shard(self, channel) -> int:
        """Index of the broker that owns a channel."""
        i = bisect.bisect(self._points, crc32c(_key(channel))) % len(self._points)
        return self._owners[i]

    def publish(self, channel, message) -> int:
        return self.clients[self.shard(channel)].publish(channel, message)

    def publish_many(self, messages) -> int:
        n = 0
        for channel, message in messages:
            n += self.publish(channel, message)
        return n

    def flush(self, timeout: float | None = 10.0) -> None:
        for c in self.clients:
            c.flush(timeout)

    def pubsub(self, ignore_subscribe_messages: bool = False) -> ShardedPubSub:
        return ShardedPubSub(self, ignore_subscribe_messages)

    def close(self, timeout: float = 5.0) -> None:
        for c in self.clients:
            c.close(timeout)

    def __enter__(self) -> ShardedClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ShardedPubSub:
    """A PubSub over every shard.  Channels subscribe on their own shard,
    patterns on all; confirmations count subscriptions over all shards, and
    a pattern is confirmed once."""

    def __init__(self, client: ShardedClient, ignore_subscribe_messages: bool = False) -> None:
        self._client = client
        self.ignore_subscribe_messages = ignore_subscribe_messages
        self._subs: list[PubSub] = [c.pubsub() for c in client.clients]
        self._cond = threading.Condition()
        for p in self._subs:
            p._wakers.append(self._wake)
        self.channels: dict = {}
        self.patterns: dict = {}
        self._next = 0

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def subscribe(self, *channels) -> None:
        if not channels:
            raise ValueError("subscribe() needs at least one channel")
        for ch in channels:
            self.channels[_key(ch)] = None
            self._subs[self._client.shard(ch)].subscribe(ch)

    def unsubscribe(self, *channels) -> None:
        for ch in channels or list(self.channels):
            self.channels.pop(_key(ch), None)
            self._subs[self._client.shard(ch)].unsubscribe(ch)

    def psubscribe(self, *patterns) -> None:
        if not patterns:
            raise ValueError("psubscribe() needs at least one pattern")
        for pat in patterns:
            pattern_prefix(pat)                   # validate before subscribing anywhere
        for pat in patterns:
            self.patterns[_key(pat)] = None
            for p in self._subs:
                p.psubscribe(pat)

    def punsubscribe(self, *patterns) -> None:
        for pat in patterns or list(self.patterns):
            self.patterns.pop(_key(pat), None)
            for p in self._subs:
                p.punsubscribe(pat)

    @property
    def subscribed(self) -> bool:
        return bool(self.channels or self.patterns)

    def _adjust(self, index: int, msg: dict) -> dict | None:
        kind = msg["type"]
        if kind in ("psubscribe", "punsubscribe") and index != 0:
            return None                           # confirmed by shard 0 for all
        if kind in ("subscribe", "psubscribe", "unsubscribe", "punsubscribe"):
            if self.ignore_subscribe_messages:
                return None
            msg["data"] = len(self.channels) + len(self.patterns)
        return msg

    def get_message(self, ignore_subscribe_messages: bool = False, timeout: float | None = 0.0) -> dict | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        n = len(self._subs)
        while True:
            for k in range(n):
                i = (self._next + k) % n
                msg = self._subs[i].get_message(ignore_subscribe_messages, timeout=0.0)
                if msg is not None:
                    self._next = (i + 1) % n
                    msg = self._adjust(i, msg)
                    if msg is not None:
                        return msg
                    break
            else:
                with self._cond:
                    if any(p.has_ready() for p in self._subs):
                        continue
                    if any(p._closed for p in self._subs):
                        raise ConnectionClosed("pubsub is closed")
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return None
                    self._cond.wait(left)

    def listen(self):
        while True:
            try:
                msg = self.get_message(timeout=None)
            except ConnectionClosed:
                return
            if msg is not None:
                yield msg

    def get_batch(self, timeout: float | None = None, max_messages: int | None = None) -> list:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            out = []
            for p in self._subs:
                out.extend(p.get_batch(timeout=0.0, max_messages=max_messages))
            if out:
                return out
            with self._cond:
                if any(p.has_ready() for p in self._subs):
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return []
                self._cond.wait(left)

    def close(self) -> None:
        for p in self._subs:
            p.close()
        self._wake()
