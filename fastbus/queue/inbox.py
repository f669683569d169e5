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
:mod:`fastbus.queue._lua_inbox`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fastbus.queue import _lua_inbox  # registers the INBOX_* scripts
from fastbus.queue._common import (
    DEFAULT_PREFIX,
    AsyncHandle,
    Call,
    Cmd,
    Many,
    Op,
    QueueError,
    SyncHandle,
    as_bytes,
    async_driver,
    check_name,
    check_prefix,
    namespace,
    positive_int,
    positive_seconds,
    sync_driver,
)

__all__ = [
    "AsyncInbox",
    "Inbox",
    "InboxMessage",
    "async_fetch_all_pending",
    "async_inboxes_of",
    "fetch_all_pending",
    "inboxes_of",
]

MAX_FETCH = 10000                     # messages per fetch (one script reply)
_MSG = struct.Struct(">BQQH")         # version, id, created ms, sender length
assert _MSG.size == _lua_inbox.MSG_HEADER


@dataclass(slots=True)
class InboxMessage:
    """A message of an inbox: ``id`` (strictly increasing per inbox),
    ``sender`` (a member when it was sent), ``payload`` (bytes),
    ``created_at`` (server time of the send, seconds since the epoch) and
    ``inbox`` (the inbox's name: the per-user view mixes inboxes)."""

    id: int
    sender: str
    payload: bytes
    created_at: float
    inbox: str


def _decode(inbox: str, items: list) -> list[InboxMessage]:
    out = []
    for item in items:
        _v, mid, created, n = _MSG.unpack_from(item)
        start = _MSG.size
        out.append(InboxMessage(mid, item[start:start + n].decode(), item[start + n:], created / 1000.0, inbox))
    return out


def _member(value: Any) -> str:
    return check_name("member name", value)


def _count(count: Any) -> int:
    positive_int("count", count)
    if count > MAX_FETCH:
        raise ValueError(f"count is at most {MAX_FETCH} messages per fetch, not {count}")
    return count


def _ttl_ms(ttl: Any) -> int:
    """Seconds (None: no ttl) -> the scripts' milliseconds (0: no ttl)."""
    t = positive_seconds("ttl", ttl, allow_none=True)
    return 0 if t is None else max(1, int(t * 1000))


def _user_key(prefix: str, member: str) -> str:
    return f"{prefix}:u:{{{member}}}:inboxes"


def _flat_pairs(flat: list) -> list[tuple[str, int]]:
    return [(flat[i].decode(), int(flat[i + 1])) for i in range(0, len(flat), 2)]


# -- the operations, once for both APIs


class _InboxOps:
    def __init__(self, name: str, prefix: str, ttl: float | None) -> None:
        self.name = check_name("inbox name", name)
        self.prefix = check_prefix(prefix)
        self.ns = namespace("i", self.prefix, self.name)
        self.key = self.ns + "members"            # KEYS[1] of every script: routes the call
        self.ttl_ms = _ttl_ms(ttl)

    def _hint(self, member: str, *args: Any) -> Call:
        return Call("INBOX_HINT", _user_key(self.prefix, member), args)

    def create(self, members: Iterable[str], sender: str | None, message: Any) -> Op:
        if isinstance(members, (str, bytes)):
            raise TypeError("members must be an iterable of member names, not a single name")
        names = list(dict.fromkeys(_member(m) for m in members))   # deduplicated, in order
        if (sender is None) != (message is None):
            raise ValueError("create takes sender and message together (or neither)")
        payload = b""
        if sender is not None:
            sender = _member(sender)
            if sender not in names:
                names.append(sender)              # the sender is a member, as in the book
            payload = as_bytes(message)
        if not names:
            raise ValueError("an inbox needs at least one member")
        if (yield Cmd(("EXISTS", self.key))):     # the usual refusal, before touching any hint
            raise QueueError(f"inbox {self.name} exists already: join it instead")
        versions = yield Many([self._hint(m, "add", self.name) for m in names])
        args = (self.ns, self.name, self.ttl_ms, "0" if sender is None else "1",
                sender or "", payload, *names)
        ok, detail = yield Call("INBOX_CREATE", self.key, args)
        if not ok:
            # Created by someone else meanwhile: withdraw the hints of those
            # that are not members of that inbox (version-checked, see module doc).
            drops = [self._hint(m, "drop", self.name, v) for m, v, flag in zip(names, versions, detail) if not flag]
            if drops:
                yield Many(drops)
            raise QueueError(f"inbox {self.name} exists already: join it instead")
        yield Many([self._hint(m, "add", self.name) for m in names])
        return detail or None

    def join(self, member: str, create: bool) -> Op:
        member = _member(member)
        version = yield self._hint(member, "add", self.name)
        state, pos = yield Call("INBOX_JOIN", self.key, (self.ns, member, "1" if create else "0"))
        if state < 0:
            yield self._hint(member, "drop", self.name, version)
            raise QueueError(f"no inbox named {self.name}: create it first (or join with create=True)")
        yield self._hint(member, "add", self.name)   # after the membership: see the module doc
        return pos

    def leave(self, member: str) -> Op:
        member = _member(member)
        version = yield Cmd(("ZSCORE", _user_key(self.prefix, member), self.name))
        left = yield Call("INBOX_LEAVE", self.key, (self.ns, member))
        if version is not None:
            # only the version seen before leaving: a concurrent join's newer hint stays
            yield self._hint(member, "drop", self.name, int(float(version)))
        return bool(left)

    def send(self, sender: str, payload: Any) -> Op:
        args = (self.ns, self.name, self.ttl_ms, _member(sender), as_bytes(payload))
        return (yield Call("INBOX_SEND", self.key, args))

    def fetch(self, member: str, count: int) -> Op:
        args = (self.ns, self.name, self.ttl_ms, _member(member), _count(count), "1")
        _pos, items = yield Call("INBOX_FETCH", self.key, args)
        return _decode(self.name, items)

    def ack(self, member: str, upto_id: int) -> Op:
        member = _member(member)
        positive_int("upto_id", upto_id)
        return (yield Call("INBOX_ACK", self.key, (self.ns, self.name, self.ttl_ms, member, upto_id)))

    def members(self) -> Op:
        return dict(_flat_pairs((yield Call("INBOX_MEMBERS", self.key, (self.ns,)))))

    def last_id(self) -> Op:
        return int((yield Cmd(("GET", self.ns + "seq"))) or 0)


