"""Multi-recipient inboxes (fastbus.queue.inbox): the API, the per-user
view, concurrency, and the races of the seed chapter (Redis in Action
6.5.2), each shown failing on a faithful port of the book's code and passing
on ours.

(This file is over 700 lines because each race of the seed chapter is shown
twice, failing on a faithful port of the book's code and passing on ours,
beside the API's own tests.)
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from fastbus.queue import QueueError
from fastbus.queue.inbox import (
    AsyncInbox,
    Inbox,
    InboxMessage,
    async_fetch_all_pending,
    async_inboxes_of,
    fetch_all_pending,
    inboxes_of,
)

TESTS = Path(__file__).resolve().parent


# -- the book's code (Redis in Action, listings 6.24-6.28, and the lock of
#    section 6.2, listings 6.8-6.9), ported to Python 3 and redis-py 5+:
#    zadd takes a mapping, zip() is a list, clients decode responses (the
#    book's strings).  leave_chat's trim is the book's code download
#    (msgs:, oldest[0][1]); the printed listing trims 'chat:' with a list.


class Book:
    """The book's group chat, unchanged but for the port.  ``acquire_timeout``
    is acquire_lock's default (10 s in the book; short in the tests)."""

    def __init__(self, acquire_timeout: float = 10) -> None:
        self.acquire_timeout = acquire_timeout

    def acquire_lock(self, conn, lockname, acquire_timeout=None):
        acquire_timeout = self.acquire_timeout if acquire_timeout is None else acquire_timeout
        identifier = str(uuid.uuid4())
        end = time.time() + acquire_timeout
        while time.time() < end:
            if conn.setnx('lock:' + lockname, identifier):      # no expiry
                return identifier
            time.sleep(.001)
        return False

    def release_lock(self, conn, lockname, identifier):
        pipe = conn.pipeline(True)
        lockname = 'lock:' + lockname
        while True:
            try:
                pipe.watch(lockname)
                if pipe.get(lockname) == identifier:
                    pipe.multi()
                    pipe.delete(lockname)
                    pipe.execute()
                    return True
                pipe.unwatch()
                break
            except redis.exceptions.WatchError:
                pass
        return False

    def create_chat(self, conn, sender, recipients, message, chat_id=None):
        chat_id = chat_id or str(conn.incr('ids:chat:'))
        recipients.append(sender)
        recipientsd = dict((r, 0) for r in recipients)  # noqa: C402 - the book's code
        pipeline = conn.pipeline(True)
        pipeline.zadd('chat:' + chat_id, recipientsd)
        for rec in recipients:
            pipeline.zadd('seen:' + rec, {chat_id: 0})
        pipeline.execute()
        return self.send_message(conn, chat_id, sender, message)

    def send_message(self, conn, chat_id, sender, message):
        identifier = self.acquire_lock(conn, 'chat:' + chat_id)
        if not identifier:
            raise Exception("Couldn't get the lock")  # noqa: TRY002 - the book's code
        try:
            mid = conn.incr('ids:' + chat_id)
            ts = time.time()
            packed = json.dumps({
                'id': mid,
                'ts': ts,
                'sender': sender,
                'message': message,
            })
            conn.zadd('msgs:' + chat_id, {packed: mid})
        finally:
            self.release_lock(conn, 'chat:' + chat_id, identifier)
        return chat_id

    def fetch_pending_messages(self, conn, recipient):
        seen = conn.zrange('seen:' + recipient, 0, -1, withscores=True)
        pipeline = conn.pipeline(True)
        for chat_id, seen_id in seen:
            pipeline.zrangebyscore('msgs:' + chat_id, seen_id + 1, 'inf')
        chat_info = list(zip(seen, pipeline.execute()))
        for i, ((chat_id, seen_id), messages) in enumerate(chat_info):
            if not messages:
                continue
            messages[:] = map(json.loads, messages)
            seen_id = messages[-1]['id']
            conn.zadd('chat:' + chat_id, {recipient: seen_id})
            min_id = conn.zrange('chat:' + chat_id, 0, 0, withscores=True)
            pipeline.zadd('seen:' + recipient, {chat_id: seen_id})
            if min_id:
                pipeline.zremrangebyscore('msgs:' + chat_id, 0, min_id[0][1])
            chat_info[i] = (chat_id, messages)
        pipeline.execute()
        return chat_info

    def join_chat(self, conn, chat_id, user):
        message_id = int(conn.get('ids:' + chat_id))
        pipeline = conn.pipeline(True)
        pipeline.zadd('chat:' + chat_id, {user: message_id})
        pipeline.zadd('seen:' + user, {chat_id: message_id})
        pipeline.execute()

    def leave_chat(self, conn, chat_id, user):
        pipeline = conn.pipeline(True)
        pipeline.zrem('chat:' + chat_id, user)
        pipeline.zrem('seen:' + user, chat_id)
        pipeline.zcard('chat:' + chat_id)
        if not pipeline.execute()[-1]:
            pipeline.delete('msgs:' + chat_id)
            pipeline.delete('ids:' + chat_id)
            pipeline.execute()
        else:
            oldest = conn.zrange('chat:' + chat_id, 0, 0, withscores=True)
            conn.zremrangebyscore('msgs:' + chat_id, 0, oldest[0][1])


