"""put()s that overlap, sent as one script call (group commit).

A producer with several threads (or tasks) calling ``WorkQueue.put()`` one
message at a time pays a round trip and a script call per message, and the
server's cost per call is what limits a deployment (bench/RESULTS.md, issue
50).  A queue's puts therefore gather: the first put() that comes while
none is in flight sends its message at once; those that come while one is
in flight wait, and when it is answered the oldest of them sends all that
wait (up to one call's MAX_CALL_MESSAGES messages and MAX_CALL_BYTES) in
one PUT while the others wait on.  Each put() returns its own message's id
as if it had made its own call (ids follow the order they joined); a call
that fails raises its error in every put() it carried (a script call is
atomic: none of them was written, or, for a network error, as for a lone
put(), it is not known whether they were).  A put() alone costs what it
did: no wait, one call.

The sync and the asyncio gathering differ only in how a put() waits (a
threading.Event, an asyncio future) and in who sends a group whose oldest
member stopped waiting (an interrupted thread sends it before it raises;
a cancelled task's group is sent by a task of the gathering's own).
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from fastbus.queue.common import MAX_CALL_BYTES, MAX_CALL_MESSAGES


class _Put:
    """One waiting put(): its payload, then its outcome (an id or an
    error), or the role of sending its group (``group``)."""

    __slots__ = ("payload", "done", "id", "error", "group")

    def __init__(self, payload: bytes, done: Any) -> None:
        self.payload = payload
        self.done = done
        self.id = 0
        self.error: BaseException | None = None
        self.group: list[_Put] | None = None


class _Gathering:
    """What both gatherings share: the waiting puts, and whether a call is
    in flight."""

    def __init__(self) -> None:
        self.waiting: deque[_Put] = deque()
        self.busy = False
        self.calls = 0            # PUT calls made (for tests and benchmarks)
        self.gathered = 0         # messages that went in a call with others

    def _next_group(self, sent: list[_Put]) -> list[_Put] | None:
        """(Under the lock, once the group ``sent`` is answered.)  The next
        group, oldest first, within one call's bounds; None, and nothing in
        flight, if none waits."""
        self.calls += 1
        if len(sent) > 1:
            self.gathered += len(sent)
        if not self.waiting:
            self.busy = False
            return None
        group = [self.waiting.popleft()]
        size = len(group[0].payload)
        while self.waiting and len(group) < MAX_CALL_MESSAGES and size + len(self.waiting[0].payload) <= MAX_CALL_BYTES:
            p = self.waiting.popleft()
            size += len(p.payload)
            group.append(p)
        return group

    @staticmethod
    def _settled(group: list[_Put], first: int, error: BaseException | None) -> list[_Put]:
        """Every member but the sender (group[0]) gets its outcome: those
        members, for the caller to wake its own way."""
        others = group[1:]
        for i, p in enumerate(others, 1):
            if error is not None:
                p.error = error
            else:
                p.id = first + i
        return others


class SyncGathering(_Gathering):
    """A WorkQueue's puts from many threads (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        _sync_gatherings.add(self)

    def _forked(self) -> None:
        # A child process has none of its parent's threads: what they
        # waited for, or sent, is not the child's.
        _Gathering.__init__(self)
        self._lock = threading.Lock()

    def put(self, payload: bytes, send: Callable[[list[bytes]], int]) -> int:
        """Put ``payload`` (admitted: bytes, checked) by ``send`` (one
        PUT of the payloads given: the first one's id); its id."""
        with self._lock:
            if not self.busy:
                self.busy = True
                me = None
            else:
                me = _Put(payload, threading.Event())
                self.waiting.append(me)
        if me is None:
            return self._send([_Put(payload, None)], send)
        try:
            me.done.wait()
        except BaseException:
            with self._lock:                      # (a group's sender is named under it)
                if me in self.waiting:            # never sent: it is not written
                    self.waiting.remove(me)
                    raise
                group = me.group
            if group is not None:                 # its group waits for it: sent, then the interrupt
                try:
                    self._send(group, send)
                except BaseException:
                    pass                          # (the others were told)
            raise
        if me.group is not None:
            return self._send(me.group, send)
        if me.error is not None:
            raise me.error
        return me.id

    def _send(self, group: list[_Put], send: Callable[[list[bytes]], int]) -> int:
        first, error = 0, None
        try:
            first = send([p.payload for p in group])
        except BaseException as e:
            error = e
        with self._lock:
            nxt = self._next_group(group)
            if nxt is not None:
                nxt[0].group = nxt
        if nxt is not None:
            nxt[0].done.set()
        for p in self._settled(group, first, error):
            p.done.set()
        if error is not None:
            raise error
        return first


class AsyncGathering(_Gathering):
    """An AsyncWorkQueue's puts from many tasks of one event loop (see the
    module)."""

    def __init__(self) -> None:
        super().__init__()
        self._orphans: set[asyncio.Task] = set()   # groups whose sender was cancelled

    async def put(self, payload: bytes, send: Callable[[list[bytes]], Awaitable[int]]) -> int:
        """SyncGathering.put for a task: ``send`` is awaited."""
        if not self.busy:
            self.busy = True
            return await self._send([_Put(payload, None)], send)
        me = _Put(payload, asyncio.get_running_loop().create_future())
        self.waiting.append(me)
        try:
            await me.done
        except asyncio.CancelledError:
            # (The task's cancel cancelled the future too, unless it had
            # been handed its role first.)
            if me in self.waiting:                # never sent: it is not written
                self.waiting.remove(me)
            elif me.group is not None:            # its group waits for it
                task = asyncio.ensure_future(self._send_quietly(me.group, send))
                self._orphans.add(task)
                task.add_done_callback(self._orphans.discard)
            raise
        if me.group is not None:
            return await self._send(me.group, send)
        if me.error is not None:
            raise me.error
        return me.id

    async def _send(self, group: list[_Put], send: Callable[[list[bytes]], Awaitable[int]]) -> int:
        first, error = 0, None
        try:
            first = await send([p.payload for p in group])
        except BaseException as e:
            error = e
        # (A put cancelled while it waited, whose task has not run since,
        # is not sent: its caller was told it was cancelled.)
        if any(p.done.cancelled() for p in self.waiting):
            self.waiting = deque(p for p in self.waiting if not p.done.cancelled())
        nxt = self._next_group(group)
        if nxt is not None:
            nxt[0].group = nxt
            nxt[0].done.set_result(None)
        for p in self._settled(group, first, error):
            if not p.done.done():                 # (cancelled while its call was out)
                p.done.set_result(None)
        if error is not None:
            raise error
        return first

    async def _send_quietly(self, group: list[_Put], send: Callable[[list[bytes]], Awaitable[int]]) -> None:
        try:
            await self._send(group, send)
        except BaseException:                     # (the others were told; the cancelled one is gone)
            pass


_sync_gatherings: weakref.WeakSet[SyncGathering] = weakref.WeakSet()


def _after_fork() -> None:
    for g in list(_sync_gatherings):
        g._forked()


os.register_at_fork(after_in_child=_after_fork)
