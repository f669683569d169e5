"""The asyncio twins of the buffered Redis writers:
:class:`AsyncBufferedPublisher` and :class:`AsyncBufferedListProducer`.
Each wraps its sync class (the flush thread is the same) and changes only
how it waits: a call that would block awaits it in a thread
(fastbus._twins.twin_of gives them the sync methods' docstrings).
"""

from __future__ import annotations

import asyncio
from typing import Any, Self

from fastbus._twins import twin_of
from fastbus._types import ChannelT, EncodableT
from fastbus.redis.publisher import BufferedListProducer, BufferedPublisher
from fastbus.redis.publisher_cluster import ClusterRouter


@twin_of(BufferedPublisher)
class AsyncBufferedPublisher:
    """:class:`BufferedPublisher` for asyncio: ``publish`` queues at once
    (and awaits only when the buffer is full), ``flush``/``close`` await the
    flush thread without blocking the event loop; ``async with`` closes.
    The same options and batching: a message leaves at once when the flush
    thread is idle, ``max_delay`` (default None) is an optional linger.
    It wraps a :class:`BufferedPublisher` (the flush thread is the same)
    and uses only its public methods; its methods carry that class's
    docstrings (:func:`fastbus._twins.twin_of`)."""

    _SYNC = BufferedPublisher

    def __init__(self, redis: Any = None, **kwargs: Any) -> None:
        self._sync = self._SYNC(redis, **kwargs)
        if isinstance(self._sync, ClusterRouter):
            self._sync.close()
            raise TypeError("the asyncio publishers do not route by hash slot on Redis Cluster yet: "
                            "use BufferedPublisher / BufferedListProducer (thread-safe) there")

    async def publish(self, channel: ChannelT, message: EncodableT) -> int:
        """Awaits (in a thread, the loop not blocked) only while the buffer
        is full."""
        sync = self._sync
        if not sync.has_room():
            await asyncio.to_thread(sync.wait_for_room)
        return sync.publish(channel, message)

    def has_room(self) -> bool:
        return self._sync.has_room()

    async def wait_for_room(self) -> None:
        """Awaits the sync wait in a thread."""
        await asyncio.to_thread(self._sync.wait_for_room)

    async def flush(self, timeout: float | None = 30.0) -> None:
        """Awaits the sync flush in a thread."""
        await asyncio.to_thread(self._sync.flush, timeout)

    async def close(self, timeout: float | None = 30.0) -> None:
        """Awaits the sync close in a thread."""
        await asyncio.to_thread(self._sync.close, timeout)

    def stats(self) -> dict[str, int]:
        return self._sync.stats()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@twin_of(BufferedListProducer)
class AsyncBufferedListProducer(AsyncBufferedPublisher):
    """:class:`BufferedListProducer` for asyncio: ``await push(key, value)``."""

    _SYNC = BufferedListProducer

    async def push(self, key: ChannelT, value: EncodableT) -> int:
        """Awaits only while the buffer is full, as publish()."""
        return await self.publish(key, value)
