"""The asyncio twins of the buffered Redis writers:
:class:`AsyncBufferedPublisher` and :class:`AsyncBufferedListProducer`.

Each is a subclass of its sync class that changes only how it waits
(pyzmq's rule, as fastbus.aio's client): the flush thread, the C publish
path, the retries and the reports are the sync class's.  A call that would
block awaits instead, woken by the flush thread through the event loop
(``on_progress``: messages answered, room freed, the thread's end), and
takes its steps through the sync class's hooks (``room_check``,
``start_flush``/``flush_done``, ``stop_steps``); no thread is borrowed to
wait.  (fastbus._twins.twin_of gives them the sync methods' docstrings.)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Self

from fastbus._twins import event_setter, twin_of, wait_event
from fastbus._types import ChannelT, EncodableT
from fastbus.errors import FlushTimeout
from fastbus.redis.connection import is_asyncio, is_cluster
from fastbus.redis.publisher import BufferedListProducer, BufferedPublisher, deadline_after, flush_part


class _LoopWaits:
    """What the twins add to their sync class: an event the flush thread
    sets through the loop the twin is used from."""

    driven_by_loop = True
    _loop: asyncio.AbstractEventLoop | None = None
    _changed: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        """The event to wait on, bound to the running loop at first use."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed():
                raise RuntimeError("an asyncio Redis publisher is used from one event loop only")
            self._loop = loop
            self._changed = asyncio.Event()
            self.on_progress = event_setter(loop, self._changed)   # type: ignore[attr-defined]
        assert self._changed is not None
        return self._changed


@twin_of(BufferedPublisher)
class AsyncBufferedPublisher(_LoopWaits, BufferedPublisher):
    """:class:`BufferedPublisher` for asyncio: ``publish`` queues at once
    (and awaits only when the buffer is full), ``flush``/``close`` await the
    flush thread without blocking the event loop; ``async with`` closes.
    The same options and batching: a message leaves at once when the flush
    thread is idle, ``max_delay`` (default None) is an optional linger.
    Use it from one event loop."""

    def __new__(cls, redis: Any = None, *args: Any, sharded: bool = False, **kwargs: Any) -> Any:
        if is_cluster(redis) and not is_asyncio(redis) and (sharded or cls._COMMAND != "PUBLISH"):
            raise TypeError("the asyncio publishers do not route by hash slot on Redis Cluster yet: "
                            "use BufferedPublisher / BufferedListProducer (thread-safe) there")
        return super().__new__(cls, redis, *args, sharded=sharded, **kwargs)

    async def publish(self, channel: ChannelT, message: EncodableT) -> int:  # type: ignore[override]
        """Awaits only while the buffer is full."""
        if not self.has_room():
            await self.wait_for_room()
        return BufferedPublisher.publish(self, channel, message)     # the sync call: queues at once

    async def wait_for_room(self) -> None:  # type: ignore[override]
        changed = self._event()
        deadline = self.room_deadline
        while True:
            changed.clear()
            if self.room_check(deadline):            # (raises as the sync wait does)
                return
            await wait_event(changed, deadline)

    async def flush(self, timeout: float | None = 30.0) -> None:  # type: ignore[override]
        changed = self._event()
        target = self.start_flush()
        deadline = deadline_after(timeout)
        while True:
            changed.clear()
            if self.flush_done(target, timeout, deadline):
                return
            await wait_event(changed, deadline)

    async def close(self, timeout: float | None = 30.0) -> None:  # type: ignore[override]
        if self.closing:
            return
        changed = self._event()
        deadline = deadline_after(timeout)
        error: BaseException | None = None
        timed_out = False
        try:
            await self.flush(flush_part(timeout))
        except FlushTimeout:
            timed_out = True                         # what is left fails below
        except BaseException as exc:                 # PublishError; CancelledError: close anyway
            error = exc
        for wait in self.stop_steps(deadline, timeout, timed_out, error):
            until = None if wait is None else time.monotonic() + wait
            while not self.stopped:
                changed.clear()
                if self.stopped or not await wait_event(changed, until):
                    break

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@twin_of(BufferedListProducer)
class AsyncBufferedListProducer(AsyncBufferedPublisher, BufferedListProducer):
    """:class:`BufferedListProducer` for asyncio: ``await push(key, value)``."""

    async def push(self, key: ChannelT, value: EncodableT) -> int:  # type: ignore[override]
        """Awaits only while the buffer is full, as publish()."""
        return await self.publish(key, value)
