"""Multi-recipient inboxes: group messaging on Redis (the group chat of
Redis in Action 6.5.2, seed ``redis-multi-recipient-pubsub.txt``, its holes
closed).

    box = Inbox("team")                        # embedded server; or Inbox("team", "redis://...")
    box.create(["ann", "bob"], sender="ann", message=b"hello")
    box.join("cid")                            # gets what is sent from now on
    box.send("bob", b"hi all")
    ms = box.fetch_pending("cid")              # the same messages again until acked
    ...
    box.ack("cid", ms[-1].id)

An inbox keeps its messages under monotonic ids and, per member, the id up
to which the member has acked (its *marker*).  A member gets every message
sent after it joined, its own included; a message is deleted once every
member has acked it (or left), or, with ``ttl``, once it is older than that.

What changed from the book, and why:

* **No lock on send.**  The book took a lock without expiry around
  ``INCR`` + ``ZADD``, so a sender that crashed holding it blocked every
  later send for ever.  Here both are one script: nothing to orphan.
* **Fetch does not ack.**  The book's fetch advanced ``seen`` before the
  caller had the messages (at most once: a recipient that crashed after
  the fetch lost them).  :meth:`Inbox.fetch_pending` leaves the marker;
  :meth:`Inbox.ack` moves it, forward only.  At least once: make processing
  idempotent (ids are unique per inbox) or ack before acting.
* **Join and leave are atomic.**  The book's join read the id counter, then
  wrote the member in a second step; a last member leaving in between
  deleted the chat and its counter, ids started again at 1 below the
  joiner's old position, and the joiner never saw another message (or join
  crashed on the missing counter).  Here join reads the counter and adds the
  member in one script, and the last member out deletes every key of the
  inbox, the counter *and* all markers, in one script: a marker never
  outlives the counter it refers to.  Joining a deleted inbox is an error
  unless ``create=True``, which starts it afresh (ids from 1, the joiner at 0).
* **Only members send** (the book let anyone): a typo'd inbox name or a
  member that left gets a :class:`~fastbus.queue.QueueError`, not a message
  silently stored where nobody reads it.

Guarantees: ids of one inbox are strictly increasing and never reused while
it exists; a send that returned is fetched by every member that was a member
when it was sent, until that member acks it or leaves (or ``ttl`` expires
it).  When the last member leaves, the inbox and its id counter go; a later
inbox of the same name is a new inbox whose ids start again at 1 (acks kept
by a client from before are meaningless there).

The per-user view (:func:`inboxes_of`, :func:`fetch_all_pending`) needs, per
member, the names of its inboxes.  That index (``prefix:u:{member}:inboxes``)
is hash-tagged on the member, so on Redis Cluster it lives in another slot
than the inbox and cannot be updated in the inbox's scripts.  So the inbox's
membership is the truth and the index only a *hint*, kept a superset of it:
joining adds the hint before the membership, leaving removes the membership
before the hint, and the readers check each hinted inbox and skip (and drop)
the stale ones a crash left behind.  Dropping a stale hint races with a join
that is adding it, so hints carry a version (server microseconds, always
above the set's highest): a drop applies only if the version is still the
one its reader saw, and a join adds the hint a second time after the
membership, so a concurrent drop either happened before that (and is undone)
or sees a new version (and does nothing).

Keys of an inbox (one hash slot): ``prefix:i:{name}:members`` (ZSET member
-> marker), ``...:seq`` (last id), ``...:msgs`` (ZSET id -> message); see
``fastbus/queue/lua/inbox_lib.lua``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastbus._twins import twin_of
from fastbus.queue.common import Op
from fastbus.queue.names import DEFAULT_PREFIX
from fastbus.queue.driver import AsyncHandle, SyncHandle, async_driver, sync_driver
from fastbus.queue.engine import InboxMessage, InboxOps, all_pending, fetch_count

__all__ = [
    "AsyncInbox",
    "Inbox",
    "InboxMessage",
    "async_fetch_all_pending",
    "async_inboxes_of",
    "fetch_all_pending",
    "inboxes_of",
]


# -- synchronous API


class Inbox(SyncHandle):
    """A multi-recipient inbox (group chat).

    ``redis``: a URL, ``redis.Redis``, ``RedisCluster`` or None (the embedded
    server).  ``prefix``: the first part of every key
    (``prefix:i:{name}:...``).  ``ttl``: if given, seconds after which a
    message is deleted even if not every member has acked it (checked on
    this object's send, fetch and ack).  Thread-safe."""

    def __init__(self, name: str, redis: Any = None, *, prefix: str = DEFAULT_PREFIX,
                 ttl: float | None = None) -> None:
        self._ops = InboxOps(name, prefix, ttl)
        self.name = self._ops.name
        super().__init__(redis)

    def create(self, members: Iterable[str], sender: str | None = None, message: bytes | None = None) -> int | None:
        """Create the inbox with ``members`` (at id 0), atomically; with
        ``sender`` and ``message``, send that first message in the same step
        (the sender becomes a member if not listed) and return its id, else
        None.  :class:`~fastbus.queue.QueueError` if the inbox exists."""
        return self._driver.run(self._ops.create(members, sender, message))

    def join(self, member: str, *, create: bool = False) -> int:
        """Add ``member`` at the current last id (it gets what is sent from
        now on) and return that id; a member already keeps its marker, which
        is returned.  No such inbox: :class:`~fastbus.queue.QueueError`, or
        with ``create=True`` the inbox is created with this member."""
        return self._driver.run(self._ops.join(member, create))

    def leave(self, member: str) -> bool:
        """Remove ``member``; messages every remaining member has acked are
        deleted, and the last member out deletes the inbox (every key, the id
        counter included).  False if it was not a member."""
        return self._driver.run(self._ops.leave(member))

    def send(self, sender: str, payload: bytes) -> int:
        """Store a message from ``sender`` (a member, else
        :class:`~fastbus.queue.QueueError`) for every member; returns its id."""
        return self._driver.run(self._ops.send(sender, payload))

    def fetch_pending(self, member: str, count: int = 1000) -> list[InboxMessage]:
        """Up to ``count`` (at most 10000) messages after ``member``'s marker,
        oldest first.  The marker does not move: the same messages come again
        until :meth:`ack`."""
        return self._driver.run(self._ops.fetch(member, count))

    def ack(self, member: str, upto_id: int) -> int:
        """``member`` is done with every message up to ``upto_id``: its marker
        moves there (never back: a lower id changes nothing) and messages all
        members have acked are deleted.  Returns the marker.  An id past the
        last one sent is refused (:class:`~fastbus.queue.QueueError`)."""
        return self._driver.run(self._ops.ack(member, upto_id))

    def members(self) -> dict[str, int]:
        """member -> the id it has acked up to; empty if there is no such inbox."""
        return self._driver.run(self._ops.members())

    def last_id(self) -> int:
        """The id of the newest message (0 before the first, or with no inbox)."""
        return self._driver.run(self._ops.last_id())

def _run_sync(redis: Any, op: Op) -> Any:
    driver, own = sync_driver(redis)
    try:
        return driver.run(op)
    finally:
        if own:
            driver.close()
        else:
            driver.release()             # (the connection it kept of the caller's pool)

def inboxes_of(redis: Any, member: str, *, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The inboxes ``member`` is a member of, sorted (each checked against
    the inbox; stale hints are dropped).  ``redis`` as for :class:`Inbox`."""
    return list(_run_sync(redis, all_pending(prefix, member, 0)))

def fetch_all_pending(redis: Any, member: str, *, count: int = 1000, prefix: str = DEFAULT_PREFIX,
                      ttl: float | None = None) -> dict[str, list[InboxMessage]]:
    """``member``'s pending messages in every inbox it is a member of: inbox
    name -> up to ``count`` messages (possibly none), as
    :meth:`Inbox.fetch_pending` (nothing is acked: ack per inbox with
    ``Inbox(name).ack(member, messages[-1].id)``).  ``ttl``: as for
    :class:`Inbox`, applied to every inbox looked at."""
    return _run_sync(redis, all_pending(prefix, member, fetch_count(count), ttl))

# -- asyncio API



@twin_of(Inbox)
class AsyncInbox(AsyncHandle):
    """:class:`Inbox` for asyncio (``redis``: URL, ``redis.asyncio`` client or None)."""

    def __init__(self, name: str, redis: Any = None, *, prefix: str = DEFAULT_PREFIX,
                 ttl: float | None = None) -> None:
        self._ops = InboxOps(name, prefix, ttl)
        self.name = self._ops.name
        super().__init__(redis)

    async def create(self, members: Iterable[str], sender: str | None = None,
                     message: bytes | None = None) -> int | None:
        return await self._driver.run(self._ops.create(members, sender, message))

    async def join(self, member: str, *, create: bool = False) -> int:
        return await self._driver.run(self._ops.join(member, create))

    async def leave(self, member: str) -> bool:
        return await self._driver.run(self._ops.leave(member))

    async def send(self, sender: str, payload: bytes) -> int:
        return await self._driver.run(self._ops.send(sender, payload))

    async def fetch_pending(self, member: str, count: int = 1000) -> list[InboxMessage]:
        return await self._driver.run(self._ops.fetch(member, count))

    async def ack(self, member: str, upto_id: int) -> int:
        return await self._driver.run(self._ops.ack(member, upto_id))

    async def members(self) -> dict[str, int]:
        return await self._driver.run(self._ops.members())

    async def last_id(self) -> int:
        return await self._driver.run(self._ops.last_id())

async def _run_async(redis: Any, op: Op) -> Any:
    driver, own = async_driver(redis)
    try:
        return await driver.run(op)
    finally:
        if own:
            await driver.close()
        else:
            await driver.release()       # (the connection it kept of the caller's pool)

async def async_inboxes_of(redis: Any, member: str, *, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """:func:`inboxes_of` for asyncio."""
    return list(await _run_async(redis, all_pending(prefix, member, 0)))

async def async_fetch_all_pending(redis: Any, member: str, *, count: int = 1000, prefix: str = DEFAULT_PREFIX,
                                  ttl: float | None = None) -> dict[str, list[InboxMessage]]:
    """:func:`fetch_all_pending` for asyncio."""
    return await _run_async(redis, all_pending(prefix, member, fetch_count(count), ttl))