def book_messages(chat_info, chat_id):
    """The messages of one chat in a fetch_pending_messages result."""
    for entry, messages in chat_info:
        if entry == chat_id or (isinstance(entry, tuple) and entry[0] == chat_id):
            return [m['message'] for m in messages]
    return []


class Hooked(redis.Redis):
    """A client that runs a callback once, just before it sends a given
    command (or makes a pipeline): deterministic interleavings of two
    clients at the exact point a race needs, without touching the code
    under test."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._hooks: list = []

    def before(self, command: str, fn, when=lambda args: True) -> None:
        self._hooks.append((command.upper(), fn, when))

    def _fire(self, command: str, args: tuple) -> None:
        for i, (c, fn, when) in enumerate(self._hooks):
            if c == command and when(args):
                del self._hooks[i]
                fn()
                return

    def execute_command(self, *args, **options):
        self._fire(str(args[0]).upper(), args)
        return super().execute_command(*args, **options)

    def pipeline(self, transaction=True, shard_hint=None):
        self._fire("PIPELINE", ())
        return super().pipeline(transaction, shard_hint)


def script_on(suffix: str, op: str | None = None):
    """A hook condition: an EVALSHA whose key ends with ``suffix`` (and whose
    first argument is ``op``)."""
    def when(args):
        key = args[3].decode() if isinstance(args[3], bytes) else str(args[3])
        return key.endswith(suffix) and (op is None or str(args[4]) == op)
    return when


def keys(url: str, pattern: str = "*") -> list[str]:
    r = redis.Redis.from_url(url)
    try:
        return sorted(k.decode() for k in r.scan_iter(match=pattern, count=1000))
    finally:
        r.close()


def payloads(messages: list[InboxMessage]) -> list[bytes]:
    return [m.payload for m in messages]


# -- child processes (``python -P``: the installed fastbus, not the source tree)


def book_sender_that_stalls(url: str, chat_id: str) -> None:
    """The book's send_message, stopped between taking the lock and INCR
    (says "locked", then sleeps until it is killed)."""
    conn = Hooked.from_url(url, decode_responses=True)

    def stall():
        print("locked", flush=True)
        time.sleep(60)
    conn.before("INCRBY", stall)
    Book().send_message(conn, chat_id, "ann", "never sent")


BOOK_SENDER = r"""
import sys
sys.path.insert(0, sys.argv[1])
import test_queue_inbox
test_queue_inbox.book_sender_that_stalls(sys.argv[2], sys.argv[3])
"""

OUR_SENDER = r"""
import sys
from fastbus.queue.inbox import Inbox
box = Inbox(sys.argv[2], sys.argv[1])
for i in range(100000):
    print(box.send("ann", b"m%d" % i), i, flush=True)
"""


class Child:
    """A Python child process whose stdout lines arrive on a queue."""

    def __init__(self, code: str, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-P", "-c", code, *args], stdout=subprocess.PIPE)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.endswith(b"\n"):          # a line cut by SIGKILL is not one
                self.lines.put(line.decode().strip())
        self.lines.put(None)

    def line(self, timeout: float) -> str:
        return self.lines.get(timeout=timeout)

    def kill(self) -> list[str]:
        """SIGKILL; then the lines it wrote before dying."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        rest = []
        while (line := self.lines.get(timeout=10)) is not None:
            rest.append(line)
        return rest


