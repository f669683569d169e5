"""Which queues, topics and inboxes a server holds: :func:`list_queues`.

    from fastbus.queue import list_queues
    for kind, name in list_queues("redis://127.0.0.1:6379/0"):
        print(kind, name)                  # ("queue", "jobs"), ("topic", "orders"), ("inbox", "team")

The registry is one Redis SET, ``prefix:registry``, of ``q:<name>``,
``t:<name>`` and ``i:<name>``.  It is written by the client, with a plain
SADD next to the script that creates the queue, not by the script itself:
on Redis Cluster a script may only touch keys of one hash slot, every key
of a queue shares its ``{name}`` hash tag, and one registry key cannot be in
every queue's slot.  (A registry key per hash slot would let the scripts
write it, at the price of 16384 keys to read for a listing and an argument
more on every put.)  So:

* a queue object registers its name before its first put, consumer,
  publish, topic registration or inbox send: one SADD per process, server
  and name (cached: later objects of the same name cost nothing);
* when the server says a name is new (a put or publish got id 1, a topic
  consumer was registered on a topic with no messages, an inbox was
  created), it is registered again whatever the cache says: a server that
  was flushed or restarted empty gets its names back from the next writer;
* the last member leaving an inbox deletes it, and its name is removed
  (then the inbox is looked at again, and its name put back if a concurrent
  create made it anew);
* work queues and topics have no delete: their names stay until
  :func:`prune_queues` finds none of their keys left (deleted by hand, a
  flushed database);
* a refused SADD (out of memory, a read-only replica) is not an error: the
  operation goes on, and the next object tries again;
* queues written by a fastbus older than the registry are found with
  ``list_queues(..., scan=True)`` (a SCAN over the keyspace), which also
  registers them.

The registry lists names; the queue's own keys are the truth about what it
holds (``WorkQueue.stats()``, :mod:`fastbus.monitor.queues`).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from fastbus.queue.common import Cmd, Many, Op, Register
from fastbus.queue.names import DEFAULT_PREFIX, check_name, check_prefix, namespace
from fastbus.queue.driver import async_driver, sync_driver

__all__ = ["QueueName", "async_list_queues", "async_prune_queues", "list_queues", "prune_queues",
           "registry_key"]

KINDS = {"q": "queue", "t": "topic", "i": "inbox"}
LETTERS = {v: k for k, v in KINDS.items()}
_SPACE = re.compile(r"(.+):([qti]):\{([^{}:]+)\}:")
# keys whose existence means the queue (topic, inbox) exists
_MARKS = {"q": ("seq", "consumers", "ready", "failed"), "t": ("seq", "consumers"), "i": ("members",)}


class QueueName(NamedTuple):
    """A registered name: ``kind`` is "queue", "topic" or "inbox"."""

    kind: str
    name: str


def registry_key(prefix: str = DEFAULT_PREFIX) -> str:
    """The registry's key: ``prefix:registry`` (a SET)."""
    return f"{check_prefix(prefix)}:registry"


def entry_of(ns: str) -> Register | None:
    """The registration of the queue, topic or inbox that namespace ``ns``
    belongs to (a topic consumer's namespace registers its topic)."""
    m = _SPACE.match(ns)
    if m is None:
        return None
    return Register("add", registry_key(m.group(1)), f"{m.group(2)}:{m.group(3)}")


def renew(entry: Register) -> Register:
    return Register("renew", entry.key, entry.member)


class Listing:
    """One queue object's entry in the registry: registered before the
    object's first write (once per object, and per process and server: see
    :class:`~fastbus.queue.common.Register`), and again when the server
    says the name is new."""

    __slots__ = ("entry", "listed")

    def __init__(self, ns: str) -> None:
        self.entry = entry_of(ns)
        self.listed = self.entry is None

    def listing(self, first: int = 0) -> Op:
        """Register (once); ``first`` 1: the write just made got id 1, so
        the name is new to the server: register whatever was done before."""
        if self.entry is None:
            return
        if first == 1:
            self.listed = (yield renew(self.entry)) or self.listed
        elif not self.listed:
            self.listed = yield self.entry


def _kind(kind: str | None) -> str | None:
    if kind is None:
        return None
    if kind not in LETTERS:
        raise ValueError(f"kind must be one of {', '.join(LETTERS)} (or None: all), not {kind!r}")
    return LETTERS[kind]


def _names(members: Any, letter: str | None) -> list[QueueName]:
    out = set()
    for m in members:
        text = m.decode() if isinstance(m, bytes) else str(m)
        k, _, name = text.partition(":")
        if k in KINDS and (letter is None or k == letter):
            try:
                out.add(QueueName(KINDS[k], check_name("name", name)))
            except ValueError:
                continue                  # not written by fastbus: left alone
    return sorted(out)


def read_names(prefix: str, letter: str | None) -> Op:
    """The registered names under ``prefix`` (of one kind, ``letter`` "q", "t" or "i", or all: None)."""
    return _names((yield Cmd(("SMEMBERS", registry_key(prefix)))), letter)


