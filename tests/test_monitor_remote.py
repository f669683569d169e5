"""``fastbus monitor --redis URL --broker EP``: a real broker process and a
real Redis server, a known workload on both, one Prometheus scrape with
exact counts of both sides, /healthz when the broker stops, several
brokers, CURVE, the real command in a subprocess, and the page in a
headless browser."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest

from fastbus.errors import UsageError
from fastbus.cli import build_parser
from fastbus.monitor.cli import broker_sources, served_source, start_http
from fastbus.monitor.http import CompositeSource
from fastbus.monitor.queues import QueueSource
from fastbus.monitor.remote import RemoteBrokerSource
from fastbus.queue import WorkQueue

from brokers import BrokerProcess, browser, free_port
from test_monitor_broker import _Cells, _chromium, close_all, get, get_json, metrics, run_workload

N = 500             # messages published to the broker
M = 2               # its subscribers
INTERVAL = 0.2      # the monitor's polls and samples


class queue_workload:
    """100 put on "jobs", 40 delivered, 30 acked, 5 rejected: ready 60,
    unacked 5, failed 5 (the consumer stays open, holding 5, until close())."""

    def __init__(self, url: str) -> None:
        self.q = WorkQueue("jobs", url)
        self.q.put_many([b"x"] * 100)
        self.c = self.q.consumer("w1", clean_interval=None)
        got = self.c.get_many(40, timeout=0)
        self.c.settle(ack=got[:30], reject=got[30:35])

    def close(self) -> None:
        self.c.close()
        self.q.close()


class Monitor:
    """What ``fastbus monitor --redis URL --broker EP... --http 127.0.0.1:0``
    runs, in this process (the monitor CLI's own functions)."""

    def __init__(self, redis_url: str, *endpoints: str, **curve) -> None:
        self.queues = QueueSource(redis_url, interval=INTERVAL)
        self.brokers = broker_sources(list(endpoints), interval=INTERVAL, **curve)
        self.queues.start()
        for b in self.brokers.values():
            b.start()
        self.server = start_http(served_source(self.queues, self.brokers), "127.0.0.1:0")
        self.url = self.server.url

    def wait_fresh(self, timeout: float = 15.0) -> dict:
        """/varz once every source has a sample taken after now."""
        t = time.time()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = get_json(self.url + "/varz")
            if all(v.get(sid, {}).get("snapshot_time", 0) > t for sid in v["sources"]):
                return v
            time.sleep(0.05)
        raise AssertionError(f"no fresh sample of every source within {timeout} s: {v}")

    def close(self) -> None:
        self.server.stop()
        for b in self.brokers.values():
            b.close()
        self.queues.close()


@pytest.fixture
def broker():
    b = BrokerProcess()
    try:
        yield b
    finally:
        b.stop()


def test_one_scrape_has_exact_counts_of_the_queues_and_the_broker(broker, redis_url):
    pubs, subs = run_workload(broker.endpoint, N, M)
    q = queue_workload(redis_url)
    mon = Monitor(redis_url, broker.endpoint)
    try:
        varz = mon.wait_fresh()
        m = metrics(mon.url)
        b = "fastbus_broker_"
        assert m[b + "monitor_up"] == 1 and m[b + "monitor_errors_total"] == 0
        assert m[b + "messages_in_total"] == N
        assert m[b + "messages_out_total"] == N * M
        assert m[b + "deliveries_total"] == N * M
        assert all(v == 0 for k, v in m.items() if k.startswith(b + "drops_total")), m
        assert m[b + "subscriptions"] == M and m[b + "subscription_keys"] == 1
        assert m[b + "peers{role=client}"] == 1 + 2 * M and m[b + "sessions"] == 1 + 2 * M
        assert m[b + "subscribe_ops_total"] == M
        assert m[b + "queued_bytes"] == 0
        # the broker's memory, not this process's
        assert m[b + "resident_memory_bytes"] > 1 << 20
        assert m[b + "resident_memory_bytes"] == varz["broker"]["rss_bytes"]
        # one broker: its families carry no broker label (as the broker serves them itself)
        assert not any("broker=" in k for k in m), [k for k in m if "broker=" in k]
        lab = "{consumer=,kind=queue,name=jobs"
        assert m["fastbus_queue_monitor_up"] == 1
        assert m["fastbus_queue_ready" + lab + "}"] == 60
        assert m["fastbus_queue_unacked" + lab + "}"] == 5
        assert m["fastbus_queue_failed" + lab + "}"] == 5
        assert m["fastbus_queue_messages_total" + lab + ",op=in}"] == 100
        assert m["fastbus_queue_messages_total" + lab + ",op=delivered}"] == 40
        assert m["fastbus_queue_messages_total" + lab + ",op=acked}"] == 30
        assert m["fastbus_queue_messages_total" + lab + ",op=rejected}"] == 5
        # JSON: one section per source, and each source's endpoints
        assert varz["healthy"] is True, get(mon.url + "/healthz")
        assert set(varz["sources"]) == {"queues", "broker"}
        assert varz["broker"]["messages_in"] == N and varz["broker"]["endpoint"] == broker.endpoint
        assert varz["queues"]["sums"]["ready"] == 60
        assert get_json(mon.url + "/queuez")["queues"][0]["totals"]["acked"] == 30
        conns = get_json(mon.url + "/connz")
        assert conns == get_json(mon.url + "/broker/connz") or conns["total"] == 1 + 2 * M
        assert conns["total"] == 1 + 2 * M
        (pub,) = [c for c in conns["connections"] if c["name"] == "pub-1"]
        assert pub["messages_in"] == N and pub["role"] == "client"
        assert sorted(c["messages_out"] for c in conns["connections"] if c["name"].startswith("sub-")) \
            == [0] * M + [N] * M
        subsz = get_json(mon.url + "/subsz?limit=5")
        assert subsz["subscriptions"] == M and subsz["top"] is None and "fastbus broker --http" in subsz["note"]
        code, body = get(mon.url + "/healthz")
        assert code == 200 and json.loads(body)["unhealthy"] == []
        assert get(mon.url + "/broker/varz?window=nope")[0] == 400
        assert get(mon.url + "/nope")[0] == 404
    finally:
        mon.close()
        close_all(pubs, subs)
        q.close()


def test_healthz_is_503_while_the_broker_is_down_and_recovers(redis_url):
    port = free_port()
    broker = BrokerProcess(port=port)
    mon = Monitor(redis_url, broker.endpoint)
    try:
        mon.wait_fresh()
        assert get(mon.url + "/healthz")[0] == 200
        first = get_json(mon.url + "/broker/varz")["instance"]
        broker.stop()
        t0 = time.monotonic()
        while get(mon.url + "/healthz")[0] != 503:
            assert time.monotonic() - t0 < 10, "still healthy 10 s after the broker stopped"
            time.sleep(0.1)
        code, body = get(mon.url + "/healthz")
        health = json.loads(body)
        assert code == 503 and health["unhealthy"] == ["broker"]
        assert health["sources"]["queues"]["status"] == "ok"
        assert health["sources"]["broker"]["status"] == "stale"
        assert "BrokerUnavailable" in health["sources"]["broker"]["reason"]    # refused at once
        # no stale broker figure is served as a current one; the queues' still are
        m = metrics(mon.url)
        assert m["fastbus_broker_monitor_up"] == 0 and m["fastbus_broker_monitor_errors_total"] >= 1
        assert "fastbus_broker_messages_in_total" not in m
        assert m["fastbus_queue_monitor_up"] == 1
        # the broker comes back (a new instance): healthy again, its counters from 0
        broker.start()
        t0 = time.monotonic()
        while get(mon.url + "/healthz")[0] != 200:
            assert time.monotonic() - t0 < 10, "not healthy 10 s after the broker came back"
            time.sleep(0.1)
        v = get_json(mon.url + "/broker/varz")
        assert v["instance"] != first and v["healthy"] is True
        assert metrics(mon.url)["fastbus_broker_monitor_up"] == 1
    finally:
        mon.close()
        broker.stop()


def test_several_brokers_are_told_apart_by_a_broker_label(redis_url):
    a, b = BrokerProcess(), BrokerProcess()
    runs = []
    try:
        runs.append(run_workload(a.endpoint, N, M))
        runs.append(run_workload(b.endpoint, 7, 1))
        mon = Monitor(redis_url, a.endpoint, b.endpoint)
        try:
            varz = mon.wait_fresh()
            assert set(varz["sources"]) == {"queues", "broker", "broker-2"}
            m = metrics(mon.url)
            p = "fastbus_broker_"
            assert m[p + f"messages_in_total{{broker={a.endpoint}}}"] == N
            assert m[p + f"messages_out_total{{broker={a.endpoint}}}"] == N * M
            assert m[p + f"messages_in_total{{broker={b.endpoint}}}"] == 7
            assert m[p + f"messages_out_total{{broker={b.endpoint}}}"] == 7
            assert m[p + f"peers{{broker={b.endpoint},role=client}}"] == 1 + 2
            assert m[p + f"monitor_up{{broker={a.endpoint}}}"] == 1
            assert m[p + f"monitor_up{{broker={b.endpoint}}}"] == 1
            # every broker sample is labelled; the queues' are not
            assert all("broker=" in k for k in m if k.startswith(p)), [k for k in m if k.startswith(p)]
            assert not any("broker=" in k for k in m if k.startswith("fastbus_queue_"))
            assert get_json(mon.url + "/connz")["total"] == 1 + 2 * M          # the first broker's
            assert get_json(mon.url + "/broker-2/connz")["total"] == 1 + 2
            assert [s["id"] for s in get_json(mon.url + "/layout.json")["sections"]] == \
                ["queues", "broker", "broker-2"]
        finally:
            mon.close()
    finally:
        for pubs, subs in runs:
            close_all(pubs, subs)
        a.stop()
        b.stop()


def test_curve_broker_with_the_keys_fastbus_stats_takes(redis_url, tmp_path):
    import zmq.auth
    server_pub, _ = (k.decode() for k in zmq.auth.load_certificate(
        zmq.auth.create_certificates(str(tmp_path), "server")[1]))
    (tmp_path / "allowed").mkdir()
    zmq.auth.create_certificates(str(tmp_path / "allowed"), "mon")
    cert = str(tmp_path / "allowed" / "mon.key_secret")
    pub, sec = (k.decode() for k in zmq.auth.load_certificate(cert))
    b = BrokerProcess("--curve-cert", str(tmp_path / "server.key_secret"), "--curve-allow",
                      str(tmp_path / "allowed"), curve=(server_pub, pub, sec))
    try:
        good = RemoteBrokerSource(b.endpoint, timeout=2.0,
                                  curve=broker_sources([b.endpoint], curve_server_keys=[server_pub],
                                                       curve_cert=cert)["broker"].curve)
        assert good.poll() is True and good.varz({})["name"] == "fastbus"
        plain = RemoteBrokerSource(b.endpoint, timeout=0.5)           # no keys: no answer
        assert plain.poll() is False and "BrokerTimeout" in plain.last_error
        assert plain.health()[0] is False and good.health()[0] is True
        with pytest.raises(UsageError, match="needs both"):
            broker_sources([b.endpoint], curve_server_keys=[server_pub])
        with pytest.raises(UsageError, match="one per --broker"):
            broker_sources([b.endpoint, "tcp://127.0.0.1:1"], curve_server_keys=["k1", "k2", "k3"], curve_cert=cert)
    finally:
        b.stop()


def test_bad_sources_are_refused_clearly():
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        RemoteBrokerSource("127.0.0.1:6464")
    with pytest.raises(ValueError, match="interval"):
        RemoteBrokerSource("tcp://127.0.0.1:6464", interval=0)
    with pytest.raises(UsageError, match="twice"):
        broker_sources(["tcp://127.0.0.1:1", "tcp://127.0.0.1:1"])
    with pytest.raises(ValueError, match="bad source id"):
        CompositeSource({"metrics": RemoteBrokerSource("tcp://127.0.0.1:1")})
    src = RemoteBrokerSource("tcp://127.0.0.1:1")
    ok, body = src.health()                                          # never answered
    assert not ok and body["endpoint"] == "tcp://127.0.0.1:1"
    with pytest.raises(ValueError, match="has not answered yet"):
        src.varz({})


def test_fastbus_monitor_once_prints_the_broker_too(broker, redis_url):
    pubs, subs = run_workload(broker.endpoint, N, M)
    q = queue_workload(redis_url)
    try:
        out = io.StringIO()
        args = build_parser().parse_args(["monitor", "--redis", redis_url, "--broker", broker.endpoint,
                                          "--once", "--json", "--interval", "0.2"])
        args.out = out
        assert args.func(args) == 0
        snap = json.loads(out.getvalue())
        assert snap["queues"][0]["ready"] == 60
        assert snap["brokers"]["broker"]["messages_out"] == N * M
        out = io.StringIO()
        args = build_parser().parse_args(["monitor", "--redis", redis_url, "--broker", broker.endpoint,
                                          "--once", "--interval", "0.2"])
        args.out = out
        assert args.func(args) == 0
        assert f"at {broker.endpoint}: {1 + 2 * M} sessions, {M} subscriptions, messages in {N}, " \
               f"out {N * M:,}, dropped 0" in out.getvalue()
    finally:
        close_all(pubs, subs)
        q.close()


def test_the_real_command_serves_both_in_one_scrape(broker, redis_url):
    pubs, subs = run_workload(broker.endpoint, N, M)
    q = queue_workload(redis_url)
    p = subprocess.Popen([sys.executable, "-P", "-m", "fastbus", "monitor", "--redis", redis_url,
                          "--broker", broker.endpoint, "--http", "127.0.0.1:0", "--interval", "0.2",
                          "--for", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert "serving http://127.0.0.1:" in line and broker.endpoint in line, \
            (line, p.stderr.read() if p.poll() is not None else "")
        base = line.split("serving ")[1].split("/ ")[0]
        deadline = time.monotonic() + 15
        while True:
            m = metrics(base)
            if m.get("fastbus_broker_monitor_up") == 1 and m.get("fastbus_queue_monitor_up") == 1:
                break
            assert time.monotonic() < deadline, m
            time.sleep(0.1)
        assert m["fastbus_broker_messages_in_total"] == N
        assert m["fastbus_broker_messages_out_total"] == N * M
        assert m["fastbus_queue_ready{consumer=,kind=queue,name=jobs}"] == 60
        assert m["fastbus_queue_messages_total{consumer=,kind=queue,name=jobs,op=acked}"] == 30
        assert get(base + "/healthz")[0] == 200
    finally:
        p.terminate()
        assert p.wait(timeout=15) == 0, p.stderr.read()
        close_all(pubs, subs)
        q.close()


def test_the_page_shows_the_queues_and_the_broker_in_headless_chromium(broker, redis_url, tmp_path):
    path = browser()
    if path is None:
        pytest.skip("no Chromium here (.ci/run installs Debian's chromium; apt-get install chromium)")
    pubs, subs = run_workload(broker.endpoint, N, M)
    q = queue_workload(redis_url)
    mon = Monitor(redis_url, broker.endpoint)
    try:
        mon.wait_fresh()
        r = _chromium(path, mon.url + "/", "--dump-dom")
        assert r.returncode == 0, r.stderr[-3000:]
        page = _Cells()
        page.feed(r.stdout)
        assert page.polls >= 1, r.stdout[:3000]
        assert page.health == "ok"
        assert 'id="health-broker"' in r.stdout and 'id="health-queues"' in r.stdout
        # the queues' section
        assert page.tiles["queues/sums.ready"] == "60"
        assert page.tiles["queues/sums.unacked"] == "5"
        assert page.tiles["queues/sums.failed"] == "5"
        assert page.tiles["queues/counts.queues"] == "1"
        lanes = [cells for row_id, cells in page.rows if row_id == "queue:jobs/"]
        assert lanes and lanes[0]["ready"] == "60" and lanes[0]["failed"] == "5"
        # the broker's section
        assert page.tiles["broker/messages_in"] == str(N)
        assert page.tiles["broker/messages_out"] == str(N * M)
        assert page.tiles["broker/subscriptions"] == str(M)
        assert page.tiles["broker/peers"] == str(1 + 2 * M)
        assert int(page.tiles["broker/rss_bytes"]) > 1 << 20
        peers = [cells for row_id, cells in page.rows if "role" in cells]
        assert len(peers) == 1 + 2 * M
        (pub,) = [c for c in peers if c["name"] == "pub-1"]
        assert pub["messages_in"] == str(N)
        shot = tmp_path / "monitor-remote.png"
        r = _chromium(path, mon.url + "/", "--hide-scrollbars", "--window-size=1280,1600",
                      f"--screenshot={shot}")
        assert r.returncode == 0, r.stderr[-3000:]
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
        if os.environ.get("FASTBUS_KEEP_SCREENSHOT"):
            shot.replace(os.environ["FASTBUS_KEEP_SCREENSHOT"])
    finally:
        mon.close()
        close_all(pubs, subs)
        q.close()