# -- the API


def test_create_send_fetch_ack_in_order(redis_url):
    with Inbox("room", redis_url) as box:
        assert box.create(["ann", "bob"], sender="ann", message=b"hello") == 1
        assert box.members() == {"ann": 0, "bob": 0}
        assert box.join("cid") == 1                      # after the current last id
        assert [box.send(s, f"m{i}") for i, s in enumerate(["bob", "cid", "ann"])] == [2, 3, 4]
        assert box.last_id() == 4

        got = box.fetch_pending("bob")
        assert [m.id for m in got] == [1, 2, 3, 4]
        assert payloads(got) == [b"hello", b"m0", b"m1", b"m2"]
        assert [m.sender for m in got] == ["ann", "bob", "cid", "ann"]
        assert all(m.inbox == "room" and abs(m.created_at - time.time()) < 60 for m in got)
        assert payloads(box.fetch_pending("cid")) == [b"m0", b"m1", b"m2"]   # not what came before it
        assert box.fetch_pending("bob") == got             # fetch does not ack
        assert [m.id for m in box.fetch_pending("bob", count=2)] == [1, 2]

        assert box.ack("bob", 2) == 2
        assert [m.id for m in box.fetch_pending("bob")] == [3, 4]
        assert box.ack("bob", 1) == 2                      # never back
        r = box.redis
        assert r.zcard("fastbus:i:{room}:msgs") == 4       # ann has acked nothing
        assert box.ack("ann", 4) == 4
        assert r.zcard("fastbus:i:{room}:msgs") == 3       # 1 is acked by all (cid joined after it)
        assert box.ack("cid", 3) == 3
        assert r.zcard("fastbus:i:{room}:msgs") == 2       # 3 and 4 left: bob has acked 2
        box.ack("bob", 4)
        box.ack("cid", 4)
        assert r.zcard("fastbus:i:{room}:msgs") == 0       # every member acked everything
        assert box.fetch_pending("ann") == []
        assert box.members() == {"ann": 4, "bob": 4, "cid": 4}


def test_binary_and_text_payloads(redis_url):
    with Inbox("bin", redis_url) as box:
        box.create(["zoë", "bob"])
        sent = [bytes(range(256)), b"", b"\x00" * 10, "naïve ☃", bytearray(b"ba"), os.urandom(1 << 20)]
        ids = [box.send("zoë", p) for p in sent]
        got = box.fetch_pending("bob")
        assert [m.id for m in got] == ids
        assert payloads(got) == [p.encode() if isinstance(p, str) else bytes(p) for p in sent]
        assert {m.sender for m in got} == {"zoë"}


def test_join_rejoin_and_missing_inbox(redis_url):
    with Inbox("j", redis_url) as box:
        with pytest.raises(QueueError, match="no inbox named j.*create it first"):
            box.join("bob")
        assert keys(redis_url) == []                       # the hint it added is withdrawn
        assert box.create(["ann"]) is None
        box.send("ann", b"1")
        box.send("ann", b"2")
        assert box.join("bob") == 2
        box.send("ann", b"3")
        assert box.join("bob") == 2                        # a member already: its marker, unchanged
        box.ack("bob", 3)
        assert box.join("bob") == 3
        assert payloads(box.fetch_pending("ann")) == [b"1", b"2", b"3"]
    with Inbox("fresh", redis_url) as box:
        assert box.join("cid", create=True) == 0
        assert box.members() == {"cid": 0}
        assert box.send("cid", b"x") == 1


