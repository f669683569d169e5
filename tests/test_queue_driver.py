"""The sync driver keeps a connection of the client's pool for script calls
(fastbus.queue.driver.SyncDriver): it must behave as the client's own path
does when the server closes it, when threads share a queue, and in a forked
child."""

from __future__ import annotations

import os
import threading

import redis

from fastbus.queue import WorkQueue


def test_a_connection_the_server_closed_while_idle_is_connected_again(redis_url):
    q = WorkQueue("jobs", redis_url)
    assert q.put(b"a") == 1
    admin = redis.Redis.from_url(redis_url)
    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1   # the server drops the queue's connections
    assert q.put(b"b") == 2                                          # not a ConnectionError
    assert q.put_many([b"c", b"d"]) == [3, 4]
    with q.consumer("w", clean_interval=None) as c:
        admin.client_kill_filter(_type="normal", skipme=True)
        assert [m.payload for m in c.get_many(10, timeout=0)] == [b"a", b"b", b"c", b"d"]
    admin.close()
    q.close()


def test_threads_share_one_queue_and_its_connection(redis_url):
    q = WorkQueue("jobs", redis_url)
    ids: list[int] = []
    lock = threading.Lock()

    def produce(k):
        mine = [q.put(b"%d-%d" % (k, i)) for i in range(300)]
        with lock:
            ids.extend(mine)
    got = []
    c = q.consumer("w", clean_interval=None)

    def consume():
        while len(got) < 1200:
            m = c.get(timeout=2)
            assert m is not None
            c.ack(m)
            got.append(m.id)
    threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)] + [threading.Thread(target=consume)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(ids) == list(range(1, 1201)) and sorted(got) == sorted(ids)
    c.close()
    assert q.stats().totals["ack"] == 1200
    q.close()


def test_a_forked_child_does_not_use_the_parent_s_connection(redis_url):
    q = WorkQueue("jobs", redis_url)
    assert q.put(b"parent") == 1
    pid = os.fork()
    if pid == 0:                                    # the child: its own connection, or it would garble the parent's
        try:
            ok = q.put_many([b"child"] * 50) == list(range(2, 52)) and q.put(b"child") == 52
        except BaseException:                       # noqa: BLE001 - report through the exit code
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert q.put(b"parent again") == 53
    assert q.stats().ready == 53
    q.close()
