"""Queue monitoring against a real server: the registry of names
(``list_queues``, ``fastbus queue list``), the figures of
:class:`fastbus.monitor.queues.QueueSource` after known workloads (exact
counts and rates), its Prometheus families over HTTP, and ``fastbus
monitor``."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fastbus.cli import main
from fastbus.monitor.cli import start_http
from fastbus.monitor.http import parse_address
from fastbus.monitor.queues import QueueSource
from fastbus.queue import Inbox, QueueName, Topic, WorkQueue, list_queues, prune_queues
from fastbus.queue.driver import REGISTERED


def fresh(stem: str) -> str:
    return f"{stem}{uuid.uuid4().hex[:8]}"


def sadd_calls(client) -> int:
    """SADDs the server ran, the scripts' own included."""
    return (client.info("commandstats").get("cmdstat_sadd") or {}).get("calls", 0)


# -- the registry


def test_names_are_registered_by_the_writers_and_listed(redis_url):
    q = WorkQueue("jobs", redis_url)
    t = Topic("orders", redis_url)
    box = Inbox("team", redis_url)
    other = WorkQueue("idle", redis_url)
    assert list_queues(redis_url) == []               # objects alone register nothing
    q.put(b"x")
    t.register("billing")
    box.create(["ann", "bob"])
    with other.consumer("w1", clean_interval=None):   # a queue with a consumer and no message yet
        pass
    assert list_queues(redis_url) == [QueueName("inbox", "team"), QueueName("queue", "idle"),
                                      QueueName("queue", "jobs"), QueueName("topic", "orders")]
    assert list_queues(redis_url, kind="topic") == [("topic", "orders")]
    with pytest.raises(ValueError, match="kind must be one of"):
        list_queues(redis_url, kind="queues")
    # the last member out deletes the inbox: its name goes with it
    box.leave("ann")
    assert ("inbox", "team") in list_queues(redis_url)
    box.leave("bob")
    assert ("inbox", "team") not in list_queues(redis_url)
    box.join("cid", create=True)                        # made anew: listed again
    assert ("inbox", "team") in list_queues(redis_url)
    for o in (q, t, box, other):
        o.close()


def test_one_sadd_per_name_and_process_and_again_after_a_flush(redis_server, redis_url):
    client = redis_server.client()
    name = fresh("q")
    q = WorkQueue(name, redis_url)
    q.put(b"first")                                     # registered before the put, and again for id 1
    before = sadd_calls(client)
    q.put_many([b"a", b"b"])
    q2 = WorkQueue(name, redis_url)                     # another object, same process: cached
    for _ in range(20):
        q2.put(b"more")
    assert sadd_calls(client) == before
    assert list_queues(redis_url) == [("queue", name)]
    # the server loses everything (FLUSHALL; a restart without persistence):
    # the next put gets id 1 and registers again, whatever the cache says
    client.flushall()
    assert list_queues(redis_url) == []
    assert q2.put(b"again") == 1
    assert list_queues(redis_url) == [("queue", name)]
    q.close()
    q2.close()
    client.close()


def test_a_refused_registration_does_not_fail_the_write(redis_server, redis_url):
    client = redis_server.client()
    name = fresh("q")
    client.set("fastbus:registry", "not a set")        # the SADD is refused (WRONGTYPE)
    REGISTERED.clear()
    q = WorkQueue(name, redis_url)
    assert q.put(b"x") == 1                             # the put itself went through
    assert q.stats().ready == 1
    client.delete("fastbus:registry")
    q.put(b"y")                                         # not cached as registered: tried again
    assert list_queues(redis_url) == [("queue", name)]
    q.close()
    client.close()


def test_scan_finds_unregistered_queues_and_prune_drops_gone_ones(redis_server, redis_url):
    client = redis_server.client()
    q, t = WorkQueue("old", redis_url), Topic("oldtopic", redis_url)
    q.put(b"x")
    t.register("c1")
    client.delete("fastbus:registry")                   # as if written by a fastbus without the registry
    assert list_queues(redis_url) == []
    assert list_queues(redis_url, scan=True) == [("queue", "old"), ("topic", "oldtopic")]
    assert list_queues(redis_url) == [("queue", "old"), ("topic", "oldtopic")]   # scan registered them
    for key in client.keys("fastbus:q:{old}:*"):
        client.delete(key)
    assert prune_queues(redis_url) == [("queue", "old")]
    assert list_queues(redis_url) == [("topic", "oldtopic")]
    q.close()
    t.close()
    client.close()