def test_leave_trims_and_last_leave_deletes_every_key(redis_url):
    with Inbox("room", redis_url) as box:
        box.create(["ann", "bob", "cid"], "ann", b"0")
        for i in range(1, 5):
            box.send("ann", str(i))
        box.ack("ann", 5)
        box.ack("bob", 5)
        r = box.redis
        assert r.zcard("fastbus:i:{room}:msgs") == 5       # cid holds them all back
        assert box.leave("cid") is True
        assert r.zcard("fastbus:i:{room}:msgs") == 0       # everyone remaining had acked them
        assert box.leave("cid") is False
        assert inboxes_of(redis_url, "cid") == []
        box.send("bob", b"5")
        assert box.leave("ann") and box.leave("bob")
        assert keys(redis_url, "fastbus:*") == []          # inbox keys, counter and hints: all gone
        assert box.members() == {} and box.last_id() == 0
        assert box.leave("ann") is False                   # leaving a deleted inbox: nothing to do
        # a new inbox of the same name starts afresh, with nobody holding an old marker
        assert box.create(["dan"], "dan", b"again") == 1
        assert box.members() == {"dan": 0}


def test_create_refuses_an_existing_inbox(redis_url):
    with Inbox("room", redis_url) as box:
        box.create(["ann"])
        with pytest.raises(QueueError, match="inbox room exists already"):
            box.create(["bob"])
        assert inboxes_of(redis_url, "bob") == []
        assert box.members() == {"ann": 0}


def test_create_losing_a_race_withdraws_only_the_hints_it_should(redis_url):
    # Another client creates the inbox after our existence check, before our
    # script: the script refuses; zed's hint goes, ann's (a member) stays.
    client = Hooked.from_url(redis_url)
    other = Inbox("room", redis_url)
    client.before("EVALSHA", lambda: other.create(["ann"]), when=script_on(":members"))
    with Inbox("room", client) as box, pytest.raises(QueueError, match="exists already"):
        box.create(["ann", "zed"])
    assert inboxes_of(redis_url, "ann") == ["room"]
    assert keys(redis_url, "fastbus:u:*") == ["fastbus:u:{ann}:inboxes"]
    other.close()
    client.close()


def test_send_requires_membership(redis_url):
    with Inbox("room", redis_url) as box:
        with pytest.raises(QueueError, match="no inbox named room"):
            box.send("ann", b"x")
        box.create(["ann"])
        with pytest.raises(QueueError, match="eve is not a member of inbox room"):
            box.send("eve", b"x")
        with pytest.raises(QueueError, match="eve is not a member"):
            box.fetch_pending("eve")
        with pytest.raises(QueueError, match="eve is not a member"):
            box.ack("eve", 1)
        assert box.last_id() == 0


def test_ack_rules(redis_url):
    with Inbox("room", redis_url) as box:
        box.create(["ann"], "ann", b"1")
        with pytest.raises(QueueError, match="cannot ack up to id 2 in inbox room: its last id is 1"):
            box.ack("ann", 2)
        for bad, exc in [(0, ValueError), (-3, ValueError), (True, TypeError), ("1", TypeError), (1.0, TypeError)]:
            with pytest.raises(exc, match="upto_id"):
                box.ack("ann", bad)
        assert box.ack("ann", 1) == 1
        assert box.ack("ann", 1) == 1                      # idempotent


def test_bad_arguments(redis_url):
    for bad in ["", "a b", "a{b}", "a:b", "x" * 201, b"\xff"]:
        with pytest.raises(ValueError, match="inbox name"):
            Inbox(bad, redis_url)
    with pytest.raises(TypeError, match="inbox name must be a str"):
        Inbox(7, redis_url)
    with pytest.raises(ValueError, match="prefix"):
        Inbox("ok", redis_url, prefix="a{b")
    with pytest.raises(ValueError, match="ttl"):
        Inbox("ok", redis_url, ttl=0)
    with pytest.raises(TypeError, match="ttl"):
        Inbox("ok", redis_url, ttl="1")
    with pytest.raises(ValueError, match="decode_responses"):
        Inbox("ok", redis.Redis.from_url(redis_url, decode_responses=True))
    with pytest.raises(TypeError, match="expected a Redis URL"):
        Inbox("ok", 42)
    with Inbox("ok", redis_url) as box:
        with pytest.raises(TypeError, match="single name"):
            box.create("ann")
        with pytest.raises(ValueError, match="at least one member"):
            box.create([])
        with pytest.raises(ValueError, match="sender and message together"):
            box.create(["ann"], sender="ann")
        with pytest.raises(ValueError, match="sender and message together"):
            box.create(["ann"], message=b"x")
        with pytest.raises(ValueError, match="member name"):
            box.create(["ann", "b b"])
        with pytest.raises(ValueError, match="member name"):
            box.join("a:b")
        box.create(["ann"])
        with pytest.raises(TypeError, match="payload must be bytes"):
            box.send("ann", 12)
        with pytest.raises(ValueError, match="member name"):
            box.send("", b"x")
        with pytest.raises(ValueError, match="count"):
            box.fetch_pending("ann", count=0)
        with pytest.raises(ValueError, match="count is at most"):
            box.fetch_pending("ann", count=10001)
        with pytest.raises(ValueError, match="count"):
            fetch_all_pending(redis_url, "ann", count=0)
        with pytest.raises(ValueError, match="member name"):
            inboxes_of(redis_url, "a b")
        assert box.members() == {"ann": 0}                 # nothing half-done


