"""fastbus.channels.ChannelLayer on real brokers: what channels_redis's own
suite (tests/test_channels_redis_suite.py) does not ask — other processes,
a broker restart, what crosses the broker, what is dropped and counted,
and the errors a user meets."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import subprocess
import time

import pytest
from brokers import python_process, wait_for

pytest.importorskip("channels", reason="fastbus.channels needs channels: pip install 'fastbus[channels]'")
pytest.importorskip("msgpack", reason="fastbus.channels needs msgpack: pip install 'fastbus[channels]'")

from channels.exceptions import ChannelFull  # noqa: E402

from fastbus.channels import ChannelLayer  # noqa: E402

#: A consumer process: G channels in group "room", prints their names, then
#: what each receives (N messages each), as JSON lines.
CONSUMER = r"""
import asyncio, json, sys
from fastbus.channels import ChannelLayer
endpoint, groups, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

async def main():
    layer = ChannelLayer(endpoint)
    names = [await layer.new_channel() for _ in range(groups)]
    for name in names:
        await layer.group_add("room", name)
    print(json.dumps({"ready": names}), flush=True)

    async def take(name):
        return [(await asyncio.wait_for(layer.receive(name), 20))["i"] for _ in range(n)]

    got = await asyncio.gather(*(take(name) for name in names))
    print(json.dumps({"got": got, "stats": layer.stats()}), flush=True)
    await layer.flush()

asyncio.run(main())
"""


def _line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, f"the consumer exited ({proc.wait(10)}): {proc.stderr.read()[-3000:]}"
    return json.loads(line)


def test_group_send_reaches_every_member_in_other_processes_crossing_the_broker_once_per_process(brokers):
    """Two consumer processes with three channels each in one group: every
    group message reaches all six channels, in order, and the broker sends
    each one once per process (not once per member)."""
    b = brokers()
    procs = [python_process(CONSUMER, b.endpoint, "3", "50", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for _ in range(2)]
    try:
        for p in procs:
            assert len(_line(p)["ready"]) == 3          # every group_add has returned: in effect
        before = b.stats()["messages_out"]

        async def produce():
            layer = ChannelLayer(b.endpoint)
            for i in range(50):
                await layer.group_send("room", {"type": "chat.message", "i": i})
            await layer.flush()

        asyncio.run(produce())
        for p in procs:
            out = _line(p)
            assert out["got"] == [list(range(50))] * 3
            assert out["stats"]["dropped_full"] == out["stats"]["dropped_gone"] == 0
            assert p.wait(20) == 0
        assert b.stats()["messages_out"] - before == 2 * 50
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


#: A Channels background worker (what ``runworker`` runs: a consumer on a
#: named channel): takes tasks from "thumbnails" until it is told to stop,
#: printing each task's number, and then what its layer counted.
WORKER = r"""
import asyncio, json, sys
from fastbus.channels import ChannelLayer
endpoint = sys.argv[1]

async def main():
    layer = ChannelLayer(endpoint)
    done = []
    print(json.dumps({"ready": True}), flush=True)
    while True:
        message = await asyncio.wait_for(layer.receive("thumbnails"), 30)
        if message["type"] == "stop":
            break
        done.append(message["i"])
        await asyncio.sleep(0.001)                 # (the work)
    print(json.dumps({"done": done, "stats": layer.stats()}), flush=True)
    await layer.close()