def test_queue_list_cli(redis_url):
    WorkQueue("jobs", redis_url).put(b"x")
    Topic("ev", redis_url).register("a")
    out = io.StringIO()
    argv = ["queue", "list", "--url", redis_url]
    assert main_out([*argv, "--json"], out) == 0
    assert json.loads(out.getvalue()) == [{"kind": "queue", "name": "jobs"}, {"kind": "topic", "name": "ev"}]
    out = io.StringIO()
    assert main_out([*argv, "--kind", "topic"], out) == 0
    assert out.getvalue().split() == ["topic", "ev"]


def main_out(argv: list[str], out: io.StringIO) -> int:
    from fastbus.cli import build_parser
    args = build_parser().parse_args(argv)
    args.out = out
    return args.func(args)


# -- the figures


def test_work_queue_figures_after_a_known_workload(redis_url):
    q = WorkQueue("jobs", redis_url)
    src = QueueSource(redis_url, window=10)
    with q.consumer("w1", clean_interval=None) as c:
        s0 = src.sample(now=1000.0)
        assert s0["queues"][0]["totals"] == dict.fromkeys(s0["queues"][0]["totals"], 0)
        q.put_many([b"%d" % i for i in range(100)])
        got = c.get_many(40, timeout=0)
        c.settle(ack=got[:30], reject=got[30:35])
        s = src.sample(now=1002.0)
        (jobs,) = s["queues"]
        assert (jobs["ready"], jobs["unacked"], jobs["failed"]) == (60, 5, 5)
        assert jobs["totals"] == {"in": 100, "delivered": 40, "acked": 30, "rejected": 5, "requeued": 0,
                                  "returned": 0, "dead_lettered": 0, "expired": 0}
        assert jobs["rates"] == {"in": 50.0, "delivered": 20.0, "acked": 15.0, "rejected": 2.5, "requeued": 0.0,
                                 "returned": 0.0, "dead_lettered": 0.0, "expired": 0.0}
        (w1,) = jobs["instances"]
        assert (w1["tag"], w1["unacked"], w1["alive"]) == ("w1", 5, True)
        assert abs(w1["last_heartbeat"] - time.time()) < 5 and 0 <= w1["last_heartbeat_age_s"] < 5
        assert (jobs["live"], jobs["dead"]) == (1, 0)
        assert 0 <= jobs["oldest_ready_age_s"] < 5
        assert s["totals"]["in"] == 100 and s["rates"]["acked"] == 15.0
        # requeue 5 with max_deliveries 1: they go to failed as dead letters
        c.settle(requeue=got[35:])
    s = src.sample(now=1004.0)
    (jobs,) = s["queues"]
    # the 5 requeued went back to ready (delivery 1 of 10); the consumer closed
    assert (jobs["ready"], jobs["unacked"], jobs["failed"], jobs["instances"]) == (65, 0, 5, [])
    assert jobs["totals"]["requeued"] == 5
    # rates over the window: the oldest sample within 10 s is the first one
    assert jobs["rates"]["in"] == 25.0 and jobs["rates"]["requeued"] == 1.25
    dq = WorkQueue("jobs", redis_url, max_deliveries=1)
    with dq.consumer("w2", clean_interval=None) as c2:
        c2.requeue(*c2.get_many(3, timeout=0))          # delivered once already: dead letters now
    s = src.sample(now=1006.0)
    assert s["queues"][0]["totals"]["dead_lettered"] == 3 and s["queues"][0]["failed"] == 8
    src.close()
    q.close()
    dq.close()