def test_ttl_expires_old_messages(redis_url):
    with Inbox("t", redis_url, ttl=0.3) as box:
        box.create(["ann", "bob"])
        for i in range(40):
            box.send("ann", str(i))
        time.sleep(0.5)
        box.send("ann", b"new")                            # expires the 40 old ones
        assert payloads(box.fetch_pending("bob")) == [b"new"]
        assert box.redis.zcard("fastbus:i:{t}:msgs") == 1
        time.sleep(0.5)
        assert box.fetch_pending("bob") == []              # a fetch expires too
        assert box.ack("bob", 41) == 41                    # acking what expired is fine
        box.send("ann", b"newer")
        time.sleep(0.5)
    # the per-user view takes a ttl too (without one, nothing expires)
    assert payloads(fetch_all_pending(redis_url, "bob")["t"]) == [b"newer"]
    assert fetch_all_pending(redis_url, "bob", ttl=0.3) == {"t": []}
    with pytest.raises(ValueError, match="ttl"):
        fetch_all_pending(redis_url, "bob", ttl=-1)
    with Inbox("t", redis_url) as box:                     # no ttl: kept until acked
        box.send("ann", b"kept")
        time.sleep(0.4)
        assert payloads(box.fetch_pending("bob")) == [b"kept"]


def test_per_user_view(redis_url):
    a, b, c = (Inbox(n, redis_url) for n in ("a", "b", "c"))
    a.create(["ann", "bob"], "ann", b"a1")
    b.create(["bob"], "bob", b"b1")
    c.create(["cid"])
    c.join("bob")
    b.send("bob", b"b2")
    assert inboxes_of(redis_url, "bob") == ["a", "b", "c"]
    got = fetch_all_pending(redis_url, "bob")
    assert {k: payloads(v) for k, v in got.items()} == {"a": [b"a1"], "b": [b"b1", b"b2"], "c": []}
    assert got["b"][1].inbox == "b"
    assert fetch_all_pending(redis_url, "bob") == got     # nothing acked
    b.ack("bob", got["b"][-1].id)
    assert fetch_all_pending(redis_url, "bob", count=1)["b"] == []
    # every key of an inbox in its hash slot, every hint in its member's
    # (b's messages are all acked: its msgs key is gone, its counters kept;
    # nothing was sent to c); the registry of names is the one other key
    assert keys(redis_url) == sorted(
        ["fastbus:i:{a}:members", "fastbus:i:{a}:msgs", "fastbus:i:{a}:seq",
         "fastbus:i:{b}:members", "fastbus:i:{b}:seq", "fastbus:i:{b}:stats", "fastbus:i:{c}:members",
         "fastbus:registry"]
        + [f"fastbus:u:{{{m}}}:inboxes" for m in ("ann", "bob", "cid")])
    # stale hints (a client that died between hint and membership, or after
    # the leave script): skipped and dropped
    r = redis.Redis.from_url(redis_url)
    r.zadd("fastbus:u:{bob}:inboxes", {"ghost": 1, "gone": 2})
    r.zadd("fastbus:u:{eve}:inboxes", {"a": 1})
    assert list(fetch_all_pending(redis_url, "bob")) == ["a", "b", "c"]
    assert r.zrange("fastbus:u:{bob}:inboxes", 0, -1) == [b"a", b"b", b"c"]
    assert inboxes_of(redis_url, "eve") == []
    assert r.exists("fastbus:u:{eve}:inboxes") == 0
    assert inboxes_of(redis_url, "nobody") == []
    # another prefix is another world
    with Inbox("a", redis_url, prefix="other") as o:
        o.create(["bob"])
        assert inboxes_of(redis_url, "bob", prefix="other") == ["a"]
    r.close()
    for x in (a, b, c):
        x.close()