def _all_pending(prefix: str, member: str, count: int, ttl: float | None = None) -> Op:
    """member -> {inbox: pending messages} over its hinted inboxes; stale
    hints are dropped.  count 0: membership only (empty lists)."""
    prefix, member = check_prefix(prefix), _member(member)
    ttl_ms = _ttl_ms(ttl)
    ukey = _user_key(prefix, member)
    hints = []
    for name, version in _flat_pairs((yield Call("INBOX_HINT", ukey, ("list",)))):
        try:
            hints.append((check_name("inbox name", name), version))
        except ValueError:
            continue                      # not a name fastbus wrote: leave it alone
    if not hints:
        return {}
    ops = [_InboxOps(name, prefix, None) for name, _v in hints]
    replies = yield Many([Call("INBOX_FETCH", o.key, (o.ns, o.name, ttl_ms, member, count, "0")) for o in ops])
    out, stale = {}, []
    for (name, version), (pos, items) in zip(hints, replies):
        if pos < 0:
            stale.append(Call("INBOX_HINT", ukey, ("drop", name, version)))
        else:
            out[name] = _decode(name, items)
    if stale:
        yield Many(stale)
    return dict(sorted(out.items()))


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
        self._ops = _InboxOps(name, prefix, ttl)
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

def inboxes_of(redis: Any, member: str, *, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The inboxes ``member`` is a member of, sorted (each checked against
    the inbox; stale hints are dropped).  ``redis`` as for :class:`Inbox`."""
    return list(_run_sync(redis, _all_pending(prefix, member, 0)))

def fetch_all_pending(redis: Any, member: str, *, count: int = 1000, prefix: str = DEFAULT_PREFIX,
                      ttl: float | None = None) -> dict[str, list[InboxMessage]]:
    """``member``'s pending messages in every inbox it is a member of: inbox
    name -> up to ``count`` messages (possibly none), as
    :meth:`Inbox.fetch_pending` (nothing is acked: ack per inbox with
    ``Inbox(name).ack(member, messages[-1].id)``).  ``ttl``: as for
    :class:`Inbox`, applied to every inbox looked at."""
    return _run_sync(redis, _all_pending(prefix, member, _count(count), ttl))

# -- asyncio API



class AsyncInbox(AsyncHandle):
    """:class:`Inbox` for asyncio (``redis``: URL, ``redis.asyncio`` client or None)."""

    def __init__(self, name: str, redis: Any = None, *, prefix: str = DEFAULT_PREFIX,
                 ttl: float | None = None) -> None:
        self._ops = _InboxOps(name, prefix, ttl)
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

async def async_inboxes_of(redis: Any, member: str, *, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """:func:`inboxes_of` for asyncio."""
    return list(await _run_async(redis, _all_pending(prefix, member, 0)))

async def async_fetch_all_pending(redis: Any, member: str, *, count: int = 1000, prefix: str = DEFAULT_PREFIX,
                                  ttl: float | None = None) -> dict[str, list[InboxMessage]]:
    """:func:`fetch_all_pending` for asyncio."""
    return await _run_async(redis, _all_pending(prefix, member, _count(count), ttl))
