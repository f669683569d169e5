"""Monitoring of the broker over HTTP (``fastbus broker --http``): a real
broker process, a known workload through fastbus.Client, then /metrics
(parsed with prometheus_client's parser), /varz, /connz, /subsz and
/healthz checked for exact figures; the web page in a real headless
Chromium; ``fastbus stats --clients`` and ``--watch``."""

from __future__ import annotations

import fcntl
import html.parser
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

import fastbus
from fastbus import protocol as P
from fastbus.broker import Broker, BrokerConfig
from fastbus.errors import MonitorBindError

from brokers import BrokerProcess, browser, free_port, wait_wanted

N = 3000            # messages published
M = 3               # subscribers
PAYLOAD = b"p" * 20


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str) -> dict:
    status, body = get(url)
    assert status == 200, (url, status, body)
    return json.loads(body)


def wait_snapshot_after(base: str, t: float, timeout: float = 10.0) -> dict:
    """/varz once the broker published a snapshot taken after wall time t."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = get_json(base + "/varz")
        if v["snapshot_time"] > t:
            return v
        time.sleep(0.1)
    raise AssertionError(f"no snapshot after {t} within {timeout} s")


def metrics(base: str) -> dict:
    """{sample name + sorted labels: value} of a /metrics scrape."""
    status, body = get(base + "/metrics")
    assert status == 200
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
                            if s.labels else "")
            out[key] = s.value
    return out


def run_workload(endpoint: str, n: int = N, m: int = M) -> tuple[list, list]:
    """One publisher ("pub-1") sends n messages on "t.a"; m subscribers
    ("sub-0".."sub-{m-1}") receive all of them.  The clients stay open
    (closed by the caller), so /connz lists them."""
    subs = []
    for i in range(m):
        c = fastbus.Client(endpoint=endpoint, name=f"sub-{i}")
        ps = c.pubsub()
        ps.subscribe("t.a")
        assert ps.get_message(timeout=5)["type"] == "subscribe"
        subs.append((c, ps))
    pub = fastbus.Client(endpoint=endpoint, name="pub-1")
    # the publisher's filter must know the subscriptions before it publishes
    deadline = time.monotonic() + 5
    while not pub.stats()["filter_active"] and time.monotonic() < deadline:
        time.sleep(0.01)
    for _ in range(n):
        pub.publish("t.a", PAYLOAD)
    pub.flush()
    got = [0] * m
    deadline = time.monotonic() + 20
    while min(got) < n and time.monotonic() < deadline:
        for j, (_c, ps) in enumerate(subs):
            got[j] += len(ps.get_batch(timeout=0.05))
    assert got == [n] * m
    return [pub], subs


def close_all(clients, subs) -> None:
    for ps_client, ps in subs:
        ps.close()
        ps_client.close()
    for c in clients:
        c.close()


@pytest.fixture
def broker():
    """A broker process with --http."""
    port = free_port()
    b = BrokerProcess("--http", f"127.0.0.1:{port}")
    b.http = f"http://127.0.0.1:{port}"
    try:
        yield b
    finally:
        b.stop()


def test_metrics_count_pauses_drops_and_gap_notices(tmp_path):
    """A stuck subscriber: publishers are paused, then (past
    --flow-max-pause) its oldest messages are dropped and it is told how
    many in a gap notice.  /metrics says so, with the figures the
    subscriber saw."""
    port = free_port()
    b = BrokerProcess("--http", f"127.0.0.1:{port}", "--max-queue-bytes", "2000000", "--flow-max-pause", "0.5")
    base = f"http://127.0.0.1:{port}"
    try:
        with fastbus.Client(endpoint=b.endpoint, max_inbox_bytes=100_000) as stuck, \
                fastbus.Client(endpoint=b.endpoint, max_buffer_bytes=1 << 20, block_timeout=30) as pub:
            p = stuck.pubsub(ignore_subscribe_messages=True)
            p.subscribe("flow")
            wait_wanted(pub, "flow")
            # 100 MB, nobody reads: far more than the socket buffers on the
            # way can hold (loopback TCP autotuning took ~10 MB of 10 MB sent
            # with 200-byte messages, and then nothing was ever paused)
            for _ in range(50_000):
                pub.publish("flow", b"z" * 2000)
            pub.flush(timeout=30)
            got = lost = gaps = 0
            while (m := p.get_message(timeout=1.0)) is not None:
                got += m["type"] == "message"
                if m["type"] == "gap":
                    gaps += 1
                    lost += m["data"]["lost"]
            assert got + lost == 50_000 and lost > 0 and gaps >= 1
            wait_snapshot_after(base, time.time())
            m = metrics(base)
            pre = "fastbus_broker_"
            assert m[pre + "flow_pauses_total"] >= 1
            assert m[pre + "drops_total{reason=slow_consumer}"] == lost
            assert m[pre + "gap_notices_total"] == gaps
            assert m[pre + "messages_in_total"] == 50_000
            # sent is what reached the subscriber; routed counts the dropped too
            assert m[pre + "messages_out_total"] == got
            assert m[pre + "deliveries_total"] == 50_000
    finally:
        b.stop()


def test_metrics_exact_counts_after_known_workload(broker):
    t_start = time.time()
    pubs, subs = run_workload(broker.endpoint)
    try:
        done = time.time()
        varz = wait_snapshot_after(broker.http, done)
        m = metrics(broker.http)
        p = "fastbus_broker_"
        assert m[p + "messages_in_total"] == N
        assert m[p + "messages_out_total"] == N * M
        assert m[p + "deliveries_total"] == N * M
        assert all(v == 0 for k, v in m.items() if k.startswith(p + "drops_total")), m
        assert m[p + "drops_total{reason=slow_consumer}"] == 0
        assert m[p + "subscriptions"] == M
        assert m[p + "subscription_keys"] == 1
        # each subscriber's Client has its publishing session and its pubsub's
        assert m[p + "peers{role=client}"] == 1 + 2 * M
        assert m[p + "sessions"] == 1 + 2 * M
        assert m[p + "subscribe_ops_total"] == M
        assert m[p + "queued_bytes"] == 0
        assert m[p + "flow_pauses_total"] == 0 and m[p + "gap_notices_total"] == 0
        assert m[p + "batches_in_total"] >= 1 and m[p + "batches_out_total"] >= M
        assert m[p + "bytes_in_total"] > N * (len(PAYLOAD) + 3)
        assert 0 < m[p + "uptime_seconds"] < time.time() - t_start + 30
        assert m[p + "resident_memory_bytes"] > 1 << 20
        info = [k for k in m if k.startswith(p + "info{")]
        assert len(info) == 1 and f"version={fastbus.__version__}" in info[0]
        # the same figures as JSON
        assert varz["messages_in"] == N and varz["messages_out"] == N * M
        assert varz["bytes_in"] == m[p + "bytes_in_total"]
        assert varz["bytes_out"] == m[p + "bytes_out_total"]
        assert varz["dropped"] == 0 and varz["healthy"] is True
        assert varz["rss_bytes"] == pytest.approx(m[p + "resident_memory_bytes"], rel=0.5)
    finally:
        close_all(pubs, subs)


def test_varz_rates_add_up_to_the_counters(broker):
    pubs, subs = run_workload(broker.endpoint)
    try:
        varz = wait_snapshot_after(broker.http, time.time())
        v = get_json(broker.http + "/varz?history=600")
        h = v["history"]
        assert len(h["t"]) >= 1
        assert set(h["rates"]) >= {"messages_in", "messages_out", "bytes_in", "dropped"}
        # rate x interval, summed over the history (since the broker
        # started), is the counter's growth
        total_in = sum(r * dt for r, dt in zip(h["rates"]["messages_in"], h["dt"]))
        assert total_in == pytest.approx(N, rel=0.001), h
        total_out = sum(r * dt for r, dt in zip(h["rates"]["messages_out"], h["dt"]))
        assert total_out == pytest.approx(N * M, rel=0.001), h
        assert set(v["rates"]) >= {"messages_in", "messages_out", "bytes_in", "bytes_out", "batches_in",
                                   "batches_out", "dropped"}
        assert all(r >= 0 for r in v["rates"].values())
        assert 0 < v["rate_window_s"] <= 6
        assert varz["uptime_s"] > 0 and varz["endpoints"] == [broker.endpoint]
        status, body = get(broker.http + "/varz?window=nope")
        assert status == 400 and b"window" in body
    finally:
        close_all(pubs, subs)


def test_connz_one_entry_per_peer_with_names_and_exact_traffic(broker):
    t0 = time.time()
    pubs, subs = run_workload(broker.endpoint)
    try:
        wait_snapshot_after(broker.http, time.time())
        c = get_json(broker.http + "/connz")
        peers = c["connections"]
        assert c["total"] == len(peers) == 1 + 2 * M
        pub = [p for p in peers if p["name"] == "pub-1"]
        assert len(pub) == 1
        pub = pub[0]
        assert pub["role"] == "client" and pub["address"] == "127.0.0.1" and pub["publisher"] is True
        assert pub["messages_in"] == N and pub["messages_out"] == 0 and pub["subscriptions"] == 0
        assert pub["batches_in"] >= 1 and pub["bytes_in"] > N * len(PAYLOAD)
        assert t0 - 1 <= pub["connected_since"] <= time.time()
        for i in range(M):
            mine = [p for p in peers if p["name"] == f"sub-{i}"]
            # the client's publishing session and its pubsub's session
            assert len(mine) == 2
            pubsub = [p for p in mine if p["subscriptions"] == 1]
            assert len(pubsub) == 1
            ps = pubsub[0]
            assert ps["messages_out"] == N and ps["messages_in"] == 0
            assert ps["queued_bytes"] == 0 and ps["slow"] is False and ps["lost_unreported"] == 0
            assert ps["batches_out"] >= 1 and ps["bytes_out"] > N * len(PAYLOAD)
        # the per-peer figures add up to the broker's
        varz = get_json(broker.http + "/varz")
        assert sum(p["messages_in"] for p in peers) == varz["messages_in"]
        assert sum(p["messages_out"] for p in peers) == varz["messages_out"]
        assert sum(p["bytes_in"] for p in peers) == varz["bytes_in"]
        assert sum(p["bytes_out"] for p in peers) == varz["bytes_out"]
        # sorting and paging
        top = get_json(broker.http + "/connz?sort=messages_out&limit=2")
        assert [p["messages_out"] for p in top["connections"]] == [N, N]
        assert top["total"] == 1 + 2 * M and top["limit"] == 2
        status, body = get(broker.http + "/connz?sort=name")
        assert status == 400 and b"cannot sort" in body
    finally:
        close_all(pubs, subs)
    # they left: the next snapshot has none
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and get_json(broker.http + "/connz")["total"]:
        time.sleep(0.2)
    assert get_json(broker.http + "/connz")["total"] == 0


def test_subsz_counts_and_top_keys(broker):
    clients = []
    try:
        wanted = {"sub-0": ["a", "b", "c"], "sub-1": ["a", "b"], "sub-2": ["a"]}
        for name, keys in wanted.items():
            c = fastbus.Client(endpoint=broker.endpoint, name=name)
            ps = c.pubsub()
            ps.subscribe(*keys)
            for _ in keys:
                assert ps.get_message(timeout=5)["type"] == "subscribe"
            clients.append((c, ps))
        wait_snapshot_after(broker.http, time.time())
        s = get_json(broker.http + "/subsz")
        assert s["subscriptions"] == 6 and s["keys"] == 3 and "top" not in s
        s = get_json(broker.http + "/subsz?limit=2")
        assert s["top"] == [{"key": "a", "prefix": False, "subscribers": 3},
                            {"key": "b", "prefix": False, "subscribers": 2}]
        assert s["limit"] == 2
        status, body = get(broker.http + "/subsz?limit=0")
        assert status == 400 and b"limit" in body
    finally:
        close_all([], clients)


def test_healthz_and_unknown_paths(broker):
    status, body = get(broker.http + "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, body = get(broker.http + "/nothing")
    assert status == 404 and b"/varz" in body
    layout = get_json(broker.http + "/layout.json")
    assert layout["poll"] == "/varz" and layout["tables"]
    status, page = get(broker.http + "/")
    assert status == 200 and b"static/monitor.js" in page
    for path in ("/static/monitor.js", "/static/monitor.css"):
        assert get(broker.http + path)[0] == 200


def test_healthz_503_when_the_loop_is_stuck_on_its_log_pipe():
    """A broker whose log pipe nobody reads (a real way for the loop to get
    stuck: its logging write blocks) stops publishing snapshots: /healthz
    says 503 while the HTTP thread still answers; once the pipe is read
    again, the loop goes on and /healthz is 200 again."""
    port, http = free_port(), free_port()
    base = f"http://127.0.0.1:{http}"
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)         # the smallest pipe: a page
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.Popen([sys.executable, "-m", "fastbus", "broker", "--bind", f"tcp://127.0.0.1:{port}",
                                 "--http", f"127.0.0.1:{http}", "--http-max-age", "1", "--log-level", "INFO",
                                 "--stats-interval", "0"], cwd=cwd, stdout=w, stderr=w)
        os.close(w)
        ctx = zmq.Context()
        socks = []
        drained = []
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    if get(base + "/healthz", timeout=1)[0] == 200:
                        break
                except OSError:
                    time.sleep(0.1)
            assert get(base + "/healthz")[0] == 200
            # Sessions that say HELLO: each is a log line ("peer ... joined")
            # of over 100 bytes; 200 of them are more than the pipe holds.
            for i in range(200):
                s = ctx.socket(zmq.DEALER)
                s.linger = 0
                s.connect(f"tcp://127.0.0.1:{port}")
                s.send_multipart([P.HELLO, json.dumps({"v": P.VERSION, "name": f"session-{i:03d}-" + "x" * 80})
                                  .encode()])
                socks.append(s)
            status = 200
            deadline = time.monotonic() + 15
            while status == 200 and time.monotonic() < deadline:
                time.sleep(0.3)
                status, body = get(base + "/healthz", timeout=5)
            assert status == 503, body
            assert json.loads(body)["status"] == "stale"
            assert get(base + "/varz")[0] == 200           # the HTTP side still serves the last snapshot
            # read the pipe again: the loop goes on
            reader = threading.Thread(target=lambda: drained.append(_drain(r)), daemon=True)
            reader.start()
            deadline = time.monotonic() + 15
            while status != 200 and time.monotonic() < deadline:
                time.sleep(0.3)
                status, body = get(base + "/healthz", timeout=5)
            assert status == 200, body
            deadline = time.monotonic() + 10
            while get_json(base + "/varz")["peers"] < 200 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert get_json(base + "/varz")["peers"] == 200
        finally:
            for s in socks:
                s.close()
            ctx.term()
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            if not drained:
                os.close(r)


def _drain(fd: int) -> int:
    n = 0
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            os.close(fd)
            return n
        n += len(chunk)


def test_non_loopback_http_is_refused_without_allow_remote():
    port = free_port()
    with tempfile.TemporaryDirectory() as cwd:
        r = subprocess.run([sys.executable, "-m", "fastbus", "broker", "--bind", f"tcp://127.0.0.1:{port}",
                            "--http", "0.0.0.0:8222"], cwd=cwd, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "not a loopback address" in r.stderr and "--allow-remote" in r.stderr
    with pytest.raises(ValueError, match="not a loopback address"):
        BrokerConfig(http="192.0.2.1:8222").check()
    with pytest.raises(ValueError, match="needs a host and a port"):
        BrokerConfig(http="8222").check()
    # allowed with allow_remote (checked only: no test binds beyond loopback)
    BrokerConfig(http="0.0.0.0:8222", allow_remote=True).check()
    BrokerConfig(http="[::1]:8222").check()
    BrokerConfig(http="localhost:8222").check()


def test_http_port_in_use_is_a_clear_error():
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        b = Broker(BrokerConfig(bind=["tcp://127.0.0.1:0"], http=f"127.0.0.1:{port}"))
        with pytest.raises(MonitorBindError, match=f"127.0.0.1:{port}") as info:
            b.start()
        assert isinstance(info.value, OSError)


def test_in_process_broker_serves_and_stops_serving():
    with Broker(BrokerConfig(bind=["tcp://127.0.0.1:0"], http="127.0.0.1:0")) as b:
        url = b.http_url
        assert get(url + "/healthz")[0] == 200
        assert get_json(url + "/varz")["name"] == "fastbus"
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/healthz", timeout=2)


def test_stats_clients_and_watch_cli(broker):
    pubs, subs = run_workload(broker.endpoint, n=500, m=2)
    try:
        fb = [sys.executable, "-m", "fastbus"]
        r = subprocess.run([*fb, "stats", "--connect", broker.endpoint, "--clients"], capture_output=True,
                           text=True, timeout=30, cwd=tempfile.gettempdir())
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert "5 peers:" in lines
        pub_row = [line for line in lines if line.startswith("pub-1 ")]
        assert len(pub_row) == 1 and "500" in pub_row[0].split() and "127.0.0.1" in pub_row[0]
        sub_rows = [line.split() for line in lines if line.startswith("sub-")]
        assert len(sub_rows) == 4 and sum(row[5] == "500" for row in sub_rows) == 2   # msgs out
        r = subprocess.run([*fb, "stats", "--connect", broker.endpoint, "--clients", "--json"],
                           capture_output=True, text=True, timeout=30, cwd=tempfile.gettempdir())
        st = json.loads(r.stdout)
        assert sorted(p["name"] for p in st["connz"]) == ["pub-1", "sub-0", "sub-0", "sub-1", "sub-1"]
        # --watch: a header and a line a second with rates, ended by --count
        t0 = time.monotonic()
        r = subprocess.run([*fb, "stats", "--connect", broker.endpoint, "--watch", "--count", "2",
                            "--interval", "0.5"], capture_output=True, text=True, timeout=30,
                           cwd=tempfile.gettempdir())
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split()[:4] == ["time", "peers", "subs", "msg"]
        assert len(lines) == 3
        assert [line.split()[1] for line in lines[1:]] == ["5", "5"]          # peers
        assert [line.split()[2] for line in lines[1:]] == ["2", "2"]          # subscriptions
        assert 1.0 <= time.monotonic() - t0 < 20
    finally:
        close_all(pubs, subs)


# -- the web page in a real browser --------------------------------------------


class _Cells(html.parser.HTMLParser):
    """data-value of the page's tiles (id tile-*), and of each table row's
    cells (tr data-id -> {data-key: data-value})."""

    def __init__(self) -> None:
        super().__init__()
        self.tiles: dict[str, str] = {}
        self.rows: list[tuple[str, dict]] = []
        self.polls = 0
        self.health = ""
        self._in_health = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.polls = int(a.get("data-polls", 0))
        if a.get("id", "").startswith("tile-") and "data-value" in a:
            self.tiles[a["id"][5:]] = a["data-value"]
        if tag == "tr" and "data-id" in a:
            self.rows.append((a["data-id"], {}))
        if tag == "td" and self.rows and "data-key" in a:
            self.rows[-1][1][a["data-key"]] = a.get("data-value")
        self._in_health = a.get("id") == "health"

    def handle_data(self, data):
        if self._in_health:
            self.health += data
            self._in_health = False


def _chromium(browser: str, url: str, *extra: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                               f"--user-data-dir={profile}", "--virtual-time-budget=5000", *extra, url],
                              capture_output=True, text=True, timeout=90)


def test_web_page_in_headless_chromium_shows_the_numbers(broker, tmp_path):
    path = browser()
    if path is None:
        pytest.skip("no Chromium here (.ci/run installs Debian's chromium; apt-get install chromium)")
    pubs, subs = run_workload(broker.endpoint)
    try:
        wait_snapshot_after(broker.http, time.time())
        r = _chromium(path, broker.http + "/", "--dump-dom")
        assert r.returncode == 0, r.stderr[-3000:]
        page = _Cells()
        page.feed(r.stdout)
        assert page.polls >= 1, r.stdout[:3000]
        assert page.health == "ok"
        assert page.tiles["messages_in"] == str(N)
        assert page.tiles["messages_out"] == str(N * M)
        assert page.tiles["subscriptions"] == str(M)
        assert page.tiles["peers"] == str(1 + 2 * M)
        assert page.tiles["dropped"] == "0"
        assert int(page.tiles["rss_bytes"]) > 1 << 20
        peers = [cells for row_id, cells in page.rows if "role" in cells]
        assert len(peers) == 1 + 2 * M
        pub = [c for c in peers if c["name"] == "pub-1"]
        assert len(pub) == 1 and pub[0]["messages_in"] == str(N) and pub[0]["address"] == "127.0.0.1"
        assert pub[0]["publisher"] == "true"
        assert sorted(c["publisher"] for c in peers if c["name"].startswith("sub-")) == ["false"] * M + ["true"] * M
        outs = sorted(int(c["messages_out"]) for c in peers if c["name"].startswith("sub-"))
        assert outs == [0] * M + [N] * M
        top = [cells for row_id, cells in page.rows if "subscribers" in cells]
        assert top == [{"key": "t.a", "prefix": "false", "subscribers": str(M)}]
        # and a picture of it (kept under the test's tmp_path for a person to look at)
        shot = tmp_path / "monitor.png"
        r = _chromium(path, broker.http + "/", "--hide-scrollbars", "--window-size=1280,1100",
                      f"--screenshot={shot}")
        assert r.returncode == 0, r.stderr[-3000:]
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    finally:
        close_all(pubs, subs)


def test_grafana_example_uses_only_metrics_the_broker_serves(broker):
    import pathlib
    import re
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "grafana-fastbus-broker.json"
    if not path.exists():
        pytest.skip(f"{path} is not in this copy of the tests")
    dash = json.loads(path.read_text())
    used = set(re.findall(r"fastbus_broker_[a-z_]+", json.dumps(dash)))
    assert len(used) >= 8
    status, body = get(broker.http + "/metrics")
    served = {s.name for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}
    assert used <= served, used - served


def test_one_counter_ring_serves_both_sources():
    """fastbus.monitor.http.CounterRing, the ring behind a broker's
    Snapshots and each queue series: rates over the window, history from a
    cut, at most ``keep`` samples, and (for queue series) a counter that
    fell or a clock that went back starting the ring over, not a negative
    rate."""
    from fastbus.monitor.http import CounterRing, Snapshots
    ring = CounterRing(keep=5, reset_on_fall=True)
    assert ring.rates(10) == ({}, 0.0) and ring.history()["t"] == []
    for i in range(8):
        ring.add(100.0 + i, {"in": 10 * i})
    assert len(ring.history()["t"]) == 4                  # 5 samples kept: 4 rates between them
    assert ring.rates(2) == ({"in": 10.0}, 2.0)           # 107 against 105
    assert ring.rates(100) == ({"in": 10.0}, 4.0)         # the oldest kept
    assert ring.history(2) == {"t": [105.0, 106.0, 107.0], "dt": [1.0] * 3, "rates": {"in": [10.0] * 3}}
    ring.add(108.0, {"in": 5})                            # the counter fell: start over
    assert ring.rates(10) == ({"in": 0.0}, 0.0) and ring.latest[2] == {"in": 5}
    ring.add(109.0, {"in": 9})
    ring.add(108.5, {"in": 20})                           # the clock went back: start over
    assert ring.history()["t"] == []
    snaps = Snapshots(keep=3)
    snaps.publish({"in": 1}, "a")
    snaps.publish({"in": 0}, "b")                         # a broker's counters never fall: shown as 0
    assert snaps.latest[3] == "b" and snaps.rates(60)[0] == {"in": 0.0}