def test_dropping_a_stale_hint_spares_a_join_in_flight(redis_url):
    # bob's hint for "late" is stale when fetch_all_pending looks; before it
    # drops the hint, bob joins "late" (adding the hint anew): the drop,
    # checked against the version it saw, must leave the new hint alone.
    r = redis.Redis.from_url(redis_url)
    Inbox("a", redis_url).create(["bob"])
    r.zadd("fastbus:u:{bob}:inboxes", {"late": 1})
    late = Inbox("late", redis_url)
    client = Hooked.from_url(redis_url)
    client.before("EVALSHA", lambda: late.join("bob", create=True), when=script_on(":inboxes", "drop"))
    assert list(fetch_all_pending(client, "bob")) == ["a"]       # it looked before the join
    assert inboxes_of(redis_url, "bob") == ["a", "late"]         # the hint survived
    late.close()
    client.close()
    r.close()


def test_async_api(redis_url):
    async def main():
        async with AsyncInbox("aio", redis_url) as box:
            assert await box.create(["ann", "bob"], "ann", b"hi") == 1
            assert await box.join("cid") == 1
            assert await box.send("bob", "yo") == 2
            assert payloads(await box.fetch_pending("cid")) == [b"yo"]
            assert payloads(await box.fetch_pending("ann")) == [b"hi", b"yo"]
            assert await box.ack("ann", 2) == 2
            assert await box.members() == {"ann": 2, "bob": 0, "cid": 1}
            assert await box.last_id() == 2
            assert await async_inboxes_of(redis_url, "cid") == ["aio"]
            got = await async_fetch_all_pending(redis_url, "bob")
            assert {k: payloads(v) for k, v in got.items()} == {"aio": [b"hi", b"yo"]}
            with pytest.raises(QueueError, match="not a member"):
                await box.send("eve", b"x")
            with pytest.raises(QueueError, match="exists already"):
                await box.create(["x"])
            for m in ("ann", "bob", "cid"):
                assert await box.leave(m)
            assert await box.members() == {}
            with pytest.raises(QueueError, match="no inbox named aio"):
                await box.join("dan")
            assert await box.join("dan", create=True) == 0
        with pytest.raises(TypeError, match="redis.asyncio"):
            AsyncInbox("x", redis.Redis.from_url(redis_url))
    asyncio.run(main())
    assert keys(redis_url) == ["fastbus:i:{aio}:members", "fastbus:registry", "fastbus:u:{dan}:inboxes"]


# -- the chapter's races: the book's code shows each bug, ours does not


def test_book_race_crashed_sender_lock(redis_url):
    # The book: a sender killed while holding the lock (no expiry) blocks
    # every later send for ever.
    conn = redis.Redis.from_url(redis_url, decode_responses=True)
    book = Book(acquire_timeout=0.5)
    chat_id = book.create_chat(conn, "ann", ["bob"], "hello")
    child = Child(BOOK_SENDER, str(TESTS), redis_url, chat_id)
    assert child.line(timeout=20) == "locked"
    child.kill()
    assert conn.ttl("lock:chat:" + chat_id) == -1                 # orphaned, for ever
    with pytest.raises(Exception, match="Couldn't get the lock"):
        book.send_message(conn, chat_id, "bob", "after the crash")
    conn.close()

    # Ours: no lock.  Kill a sender mid-stream; sends go on, and every send
    # that returned is there, ids strictly increasing, none repeated.
    with Inbox("room", redis_url) as box:
        box.create(["ann", "bob"])
        child = Child(OUR_SENDER, redis_url, "room")
        returned = [child.line(timeout=20) for _ in range(30)]
        returned += child.kill()
        last = box.send("bob", b"after the crash")
        got = box.fetch_pending("bob", count=10000)
        ids = [m.id for m in got]
        assert ids == list(range(1, last + 1))                      # increasing, unique, no gap
        by_id = {m.id: m.payload for m in got}
        for line in returned:
            mid, i = map(int, line.split())
            assert by_id[mid] == b"m%d" % i
        assert got[-1].payload == b"after the crash"
        assert len(returned) >= 30 and last > len(returned)