def _add(prefix: str, names: list[QueueName]) -> Op:
    if names:
        yield Cmd(("SADD", registry_key(prefix), *(f"{LETTERS[n.kind]}:{n.name}" for n in names)), soft=True)


def _scan_pattern(prefix: str) -> tuple[str, re.Pattern]:
    # one pass over the keyspace: every key of a queue, topic or inbox,
    # kept when it is one of the keys that mark it as existing
    return (f"{check_prefix(prefix)}:[qti]:{{*}}:*",
            re.compile(re.escape(prefix) + r":([qti]):\{([^{}:]+)\}:(seq|consumers|ready|failed|members)\Z"))


def _found(keys: Any, rx: re.Pattern, letter: str | None) -> set[QueueName]:
    out = set()
    for key in keys:
        text = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        m = rx.match(text)
        if m and m.group(3) in _MARKS[m.group(1)] and (letter is None or m.group(1) == letter):
            out.add(QueueName(KINDS[m.group(1)], m.group(2)))
    return out


def _prune(prefix: str) -> Op:
    """Names none of whose keys exist: removed; each then looked at again
    and put back if it exists now (a writer that made it meanwhile)."""
    names = yield from read_names(prefix, None)
    if not names:
        return []
    nss = [namespace(LETTERS[n.kind], prefix, n.name) for n in names]
    found = yield Many([Cmd(("EXISTS", *(ns + k for k in _MARKS[LETTERS[n.kind]])))
                        for n, ns in zip(names, nss)])
    gone = [(n, ns) for n, ns, f in zip(names, nss, found) if not f]
    if not gone:
        return []
    key = registry_key(prefix)
    for n, _ in gone:
        yield Register("remove", key, f"{LETTERS[n.kind]}:{n.name}")
    again = yield Many([Cmd(("EXISTS", *(ns + k for k in _MARKS[LETTERS[n.kind]]))) for n, ns in gone])
    back = [n for (n, _), f in zip(gone, again) if f]
    if back:
        yield from _add(prefix, back)
    return [n for (n, _), f in zip(gone, again) if not f]


def list_queues(redis: Any = None, *, prefix: str = DEFAULT_PREFIX, kind: str | None = None,
                scan: bool = False) -> list[QueueName]:
    """The registered queues, topics and inboxes, as sorted ``(kind, name)``
    pairs (:class:`QueueName`); ``kind`` ("queue", "topic" or "inbox")
    keeps one kind.  ``redis``: a URL, ``redis.Redis``, ``RedisCluster`` or
    None (the embedded server).  ``scan=True`` also looks for them in the
    keyspace (SCAN, every node of a cluster: a pass over every key, for
    queues made by a fastbus without the registry) and registers what it
    finds."""
    letter = _kind(kind)
    driver, own = sync_driver(redis)
    try:
        names = driver.run(read_names(prefix, letter))
        if scan:
            pattern, rx = _scan_pattern(prefix)
            extra = _found(driver.client.scan_iter(match=pattern, count=1000), rx, letter) - set(names)
            if extra:
                driver.run(_add(prefix, sorted(extra)))
                names = sorted(set(names) | extra)
        return names
    finally:
        if own:
            driver.close()
        else:
            driver.release()


def prune_queues(redis: Any = None, *, prefix: str = DEFAULT_PREFIX) -> list[QueueName]:
    """Remove from the registry the names none of whose keys exist any more
    (deleted by hand, a flushed database); returns them.  Safe while
    writers run: a name made again meanwhile is put back."""
    driver, own = sync_driver(redis)
    try:
        return driver.run(_prune(prefix))
    finally:
        if own:
            driver.close()
        else:
            driver.release()


async def async_list_queues(redis: Any = None, *, prefix: str = DEFAULT_PREFIX, kind: str | None = None,
                            scan: bool = False) -> list[QueueName]:
    """:func:`list_queues` for asyncio (``redis``: URL, ``redis.asyncio`` client or None)."""
    letter = _kind(kind)
    driver, own = async_driver(redis)
    try:
        names = await driver.run(read_names(prefix, letter))
        if scan:
            pattern, rx = _scan_pattern(prefix)
            keys = [k async for k in driver.client.scan_iter(match=pattern, count=1000)]
            extra = _found(keys, rx, letter) - set(names)
            if extra:
                await driver.run(_add(prefix, sorted(extra)))
                names = sorted(set(names) | extra)
        return names
    finally:
        if own:
            await driver.close()
        else:
            await driver.release()


async def async_prune_queues(redis: Any = None, *, prefix: str = DEFAULT_PREFIX) -> list[QueueName]:
    """:func:`prune_queues` for asyncio."""
    driver, own = async_driver(redis)
    try:
        return await driver.run(_prune(prefix))
    finally:
        if own:
            await driver.close()
        else:
            await driver.release()