def test_a_dead_consumer_shows_with_its_last_heartbeat(redis_url):
    q = WorkQueue("jobs", redis_url)
    q.put_many([b"a", b"b", b"c", b"d"])
    # a worker process that takes three messages and dies without closing
    code = textwrap.dedent(f"""
        import os
        from fastbus.queue import WorkQueue
        c = WorkQueue("jobs", {redis_url!r}).consumer("doomed", heartbeat_ttl=0.3, clean_interval=None)
        assert len(c.get_many(3, timeout=0)) == 3
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-P", "-c", code], check=True, timeout=60)
    died = time.time()
    src = QueueSource(redis_url)
    deadline = time.monotonic() + 10
    while True:
        (inst,) = src.sample()["queues"][0]["instances"]
        if not inst["alive"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (inst["tag"], inst["alive"], inst["unacked"]) == ("doomed", False, 3)
    assert inst["last_heartbeat"] <= died + 1 and inst["last_heartbeat_age_s"] > 0
    jobs = src.snapshot()["queues"][0]
    assert (jobs["live"], jobs["dead"], jobs["ready"], jobs["unacked"]) == (0, 1, 1, 3)
    assert q.clean().returned == 3                      # the cleaner gives them back; the consumer goes
    jobs = src.sample()["queues"][0]
    assert (jobs["ready"], jobs["unacked"], jobs["instances"], jobs["totals"]["returned"]) == (4, 0, [], 3)
    src.close()
    q.close()


def test_topic_and_inbox_figures(redis_url):
    t = Topic("orders", redis_url)
    t.register("billing")
    t.register("audit")
    box = Inbox("team", redis_url)
    box.create(["ann", "bob", "cid"])
    src = QueueSource(redis_url, members=2)
    src.sample(now=50.0)
    t.publish_many([b"o%d" % i for i in range(30)])
    with t.consumer("billing", "b1", clean_interval=None) as c:
        got = c.get_many(10, timeout=0)
        c.settle(ack=got[:8], reject=got[8:])
        for i in range(6):
            box.send("ann", b"m%d" % i)
        box.ack("ann", 6)
        box.ack("bob", 2)
        s = src.sample(now=53.0)
    (orders,) = s["topics"]
    assert (orders["last_id"], orders["published"], orders["rates"]["in"]) == (30, 30, 10.0)
    audit, billing = orders["consumers"]
    assert (audit["name"], audit["ready"], audit["totals"]["in"], audit["instances"]) == ("audit", 30, 30, [])
    assert (billing["ready"], billing["unacked"], billing["failed"]) == (20, 0, 2)
    assert (billing["totals"]["delivered"], billing["totals"]["acked"], billing["totals"]["rejected"]) == (10, 8, 2)
    assert billing["rates"]["acked"] == pytest.approx(8 / 3)
    assert [i["tag"] for i in billing["instances"]] == ["b1"]
    (team,) = s["inboxes"]
    assert (team["last_id"], team["stored"], team["members"]) == (6, 6, 3)
    # the two members furthest behind (members=2), most behind first
    assert team["pending"] == [{"member": "cid", "acked_upto": 0, "pending": 6},
                               {"member": "bob", "acked_upto": 2, "pending": 4}]
    assert team["totals"] == {"in": 6, "acked": 8, "expired": 0}
    assert team["rates"]["in"] == 2.0
    src.close()
    t.close()
    box.close()


def test_history_and_rates_over_the_ring(redis_url):
    q = WorkQueue("jobs", redis_url)
    q.put(b"x")
    src = QueueSource(redis_url, window=2, history=60)
    for i in range(5):
        q.put_many([b"y"] * 10)
        src.sample(now=100.0 + i)
    snap = src.snapshot(history=60)
    (jobs,) = snap["queues"]
    assert jobs["history"]["t"] == [101.0, 102.0, 103.0, 104.0] and jobs["history"]["dt"] == [1.0] * 4
    assert jobs["history"]["rates"]["in"] == [10.0, 10.0, 10.0, 10.0]
    assert jobs["rates"]["in"] == 10.0                  # over the last 2 s
    assert snap["history"]["rates"]["in"] == [10.0] * 4  # the sum of all
    assert src.snapshot(history=2)["history"]["t"] == [102.0, 103.0, 104.0]
    body = src.endpoints()["queuez"]({"kind": "topic"})
    assert body["queues"] == [] and body["topics"] == [] and body["lanes"] == []
    with pytest.raises(ValueError, match="kind must be"):
        src.endpoints()["varz"]({"kind": "queues"})
    with pytest.raises(ValueError, match="history must be"):
        src.endpoints()["varz"]({"history": "soon"})
    src.close()
    q.close()


def test_an_unreachable_server_is_reported_not_raised(redis_server, redis_url):
    WorkQueue("jobs", redis_url).put(b"x")
    src = QueueSource(redis_url)
    assert src.sample()["ok"] and src.healthy()
    redis_server.stop()
    try:
        s = src.sample()
        assert not s["ok"] and s["error"] and s["errors"] == 1
        assert s["queues"][0]["name"] == "jobs"        # the last good figures stay
        assert not src.healthy()
    finally:
        redis_server.start()
    src.close()


# -- HTTP and Prometheus


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_metrics_and_queuez_over_http(redis_url):
    q = WorkQueue("jobs", redis_url)
    t = Topic("ev", redis_url)
    t.register("billing")
    src = QueueSource(redis_url)
    with q.consumer("w1", clean_interval=None) as c:
        q.put_many([b"%d" % i for i in range(100)])
        got = c.get_many(40, timeout=0)
        c.settle(ack=got[:30], reject=got[30:35])
        t.publish_many([b"e"] * 7)
        src.sample()
        server = start_http(src, "127.0.0.1:0")
        base = server.url
        try:
            code, body = get(base + "/metrics")
            assert code == 200
            fams = {f.name: f for f in text_string_to_metric_families(body.decode())}

            def value(family, **labels):
                hits = [s.value for s in fams[family].samples
                        if all(s.labels.get(k) == v for k, v in labels.items())]
                assert len(hits) == 1, (family, labels, hits)
                return hits[0]

            J = {"kind": "queue", "name": "jobs", "consumer": ""}
            assert value("fastbus_queue_ready", **J) == 60
            assert value("fastbus_queue_unacked", **J) == 5
            assert value("fastbus_queue_failed", **J) == 5
            assert fams["fastbus_queue_messages"].type == "counter"
            for op, n in (("in", 100), ("delivered", 40), ("acked", 30), ("rejected", 5), ("dead_lettered", 0)):
                assert value("fastbus_queue_messages", op=op, **J) == n
            assert value("fastbus_queue_consumer_unacked", tag="w1", **J) == 5
            assert value("fastbus_queue_consumer_alive", tag="w1", **J) == 1
            assert value("fastbus_queue_consumers", state="live", **J) == 1
            assert value("fastbus_queue_messages", kind="topic", name="ev", consumer="", op="in") == 7
            assert value("fastbus_queue_ready", kind="topic", name="ev", consumer="billing") == 7
            assert value("fastbus_queue_last_id", kind="topic", name="ev") == 7
            assert value("fastbus_queue_registered", kind="queue") == 1
            assert value("fastbus_queue_monitor_up") == 1

            code, body = get(base + "/queuez?name=jobs")
            assert code == 200
            z = json.loads(body)
            assert [x["name"] for x in z["queues"]] == ["jobs"] and z["topics"] == []
            assert z["queues"][0]["totals"]["acked"] == 30
            assert get(base + "/healthz")[0] == 200
            varz = json.loads(get(base + "/varz")[1])
            assert varz["counts"]["queues"] == 1 and varz["sums"]["ready"] == 60 + 7
            assert get(base + "/varz?history=nope")[0] == 400
            assert get(base + "/nope")[0] == 404
        finally:
            server.stop()
    src.close()
    q.close()
    t.close()


def test_http_address_is_loopback_unless_allowed():
    assert parse_address("127.0.0.1:8223", False) == ("127.0.0.1", 8223)
    assert parse_address("[::1]:0", False) == ("::1", 0)
    with pytest.raises(ValueError, match="allow-remote"):
        parse_address("0.0.0.0:8223", False)
    assert parse_address("0.0.0.0:8223", True) == ("0.0.0.0", 8223)
    with pytest.raises(ValueError, match="needs a host and a port"):
        parse_address("8223", False)


def test_fastbus_monitor_command(redis_url):
    q = WorkQueue("jobs", redis_url)
    q.put_many([b"x"] * 12)
    out = io.StringIO()
    assert main_out(["monitor", "--redis", redis_url, "--once", "--json", "--interval", "0.2"], out) == 0
    snap = json.loads(out.getvalue())
    assert snap["queues"][0]["name"] == "jobs" and snap["queues"][0]["ready"] == 12
    out = io.StringIO()
    assert main_out(["monitor", "--redis", redis_url, "--once", "--interval", "0.2"], out) == 0
    assert "queue jobs: ready 12, unacked 0, failed 0; consumers 0 live, 0 dead; idle" in out.getvalue()
    # serving: a separate process, on a free port, stopped by SIGTERM
    p = subprocess.Popen([sys.executable, "-P", "-m", "fastbus", "monitor", "--redis", redis_url,
                          "--http", "127.0.0.1:0", "--interval", "0.2", "--for", "30"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert "serving http://127.0.0.1:" in line, (line, p.stderr.read() if p.poll() is not None else "")
        base = line.split("serving ")[1].split("/ ")[0]
        code, body = get(base + "/metrics")
        assert code == 200 and 'fastbus_queue_ready{consumer="",kind="queue",name="jobs"} 12.0' in body.decode()
    finally:
        p.terminate()
        assert p.wait(timeout=10) == 0
    q.close()


def test_fastbus_monitor_refuses_a_remote_address_unless_allowed(capsys):
    assert main(["monitor", "--http", "1.2.3.4:80", "--redis", "redis://127.0.0.1:1/0"]) == 2
    assert "--allow-remote" in capsys.readouterr().err


# -- Redis Cluster


def test_registry_and_monitor_on_a_cluster(redis_cluster):
    from fastbus._core import key_slot
    names, nodes = [], set()
    while len(names) < 3:                               # queues on three different nodes
        name = fresh("q")
        node = redis_cluster.nodes_manager.get_node_from_slot(key_slot(name)).name
        if node not in nodes:
            nodes.add(node)
            names.append(name)
    topic = fresh("t")
    for i, name in enumerate(names):
        WorkQueue(name, redis_cluster).put_many([b"x"] * (i + 1))
    t = Topic(topic, redis_cluster)
    t.register("c1")
    t.publish(b"e")
    listed = list_queues(redis_cluster)
    assert set(names) <= {n.name for n in listed if n.kind == "queue"}
    assert ("topic", topic) in listed
    src = QueueSource(redis_cluster)
    snap = src.sample()
    ready = {q["name"]: q["ready"] for q in snap["queues"]}
    assert [ready[n] for n in names] == [1, 2, 3]
    (tp,) = [x for x in snap["topics"] if x["name"] == topic]
    assert tp["consumers"][0]["ready"] == 1
    # scan goes over every node
    redis_cluster.delete("fastbus:registry")
    found = list_queues(redis_cluster, scan=True)
    assert set(names) <= {n.name for n in found}
    src.close()


def test_async_list_queues(redis_url):
    import asyncio

    from fastbus.queue import AsyncWorkQueue, async_list_queues, async_prune_queues

    async def go():
        async with AsyncWorkQueue("aio", redis_url) as q:
            await q.put(b"x")
            assert await async_list_queues(redis_url) == [("queue", "aio")]
            assert await async_prune_queues(redis_url) == []
    asyncio.run(go())


def test_the_grafana_example_uses_only_exported_families(redis_url, repo_root):
    import re
    q = WorkQueue("jobs", redis_url)
    with q.consumer("w1", clean_interval=None):
        q.put(b"x")
        Topic("ev", redis_url).publish(b"e")
        Inbox("team", redis_url).create(["ann"])
        src = QueueSource(redis_url)
        src.sample()
        exported = set()
        for fam in src.collect():
            exported.update(s.name for s in fam.samples)
    dash = json.loads((repo_root / "examples" / "grafana-fastbus-queues.json").read_text())
    used = {m for p in dash["panels"] for t in p["targets"] for m in re.findall(r"fastbus_queue_\w+", t["expr"])}
    assert used and used <= exported, used - exported
    src.close()
    q.close()


def test_the_page_layout_points_at_what_varz_serves(redis_url):
    q = WorkQueue("jobs", redis_url)
    t = Topic("ev", redis_url)
    t.register("a")
    with q.consumer("w1", clean_interval=None) as c:
        q.put_many([b"x"] * 9)
        c.get(timeout=0)
        t.publish(b"e")
        src = QueueSource(redis_url)
        src.sample()
        varz = src.endpoints()["varz"]({"history": "300"})
    layout = src.layout()

    def dig(obj, dotted):
        for part in dotted.split("."):
            obj = obj[part]
        return obj

    assert [dig(varz, tile["key"]) for tile in layout["tiles"]] == [8 + 1, 1, 0, 1, 0, 1, 1, 0]
    for chart in layout["charts"]:
        for series in chart["series"]:
            assert series["key"] in varz["rates"] and series["key"] in varz["history"]["rates"]
    (table,) = layout["tables"]
    rows = varz[table["rows"]]
    assert [(r["kind"], r["name"], r["consumer"], r["ready"], r["unacked"]) for r in rows] == \
        [("queue", "jobs", "", 8, 1), ("topic", "ev", "a", 1, 0)]
    assert all(col["key"] in rows[0] for col in table["columns"]) and table["id"] in rows[0]
    src.close()
    q.close()
    t.close()