def test_book_race_fetch_then_crash(redis_url):
    # The book: fetch moves 'seen' before the caller has the messages; a
    # recipient that crashes after the fetch (drops what it got) never sees them.
    conn = redis.Redis.from_url(redis_url, decode_responses=True)
    book = Book()
    chat_id = book.create_chat(conn, "ann", ["bob"], "m1")
    book.send_message(conn, chat_id, "ann", "m2")
    assert book_messages(book.fetch_pending_messages(conn, "bob"), chat_id) == ["m1", "m2"]
    # ... bob crashes before processing them ...
    assert book_messages(book.fetch_pending_messages(conn, "bob"), chat_id) == []   # lost
    conn.close()

    # Ours: the same messages again until bob acks them.
    with Inbox("room", redis_url) as box:
        box.create(["bob"], "ann", b"m1")
        box.send("ann", b"m2")
        assert payloads(box.fetch_pending("bob")) == [b"m1", b"m2"]
        # ... bob crashes before processing them ...
        again = box.fetch_pending("bob")
        assert payloads(again) == [b"m1", b"m2"]
        box.ack("bob", again[-1].id)
        assert box.fetch_pending("bob") == []


def test_book_race_leave_join(redis_url):
    # The book: bob's join reads the id counter (5); the last member, ann,
    # leaves before bob's write, deleting the chat with its counter; bob is
    # then written in at 5, ids start again at 1, and bob misses them.
    other = redis.Redis.from_url(redis_url, decode_responses=True)
    joiner = Hooked.from_url(redis_url, decode_responses=True)
    book = Book()
    chat_id = book.create_chat(other, "ann", [], "m0")
    for i in range(1, 5):
        book.send_message(other, chat_id, "ann", f"m{i}")
    joiner.before("PIPELINE", lambda: book.leave_chat(other, chat_id, "ann"))
    book.join_chat(joiner, chat_id, "bob")
    for i in range(3):
        book.send_message(other, chat_id, "cid", f"later{i}")
    assert other.zcard("msgs:" + chat_id) == 3                     # they are there ...
    assert book_messages(book.fetch_pending_messages(joiner, "bob"), chat_id) == []   # ... bob never sees them
    # and the serial order "leave, then join" crashes the book's join
    chat2 = book.create_chat(other, "ann", [], "x")
    book.leave_chat(other, chat2, "ann")
    with pytest.raises(TypeError):
        book.join_chat(other, chat2, "bob")
    other.close()
    joiner.close()

    # Ours: join and leave are one script each, so only the two serial
    # orders exist; in both, bob gets every message sent after his join.
    for order in ("join first", "leave first"):
        name = order.replace(" ", "-")
        with Inbox(name, redis_url) as box:
            box.create(["ann"], "ann", b"m0")
            for i in range(1, 5):
                box.send("ann", f"m{i}")
            if order == "join first":
                assert box.join("bob") == 5
                assert box.leave("ann")
            else:
                assert box.leave("ann")
                with pytest.raises(QueueError, match="no inbox named"):   # said, not silently lost
                    box.join("bob")
                assert box.join("bob", create=True) == 0
            box.join("cid")
            ids = [box.send("cid", f"later{i}") for i in range(3)]
            got = box.fetch_pending("bob")
            assert payloads(got) == [b"later0", b"later1", b"later2"]
            assert [m.id for m in got] == ids


def test_leave_between_the_steps_of_our_join(redis_url):
    # The book's interleaving applied to ours: the last member leaves after
    # bob's join has added its hint, just before its script.  The script
    # sees the inbox gone: an error, or with create=True a fresh inbox in
    # which bob gets everything; no hint or key is left dangling.
    for create in (False, True):
        name = f"r{int(create)}"
        other = Inbox(name, redis_url)
        other.create(["ann"], "ann", b"m0")
        other.send("ann", b"m1")
        client = Hooked.from_url(redis_url)
        client.before("EVALSHA", lambda other=other: other.leave("ann"), when=script_on(":members"))
        with Inbox(name, client) as box:
            if not create:
                with pytest.raises(QueueError, match="no inbox named"):
                    box.join("bob")
                assert keys(redis_url, f"*{{{name}}}*") == [] and inboxes_of(redis_url, "bob") == []
            else:
                assert box.join("bob", create=True) == 0
                box.join("cid")
                box.send("cid", b"later")
                assert [(m.id, m.payload) for m in box.fetch_pending("bob")] == [(1, b"later")]
                assert inboxes_of(redis_url, "bob") == [name]
        client.close()
        other.close()


