"""put()s that overlap go in one script call (fastbus/queue/gather.py):
against a real Redis-compatible server, from threads and from tasks, and
the gathering's rules for errors, interrupts and cancellations, with a
send the test holds in flight."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from fastbus.queue import AsyncWorkQueue, WorkQueue
from fastbus.queue.gather import AsyncGathering, SyncGathering


def _everything(q: WorkQueue) -> dict[int, bytes]:
    with q.consumer("check", clean_interval=None) as c:
        got = {}
        while True:
            batch = c.get_many(1000, timeout=0)
            if not batch:
                return got
            got.update((m.id, m.payload) for m in batch)
            c.ack(*batch)


def test_puts_from_many_threads_each_get_their_own_id(redis_url):
    """16 threads, 150 put()s each, one message at a time: every put()
    returns the id its own message has on the server, no two the same, and
    overlapping puts went in fewer calls than messages."""
    q = WorkQueue("gathered", redis_url)
    try:
        mine: dict[int, bytes] = {}
        lock = threading.Lock()
        start = threading.Barrier(16)

        def producer(t: int) -> None:
            start.wait()
            for i in range(150):
                payload = b"%d-%d" % (t, i)
                rid = q.put(payload)
                with lock:
                    assert rid not in mine
                    mine[rid] = payload

        threads = [threading.Thread(target=producer, args=(t,)) for t in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(mine) == 16 * 150
        assert _everything(q) == mine
        assert q._puts.calls < 16 * 150 and q._puts.gathered > 0
        # Each thread's own messages are in the order it put them.
        for t in range(16):
            ids = sorted(rid for rid, p in mine.items() if p.startswith(b"%d-" % t))
            assert [mine[rid] for rid in ids] == [b"%d-%d" % (t, i) for i in range(150)]
    finally:
        q.close()


def test_puts_from_many_tasks_each_get_their_own_id(redis_url):
    async def main() -> None:
        q = AsyncWorkQueue("gathered-aio", redis_url)
        try:
            async def producer(t: int) -> list[tuple[int, bytes]]:
                out = []
                for i in range(100):
                    payload = b"%d-%d" % (t, i)
                    out.append((await q.put(payload), payload))
                return out

            results = await asyncio.gather(*(producer(t) for t in range(16)))
            mine = dict(pair for r in results for pair in r)
            assert len(mine) == 1600
            assert q._puts.calls < 1600 and q._puts.gathered > 0
        finally:
            await q.close()
        sync = WorkQueue("gathered-aio", redis_url)
        try:
            assert _everything(sync) == mine
        finally:
            sync.close()

    asyncio.run(main())


class _HeldSend:
    """A send whose first call the test holds in flight (so that others
    gather behind it), recording every call's payloads."""

    def __init__(self, fail_on: bytes | None = None) -> None:
        self.calls: list[list[bytes]] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        self.next_id = 1
        self.fail_on = fail_on

    def __call__(self, payloads: list[bytes]) -> int:
        self.calls.append(list(payloads))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(10)
        if self.fail_on in payloads:
            raise ConnectionError("the server went away")
        first, self.next_id = self.next_id, self.next_id + len(payloads)
        return first


def _waiting(g: SyncGathering, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(g.waiting) < n:
        assert time.monotonic() < deadline, "the puts did not queue"
        time.sleep(0.001)


def _start(target, *args) -> threading.Thread:
    t = threading.Thread(target=target, args=args)
    t.start()
    return t


def test_puts_behind_a_call_in_flight_go_in_one_call_in_order():
    g, send = SyncGathering(), _HeldSend()
    got: dict[bytes, int] = {}
    first = _start(lambda: got.__setitem__(b"a", g.put(b"a", send)))
    assert send.entered.wait(10)
    others = [_start(lambda p=p: got.__setitem__(p, g.put(p, send))) for p in (b"b", b"c", b"d")]
    _waiting(g, 3)
    send.release.set()
    for t in (first, *others):
        t.join(10)
    assert send.calls[0] == [b"a"]
    assert sorted(send.calls[1]) == [b"b", b"c", b"d"] and len(send.calls) == 2
    assert got[b"a"] == 1
    assert sorted(got[p] for p in (b"b", b"c", b"d")) == [2, 3, 4]
    assert [got[p] for p in send.calls[1]] == [2, 3, 4]       # each its own message's id
    assert not g.busy and not g.waiting


def test_a_failed_call_fails_every_put_it_carried_and_no_other():
    g, send = SyncGathering(), _HeldSend(fail_on=b"c")
    errors: dict[bytes, BaseException | int] = {}

    def put(p: bytes) -> None:
        try:
            errors[p] = g.put(p, send)
        except ConnectionError as e:
            errors[p] = e

    first = _start(put, b"a")
    assert send.entered.wait(10)
    others = [_start(put, p) for p in (b"b", b"c")]
    _waiting(g, 2)
    send.release.set()
    for t in (first, *others):
        t.join(10)
    assert errors[b"a"] == 1
    assert isinstance(errors[b"b"], ConnectionError) and isinstance(errors[b"c"], ConnectionError)
    assert g.put(b"e", send) == 2                  # the gathering goes on
    assert not g.busy


def test_a_put_the_bounds_leave_out_goes_in_the_next_call():
    g, send = SyncGathering(), _HeldSend()
    first = _start(g.put, b"a", send)
    assert send.entered.wait(10)
    big = [_start(g.put, bytes([65 + i]) * (3 << 20), send) for i in range(3)]   # 3 x 3 MiB: over 8 MiB
    _waiting(g, 3)
    send.release.set()
    for t in (first, *big):
        t.join(10)
    assert [len(c) for c in send.calls] == [1, 2, 1]


def test_a_cancelled_waiting_task_is_not_sent_and_a_cancelled_sender_still_sends():
    """A task cancelled while its put() waits: its message is not sent.
    A task cancelled just after it was named its group's sender: the group
    is sent all the same (the others' puts return their ids)."""

    async def main() -> None:
        g = AsyncGathering()
        calls: list[list[bytes]] = []
        hold = asyncio.Event()
        next_id = [1]

        async def send(payloads: list[bytes]) -> int:
            calls.append(list(payloads))
            if len(calls) == 1:
                await hold.wait()
            first = next_id[0]
            next_id[0] += len(payloads)
            return first

        a = asyncio.ensure_future(g.put(b"a", send))
        await asyncio.sleep(0)
        b = asyncio.ensure_future(g.put(b"b", send))
        c = asyncio.ensure_future(g.put(b"c", send))
        d = asyncio.ensure_future(g.put(b"d", send))
        await asyncio.sleep(0)
        c.cancel()                                 # waiting: never sent
        await asyncio.sleep(0)
        hold.set()
        while g.waiting:                           # (until a's call is answered and [b, d] formed)
            await asyncio.sleep(0)
        b.cancel()                                 # named the sender of [b, d] before it ran
        assert await a == 1
        with pytest.raises(asyncio.CancelledError):
            await b
        with pytest.raises(asyncio.CancelledError):
            await c
        assert await d == 3
        assert calls == [[b"a"], [b"b", b"d"]]
        assert not g.busy and not g.waiting

    asyncio.run(main())
