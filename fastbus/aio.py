"""asyncio clients, with the API of redis-py's ``redis.asyncio`` pub/sub.

    client = fastbus.aio.Client()
    await client.publish("news", "hello")
    p = client.pubsub()
    await p.subscribe("news")
    async for msg in p.listen():
        ...

These are thin: the sockets, batching, filters and reconnects are the ones of
:class:`fastbus.Client`, run by its I/O thread; waiting is asyncio-native
(the I/O thread wakes the event loop), so nothing here blocks the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastbus.client import Client as _SyncClient
from fastbus.client import ConnectionClosed
from fastbus.client import PubSub as _SyncPubSub

__all__ = ["Client", "PubSub"]


class Client:
    """asyncio twin of :class:`fastbus.Client`; same arguments."""

    def __init__(self, *args, **kwargs) -> None:
        self._sync = _SyncClient(*args, **kwargs)

    @property
    def endpoint(self) -> str:
        return self._sync.endpoint

    async def publish(self, channel, message) -> int:
        """Queue a message (never waits); 0 if nobody wants its channel."""
        return self._sync.publish(channel, message)

    async def publish_many(self, messages) -> int:
        return self._sync.publish_many(messages)

    def is_wanted(self, channel) -> bool:
        return self._sync.is_wanted(channel)

    async def flush(self, timeout: float | None = 10.0) -> None:
        """Send everything queued and wait until the broker has it."""
        await asyncio.to_thread(self._sync.flush, timeout)

    def pubsub(self, ignore_subscribe_messages: bool = False) -> PubSub:
        return PubSub(self._sync.pubsub(ignore_subscribe_messages=ignore_subscribe_messages))

    def stats(self) -> dict:
        return self._sync.stats()

    async def broker_stats(self, timeout: float = 5.0) -> dict:
        return await asyncio.to_thread(self._sync.broker_stats, timeout)

    async def aclose(self, timeout: float = 5.0) -> None:
        await asyncio.to_thread(self._sync.close, timeout)

    close = aclose

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class PubSub:
    """asyncio twin of :class:`fastbus.PubSub`."""

    def __init__(self, sync: _SyncPubSub) -> None:
        self._sync = sync
        self._event = asyncio.Event()
        loop = asyncio.get_running_loop()

        def wake() -> None:           # called in the I/O thread
            try:
                loop.call_soon_threadsafe(self._event.set)
            except RuntimeError:      # the loop is closed
                pass

        sync._wakers.append(wake)

    @property
    def channels(self) -> dict:
        return self._sync.channels

    @property
    def patterns(self) -> dict:
        return self._sync.patterns

    @property
    def subscribed(self) -> bool:
        return self._sync.subscribed

    async def subscribe(self, *channels) -> None:
        self._sync.subscribe(*channels)

    async def psubscribe(self, *patterns) -> None:
        self._sync.psubscribe(*patterns)

    async def unsubscribe(self, *channels) -> None:
        self._sync.unsubscribe(*channels)

    async def punsubscribe(self, *patterns) -> None:
        self._sync.punsubscribe(*patterns)

    async def _wait(self, deadline: float | None) -> bool:
        loop = asyncio.get_running_loop()
        self._event.clear()
        if self._sync.has_ready() or self._sync._closed:
            return True
        timeout = None if deadline is None else max(0.0, deadline - loop.time())
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def get_message(self, ignore_subscribe_messages: bool = False, timeout: float | None = 0.0) -> dict | None:
        """The next message, or None after ``timeout`` seconds (None: wait)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            msg = self._sync.get_message(ignore_subscribe_messages, timeout=0.0)
            if msg is not None:
                return msg
            if self._sync._closed:
                raise ConnectionClosed("pubsub is closed")
            if deadline is not None and loop.time() >= deadline:
                return None
            await self._wait(deadline)

    async def listen(self) -> AsyncIterator[dict]:
        while True:
            try:
                msg = await self.get_message(timeout=None)
            except ConnectionClosed:
                return
            if msg is not None:
                yield msg

    async def get_batch(self, timeout: float | None = None, max_messages: int | None = None) -> list:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            batch = self._sync.get_batch(timeout=0.0, max_messages=max_messages)
            if batch:
                return batch
            if self._sync._closed or (deadline is not None and loop.time() >= deadline):
                return []
            await self._wait(deadline)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._sync.close)

    close = aclose

    async def __aenter__(self) -> PubSub:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