# -- concurrency


def test_concurrent_senders_every_member_gets_every_message_once_in_order(redis_url):
    senders, receivers, per_sender = 4, 3, 150
    total = senders * per_sender
    setup = Inbox("busy", redis_url)
    setup.create([f"s{i}" for i in range(senders)] + [f"r{i}" for i in range(receivers)])
    sent: dict[int, bytes] = {}
    got: dict[str, list[InboxMessage]] = {f"r{i}": [] for i in range(receivers)}
    errors: list[BaseException] = []
    deadline = time.monotonic() + 30

    def send(i: int) -> None:
        try:
            with Inbox("busy", redis_url) as box:
                for j in range(per_sender):
                    p = b"s%d-%d" % (i, j)
                    sent[box.send(f"s{i}", p)] = p
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def receive(member: str) -> None:
        rng = random.Random(member)
        try:
            with Inbox("busy", redis_url) as box:
                while len(got[member]) < total and time.monotonic() < deadline:
                    ms = box.fetch_pending(member, count=rng.choice((1, 7, 50)))
                    if ms:
                        got[member].extend(ms)
                        box.ack(member, ms[-1].id)          # progressively
                    else:
                        time.sleep(0.002)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    threads += [threading.Thread(target=receive, args=(m,)) for m in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert not errors, errors
    assert sorted(sent) == list(range(1, total + 1))
    for member, ms in got.items():
        ids = [m.id for m in ms]
        assert ids == list(range(1, total + 1)), member   # each exactly once, in id order
        assert all(m.payload == sent[m.id] for m in ms)
    assert setup.redis.zcard("fastbus:i:{busy}:msgs") == total   # the senders, members too, hold them
    for i in range(senders):
        setup.ack(f"s{i}", total)
    assert setup.redis.zcard("fastbus:i:{busy}:msgs") == 0
    setup.close()


# -- Redis Cluster


def test_inboxes_and_user_hints_on_a_cluster(redis_cluster):
    # Inboxes whose hash tags land on each of the three nodes, members whose
    # hints land elsewhere: every script runs on the inbox's node, the hints
    # on their members' nodes.
    from fastbus._core import key_slot

    def one_per_node(kind: str) -> list[str]:
        found: dict[str, str] = {}
        for _ in range(1000):
            name = f"{kind}{tag}{uuid.uuid4().hex[:6]}"
            found.setdefault(redis_cluster.nodes_manager.get_node_from_slot(key_slot(name)).name, name)
            if len(found) == 3:
                break
        return sorted(found.values())

    tag = uuid.uuid4().hex[:8]                # the session's cluster is not flushed: fresh names
    names, members = one_per_node("in"), one_per_node("mb")
    boxes = [Inbox(n, redis_cluster) for n in names]
    for i, box in enumerate(boxes):
        assert box.create(members, members[0], b"first %d" % i) == 1
        box.send(members[-1], b"second %d" % i)
    for m in members:
        assert inboxes_of(redis_cluster, m) == sorted(names)
        got = fetch_all_pending(redis_cluster, m)
        assert {k: payloads(v) for k, v in got.items()} == {
            n: [b"first %d" % i, b"second %d" % i] for i, n in enumerate(names)}
        for n, ms in got.items():
            Inbox(n, redis_cluster).ack(m, ms[-1].id)
    for box in boxes:
        assert box.redis.exists(box._ops.ns + "msgs") == 0       # acked by all: deleted
        for m in members:
            assert box.leave(m)
    for m in members:
        assert inboxes_of(redis_cluster, m) == []
    left = redis_cluster.keys(f"*{tag}*", target_nodes=redis_cluster.ALL_NODES)
    assert left == []