asyncio.run(main())
"""


def _start_workers(b, n: int) -> list:
    """n WORKER processes, each receiving "thumbnails" once this returns."""
    procs = [python_process(WORKER, b.endpoint, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    try:
        for p in procs:
            assert _line(p)["ready"]
        wait_for(lambda: b.stats()["queue_group_members"] == n, what="every worker receiving")
    except BaseException:
        for p in procs:
            p.kill()
            p.wait(10)
        raise
    return procs


def _stop_workers(b, procs: list, flush: bool) -> list[dict]:
    """Stop WORKER processes; their last lines.  A stop is a task like any
    other, given to one worker, behind what it was given before: one per
    worker still running, each second until all are gone (a worker the
    broker held back, slow, gets none while the other can take it; then
    that one's stop comes again), 30 s at most.  ``flush``: the stopping
    layer flushes (what the broker keeps goes), else it closes."""
    async def stop() -> None:
        layer = ChannelLayer(b.endpoint)
        deadline = time.monotonic() + 30
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            for _ in range(b.stats()["queue_group_members"]):
                await layer.send("thumbnails", {"type": "stop"})
            await asyncio.sleep(1.0)
        await (layer.flush() if flush else layer.close())

    asyncio.run(stop())
    return [_line(p) for p in procs]


def test_a_named_channel_is_a_work_queue_across_worker_processes(brokers):
    """RedisChannelLayer's rule for a named channel, the layer's default:
    tasks sent before any worker runs wait at the broker, and with two
    worker processes on the channel each task is done exactly once, by
    one of them; the channel's capacity is any sender's ChannelFull."""
    b = brokers()

    async def send(n: int, start: int = 0, capacity: int = 10_000):
        layer = ChannelLayer(b.endpoint, capacity=capacity)
        for i in range(start, start + n):
            await layer.send("thumbnails", {"type": "thumbnail.make", "i": i})
        await layer.close()                        # (what the broker keeps stays: close(), not flush())

    asyncio.run(send(300))                         # nobody works yet: kept
    assert b.stats()["held_messages"] == 300

    async def full():
        layer = ChannelLayer(b.endpoint, capacity=300)     # another process's capacity: the broker's count
        with pytest.raises(ChannelFull):
            await layer.send("thumbnails", {"type": "thumbnail.make", "i": -1})
        await layer.close()

    asyncio.run(full())
    procs = _start_workers(b, 2)
    try:
        asyncio.run(send(700, start=300))      # (the first to join took the 300 kept)

        outs = _stop_workers(b, procs, flush=True)
        done = [i for out in outs for i in out["done"]]
        assert sorted(done) == list(range(1000)), "a task done twice or never"
        assert all(out["done"] for out in outs), "one worker did everything"
        assert all(p.wait(20) == 0 for p in procs)
        assert b.stats()["held_messages"] == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def test_a_worker_that_stops_gives_back_what_it_was_given_and_did_not_take(brokers):
    """The broker gives a joining worker the whole backlog; the worker
    takes one task and stops (its loop's layer closes): the other 199 go
    back to the broker, and the next worker gets each of them once."""
    b = brokers()

    async def main():
        sender = ChannelLayer(b.endpoint, capacity=1000)
        for i in range(200):
            await sender.send("tasks", {"type": "t", "i": i})
        first = ChannelLayer(b.endpoint)
        assert (await asyncio.wait_for(first.receive("tasks"), 5))["i"] == 0
        await first.close()
        assert first.stats()["given_back"] == 199 and first.stats()["dropped_gone"] == 0, first.stats()
        assert b.stats()["held_messages"] == 199
        second = ChannelLayer(b.endpoint)
        got = [(await asyncio.wait_for(second.receive("tasks"), 5))["i"] for _ in range(199)]
        assert sorted(got) == list(range(1, 200))
        await second.close()
        await sender.flush()

    asyncio.run(main())


def test_a_cancelled_receive_of_a_named_channel_loses_nothing(brokers):
    """Channels cancels a consumer's receive() when the consumer exits: the
    named channel ends in that loop; what the broker routed to it before
    its leaving took effect goes back, so the next receiver (in any
    process) gets every message sent after the cancel."""
    b = brokers()

    async def main():
        sender = ChannelLayer(b.endpoint, capacity=1000)
        worker = ChannelLayer(b.endpoint)
        await sender.send("jobs", {"type": "t", "i": 0})
        assert (await asyncio.wait_for(worker.receive("jobs"), 5))["i"] == 0
        pending = asyncio.ensure_future(worker.receive("jobs"))
        await asyncio.sleep(0.1)                       # (waiting on an empty channel)
        pending.cancel()
        await asyncio.sleep(0)
        for i in range(1, 201):                        # some reach the worker before it has left
            await sender.send("jobs", {"type": "t", "i": i})
        await asyncio.sleep(0.5)                       # (and go back)
        other = ChannelLayer(b.endpoint)
        got = [(await asyncio.wait_for(other.receive("jobs"), 5))["i"] for _ in range(200)]
        assert sorted(got) == list(range(1, 201))
        assert worker.stats()["dropped_gone"] == 0, worker.stats()
        for layer in (worker, other):
            await layer.close()
        await sender.flush()

    asyncio.run(main())


def test_named_channels_as_pubsub_when_configured(brokers):
    """named_channels="pubsub" (RedisPubSubChannelLayer's rule): every
    receiver of a named channel gets every message, and one sent while
    nobody receives is not kept."""
    b = brokers()

    async def main():
        layer = ChannelLayer(b.endpoint, named_channels="pubsub")
        other = ChannelLayer(b.endpoint, named_channels="pubsub")
        await layer.send("news", {"type": "x", "i": 0})          # nobody receives: gone
        first = asyncio.ensure_future(layer.receive("news"))
        second = asyncio.ensure_future(other.receive("news"))
        await asyncio.sleep(0.5)                                   # (both subscribed)
        await layer.send("news", {"type": "x", "i": 1})
        assert (await asyncio.wait_for(first, 5))["i"] == 1
        assert (await asyncio.wait_for(second, 5))["i"] == 1
        assert b.stats()["held_groups"] == 0
        await layer.flush()
        await other.flush()

    asyncio.run(main())


def test_the_layer_survives_a_broker_restart(brokers):
    """The broker goes away and comes back on the same port: the layer's
    connections come back by themselves, its channel and group still
    receive, and nothing arrives twice."""
    b = brokers()

    async def main():
        layer = ChannelLayer(b.endpoint)
        me = await layer.new_channel()
        await layer.group_add("g", me)
        await layer.group_send("g", {"type": "x", "i": 0})
        assert (await asyncio.wait_for(layer.receive(me), 5))["i"] == 0
        await asyncio.to_thread(b.kill)
        await asyncio.to_thread(b.start)
        # Messages sent before this loop's subscriptions are in effect again
        # for every sender may be lost (docs/channels.md): the broker may
        # route this loop's messages before the sender's filter has the
        # subscriptions back (what it sent with no filter yet arrives, what
        # it sends next may not, until the broker's WANT reaches it).  So:
        # a round a turn, until a group and a direct message both sent
        # after the first one arrived have come, bounded.
        seen: list[int] = []
        first_round = None
        task = asyncio.ensure_future(layer.receive(me))
        deadline = time.monotonic() + 20
        i = 1
        while time.monotonic() < deadline:
            await layer.group_send("g", {"type": "x", "i": i})
            await layer.send(me, {"type": "x", "i": -i})
            i += 1
            end = time.monotonic() + 0.2
            while (left := end - time.monotonic()) > 0:
                # (one receive() waits across turns: a cancelled one would
                # end the channel, as a consumer's exit does)
                await asyncio.wait({task}, timeout=left)
                if not task.done():
                    break
                seen.append(task.result()["i"])
                task = asyncio.ensure_future(layer.receive(me))
                if first_round is None:
                    first_round = i - 1
            if first_round is not None and any(k > first_round for k in seen) \
                    and any(-k > first_round for k in seen):
                break
        assert first_round is not None, "nothing arrived after the broker came back"
        assert any(k > first_round for k in seen) and any(-k > first_round for k in seen), \
            f"a kind of message stopped flowing after the broker came back: {seen}"
        assert len(seen) == len(set(seen)), f"delivered twice: {seen}"
        task.cancel()
        await layer.flush()

    asyncio.run(main())


def test_what_a_named_channel_keeps_survives_a_broker_restart_with_its_journal(brokers, tmp_path):
    """Sent to a named channel while nobody receives it, the broker killed
    (-9) and started again with its journal: a receiver then gets every
    message once, in order."""
    b = brokers("--journal", str(tmp_path / "journal"))

    async def main():
        sender = ChannelLayer(b.endpoint)
        for i in range(50):
            await sender.send("jobs", {"type": "job", "i": i})
        await sender.close()
        await asyncio.to_thread(b.kill)
        await asyncio.to_thread(b.start)
        receiver = ChannelLayer(b.endpoint)
        got = [(await asyncio.wait_for(receiver.receive("jobs"), 10))["i"] for _ in range(50)]
        assert got == list(range(50))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(receiver.receive("jobs"), 0.5)        # (nothing twice)
        await receiver.close()

    asyncio.run(main())


def test_capacity_raises_channel_full_for_a_local_receiver_and_counts_what_is_dropped(brokers, caplog):
    b = brokers()

    async def main():
        layer = ChannelLayer(b.endpoint, capacity=2, channel_capacity={"small.*": 1})
        ch = await layer.new_channel()
        small = await layer.new_channel("small")
        await layer.group_add("g", ch)
        await layer.group_add("g", small)
        for i in range(3):
            await layer.group_send("g", {"i": i})
        deadline = time.monotonic() + 5                # (each message reaches both channels: 6 in all)
        while layer.stats()["delivered"] + layer.stats()["dropped_full"] < 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert layer.stats()["dropped_full"] == 3      # ch: message 2; small: 1 and 2
        with pytest.raises(ChannelFull):
            await layer.send(ch, {"i": "over"})        # a receiver here, full: the sender hears it
        assert [(await layer.receive(ch))["i"] for _ in range(2)] == [0, 1]
        assert (await layer.receive(small))["i"] == 0
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(layer.receive(small), 0.3)
        await layer.flush()

    with caplog.at_level(logging.INFO, logger="fastbus.channels"):
        asyncio.run(main())
    assert "2 of 2 channels over capacity in group g" in caplog.text


def test_expired_messages_are_dropped_and_counted(brokers):
    b = brokers()

    async def main():
        layer = ChannelLayer(b.endpoint, expiry=0.3)
        ch = await layer.new_channel()
        await layer.send(ch, {"i": 0})
        await asyncio.sleep(0.6)
        await layer.send(ch, {"i": 1})
        assert (await asyncio.wait_for(layer.receive(ch), 5))["i"] == 1
        assert layer.stats()["dropped_expired"] == 1
        await layer.flush()

    asyncio.run(main())


def test_group_add_of_a_channel_not_received_in_this_loop_is_refused(brokers):
    """As from a sync view through async_to_sync (a loop per call): the
    membership of a consumer's channel would end with that call's loop, so
    it is refused, saying what to do; the consumer's own group_add works."""
    b = brokers()
    layer = ChannelLayer(b.endpoint)
    from asgiref.sync import async_to_sync

    async def consumer(started: asyncio.Event, names: list) -> None:
        names.append(await layer.new_channel())
        started.set()
        await asyncio.sleep(0.5)

    async def main():
        started, names = asyncio.Event(), []
        task = asyncio.ensure_future(consumer(started, names))
        await started.wait()
        with pytest.raises(RuntimeError, match="not received in this event loop.*self.channel_name"):
            await asyncio.to_thread(async_to_sync(layer.group_add), "room", names[0])
        await layer.group_add("room", names[0])                    # where it is received: fine
        await layer.group_send("room", {"n": 1})
        assert (await asyncio.wait_for(layer.receive(names[0]), 5))["n"] == 1
        await task
        await layer.flush()

    asyncio.run(main())


def test_a_named_channel_in_a_group_is_served_by_its_workers_in_any_process(brokers):
    """RedisChannelLayer's rule: a named channel added to a group (from a
    sync view, in a loop of its own, with no worker running) gets each of
    the group's messages once, kept by the broker until a worker comes,
    and then shared by the workers of two processes; a consumer's channel
    in the same group still gets every one; group_discard ends it."""
    b = brokers()
    layer = ChannelLayer(b.endpoint, capacity=1000)
    from asgiref.sync import async_to_sync

    async_to_sync(layer.group_add)("uploads", "thumbnails")     # a sync view's call: nothing receives it yet

    async def publish(start: int, n: int, consumer: bool) -> list:
        got = []
        ch = await layer.new_channel() if consumer else None
        if ch:
            await layer.group_add("uploads", ch)
        for i in range(start, start + n):
            await layer.group_send("uploads", {"type": "thumbnail.make", "i": i})
        while ch and len(got) < n:
            got.append((await asyncio.wait_for(layer.receive(ch), 10))["i"])
        await layer.close()
        return got

    assert asyncio.run(publish(0, 200, consumer=True)) == list(range(200))   # (the consumer's: every one)
    wait_for(lambda: b.stats()["held_messages"] == 200, what="the named channel's share kept")
    procs = _start_workers(b, 2)
    try:
        asyncio.run(publish(200, 300, consumer=False))

        outs = _stop_workers(b, procs, flush=False)
        done = [i for out in outs for i in out["done"]]
        assert sorted(done) == list(range(500)), "a task done twice or never"
        assert all(p.wait(20) == 0 for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    async_to_sync(layer.group_discard)("uploads", "thumbnails")
    asyncio.run(publish(500, 10, consumer=False))
    time.sleep(0.3)
    assert b.stats()["held_messages"] == 0                        # (not in the group any more: not kept)


def test_a_cancelled_receive_ends_its_channel_and_leaves_its_groups(brokers):
    b = brokers()

    async def main():
        layer = ChannelLayer(b.endpoint)
        ch = await layer.new_channel()
        await layer.group_add("g", ch)
        subscribed = b.stats()["subscriptions"]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(layer.receive(ch), 0.1)
        assert layer.stats()["channels"] == 0 and layer.stats()["groups"] == 0
        deadline = time.monotonic() + 5                 # the group's subscription goes too
        while b.stats()["subscriptions"] >= subscribed and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert b.stats()["subscriptions"] == subscribed - 1
        await layer.send(ch, {"i": 1})
        deadline = time.monotonic() + 5
        while layer.stats()["dropped_gone"] == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert layer.stats()["dropped_gone"] == 1
        await layer.flush()

    asyncio.run(main())


def test_unreadable_messages_are_dropped_and_counted_and_receiving_goes_on(brokers):
    """Whoever can publish on the layer's channels cannot stop its reader or
    its consumers: a payload too short, not msgpack, or a topic that is not
    UTF-8 is dropped, logged and counted."""
    import fastbus
    b = brokers()

    async def main():
        layer = ChannelLayer(b.endpoint)
        ch = await layer.new_channel()
        await layer.group_add("g", ch)
        mine = layer._get_layer().mine.encode()
        async with fastbus.aio.Client(endpoint=b.endpoint) as raw:
            await raw.publish(b"asgi:group:g", struct.pack("!d", time.time()) + b"\xc1")   # a stamp, then no msgpack
            await raw.publish(b"asgi:group:g", b"abc")                       # shorter than the stamp
            # a consumer's channel's messages carry its name (queue mode):
            await raw.publish(mine, b"\x00" * 8 + b"\x32abc")                 # a name cut short
            await raw.publish(mine, b"\x00" * 8 + b"\x02\xff\xfe")            # not UTF-8
            await raw.publish(mine, b"\x00" * 8 + b"\x10specific.other!x")     # another loop's channel
            await raw.flush()
        await layer.group_send("g", {"n": 2})
        assert (await asyncio.wait_for(layer.receive(ch), 5))["n"] == 2
        assert layer.stats()["malformed"] == 5
        await layer.flush()

    asyncio.run(main())


def test_a_consumers_channel_is_received_in_another_event_loop_once_its_own_has_closed(brokers):
    """As RedisChannelLayer's (channels_redis's test_double_receive): a
    channel new_channel() made in one async_to_sync call is sent to and
    received in others.  What waited in the closed loop, what was sent
    while no loop received, and what came for another channel with it,
    each reaches the next loop that receives its channel, once."""
    b = brokers()
    layer = ChannelLayer(b.endpoint)

    async def make():
        names = [await layer.new_channel() for _ in range(2)]
        await layer.send(names[0], {"type": "x", "i": 0})       # waits in this loop's inbox: given back at close
        return names

    c1, c2 = asyncio.run(make())

    async def while_its_loop_is_open():
        import threading
        made, go = [], threading.Event()

        def maker():                                 # a loop of its own, open while another receives
            async def run():
                made.append(await layer.new_channel())
                go.set()
                await asyncio.sleep(1)
            asyncio.run(run())

        t = threading.Thread(target=maker)
        t.start()
        await asyncio.to_thread(go.wait, 10)
        with pytest.raises(AssertionError, match="while that loop is open"):
            await layer.receive(made[0])
        await asyncio.to_thread(t.join, 10)

    asyncio.run(while_its_loop_is_open())

    async def send_more():
        await layer.send(c1, {"type": "x", "i": 1})              # no loop receives c1 now: kept by the broker
        await layer.send(c2, {"type": "x", "i": 2})

    asyncio.run(send_more())

    async def receive(name, n):
        got = [(await asyncio.wait_for(layer.receive(name), 10))["i"] for _ in range(n)]
        with pytest.raises(asyncio.TimeoutError):                # nothing more: none twice
            await asyncio.wait_for(layer.receive(name), 0.3)
        return got

    assert asyncio.run(receive(c1, 2)) == [0, 1]                  # (c2's came here too, and went back)
    assert asyncio.run(receive(c2, 1)) == [2]
    stats = layer.stats()
    assert stats["received"] == 3 and stats["given_back"] >= 2, stats
    assert stats["dropped_gone"] == stats["dropped_full"] == stats["malformed"] == 0, stats
    asyncio.run(layer.flush())
    assert b.stats()["held_messages"] == 0


def test_each_event_loop_closes_what_it_opened(brokers):
    """async_to_sync-style use: each call's loop opens connections, and
    the loop's close closes them."""
    b = brokers()
    layer = ChannelLayer(b.endpoint)
    for _ in range(3):
        asyncio.run(layer.group_send("g", {"type": "x"}))
    assert layer._layers == {}
    assert layer.stats()["sent"] == 3
    deadline = time.monotonic() + 10
    while b.stats()["peers"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b.stats()["peers"] == 0


def test_configuration_errors_are_clear():
    with pytest.raises(TypeError, match="'hosts'.*endpoint"):
        ChannelLayer(hosts=["redis://127.0.0.1:6379"])
    with pytest.raises(ValueError, match="serializer_format"):
        ChannelLayer(serializer_format="pickle")
    with pytest.raises(ValueError, match="duplicate endpoint"):
        ChannelLayer(["tcp://127.0.0.1:1", "tcp://127.0.0.1:1"])
    with pytest.raises(ValueError, match="capacity"):
        ChannelLayer(capacity=0)
    import fastbus
    with pytest.raises(fastbus.InvalidEndpoint):
        ChannelLayer("localhost:6464")                   # (no tcp://): said at startup
    layer = ChannelLayer()

    async def bad_names():
        with pytest.raises(TypeError):
            await layer.send("no spaces", {})
        with pytest.raises(TypeError):
            await layer.group_add("bad group", "ch")
        with pytest.raises(AssertionError, match="new_channel"):
            await layer.receive("specific.someoneelse!abc")

    asyncio.run(bad_names())


def test_symmetric_encryption_round_trips_and_another_key_cannot_read(brokers):
    pytest.importorskip("cryptography")
    layer = ChannelLayer(symmetric_encryption_keys=["k1"])
    data = layer.serialize({"type": "secret", "n": 1})
    assert b"secret" not in data
    assert layer.deserialize(data) == {"type": "secret", "n": 1}
    assert ChannelLayer(symmetric_encryption_keys=["k0", "k1"]).deserialize(data) == {"type": "secret", "n": 1}
    from cryptography.fernet import InvalidToken
    with pytest.raises(InvalidToken):
        ChannelLayer(symmetric_encryption_keys=["k2"]).deserialize(data)


def test_a_process_that_exits_without_closing_its_loop_leaves_the_broker_cleanly(brokers):
    """As daphne exits (its loop is never closed): the layer's connections
    say goodbye at interpreter exit, so the broker counts no peer lost."""
    b = brokers()
    script = ("import asyncio, os, sys\n"
              "from fastbus.channels import ChannelLayer\n"
              "layer = ChannelLayer(sys.argv[1])\n"
              "loop = asyncio.new_event_loop()\n"
              "ch = loop.run_until_complete(layer.new_channel())\n"
              "loop.run_until_complete(layer.group_add('g', ch))\n"
              "print('ready', flush=True)\n")
    p = python_process(script, b.endpoint, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and out == "ready\n", err
    deadline = time.monotonic() + 10
    while b.stats()["peers"] and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = b.stats()
    assert stats["peers"] == 0 and stats["subscriptions"] == 0
    assert not stats["drops"].get("unreachable"), stats["drops"]
