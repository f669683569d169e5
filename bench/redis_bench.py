"""Publishing to Redis: fastbus's BufferedPublisher against the ways Python
users publish today, and against the server's own ceiling, in one run on one
server.

  redis-benchmark   `redis-benchmark -P 100 PUBLISH ch <20 bytes>`: a C client
                    pipelining 100 commands at a time, 50 connections; the
                    server's ceiling (needs Debian's redis-tools)
  fastbus           BufferedPublisher.publish() from one Python thread, then flush()
  BufferedRedis     seed 000's BufferedRedis: a redis-py pipeline of PUBLISH,
                    executed every 1000 messages
  redis.publish     one round trip per message

Then the subscriber: N messages queued by the server for a subscriber that
is not reading yet (output buffer limits lifted), then read as fast as it
can: fastbus's Subscriber (get_batch tuples, get_message dicts) against
redis-py's PubSub.get_message with hiredis.

Channel "ch", 20-byte messages, no subscribers (as redis-benchmark).  The
fastbus rows are BufferedPublisher with its defaults (no linger: batches
form by themselves) and with max_delay=0.2, the default before issue 13,
now an optional linger.

Then latency (--cases latency): one publisher process publishes 20-byte
messages on one channel at fixed rates (--latency-rates), each sent when it
is due (i / rate after the start; time.sleep until then), for
--latency-seconds after --warmup seconds that are not counted.  Each
payload carries time.monotonic_ns() taken at the publish call (one clock
for every process of the machine) and a sequence number.  A subscriber in
another process (redis-py PubSub.get_message, with hiredis if installed;
--latency-subscriber raw: a socket cut into fixed-size frames, no parser,
which costs the shared CPUs less) records its arrival time minus the sent
time.  Latency is thus publish call to subscriber's hand: an upper bound of
when the message reached the server.  Every case is run --latency-rounds
times and every round is reported, with the share of time some task of the
machine waited for a CPU (Linux /proc/pressure/cpu): on a small shared
machine the tails follow it.  Reported: p50, p90, p99, p99.9 and max in
microseconds, for

  fastbus           BufferedPublisher(url), the defaults: no linger
  fastbus linger    BufferedPublisher(url, max_delay=0.2): the old default
  redis.publish     redis-py Redis.publish(), one round trip per message
  BufferedRedis     seed 000's BufferedRedis as the article wrote it: a
                    redis-py pipeline() (MULTI/EXEC), executed at 1000
                    commands by publish() and every 200 ms by a thread

The server is fastbus's embedded one (the bundled Valkey unless --server
names another binary, e.g. /usr/bin/redis-server).  Every loop is bounded
by its message count and by --seconds.  Run it from outside the repository
(the source tree has no compiled extension).

    python bench/redis_bench.py --messages 1000000
    python bench/redis_bench.py --server /usr/bin/redis-server
    python bench/redis_bench.py --cases latency --latency-rates 1000,10000 --latency-rounds 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
from array import array

import redis

from fastbus.redis import BufferedPublisher, EmbeddedServer

PAYLOAD = b"x" * 20


def run_redis_benchmark(port: int, n: int) -> float | None:
    exe = shutil.which("redis-benchmark") or shutil.which("valkey-benchmark")
    if exe is None:
        return None
    out = subprocess.run([exe, "-h", "127.0.0.1", "-p", str(port), "-P", "100", "-n", str(n), "-q",
                          "PUBLISH", "ch", PAYLOAD.decode()], capture_output=True, text=True, timeout=300,
                         check=False)
    # "PUBLISH ch xxx: 1540832.00 requests per second, p50=..."
    m = re.findall(r"([\d.]+) requests per second", out.stdout.replace("\r", "\n"))
    return float(m[-1]) if m else None


def run_fastbus(url: str, n: int, limit: float, **options) -> float:
    pub = BufferedPublisher(url, **options)
    publish = pub.publish
    t0 = time.perf_counter()
    sent = 0
    while sent < n and time.perf_counter() - t0 < limit:
        for _ in range(10_000):
            publish("ch", PAYLOAD)
        sent += 10_000
    pub.flush(timeout=120)
    dt = time.perf_counter() - t0
    assert pub.stats()["published"] == sent and pub.stats()["errors"] == 0
    pub.close()
    return sent / dt


def run_buffered_redis(url: str, n: int, limit: float) -> float:
    r = redis.Redis.from_url(url)
    pipe = r.pipeline(transaction=False)
    t0 = time.perf_counter()
    sent = 0
    while sent < n and time.perf_counter() - t0 < limit:
        for _ in range(1000):
            pipe.publish("ch", PAYLOAD)
        pipe.execute()
        sent += 1000
    return sent / (time.perf_counter() - t0)


def run_plain(url: str, n: int, limit: float) -> float:
    r = redis.Redis.from_url(url)
    t0 = time.perf_counter()
    sent = 0
    while sent < n and time.perf_counter() - t0 < limit:
        for _ in range(100):
            r.publish("ch", PAYLOAD)
        sent += 100
    return sent / (time.perf_counter() - t0)


def fill(url: str, n: int) -> None:
    """Publish n messages to "sub" while the subscribers connected to it do
    not read: the server holds them (output buffer limits lifted)."""
    with BufferedPublisher(url) as pub:
        for _ in range(n):
            pub.publish("sub", PAYLOAD)


def run_subscriber_fastbus(url: str, n: int, limit: float) -> float:
    """Messages a fastbus Subscriber takes per second, as redis-py dicts
    (get_message) and as tuples (get_batch): (dicts, batch)."""
    from fastbus.redis import Subscriber
    rates = []
    for batch in (False, True):
        with Subscriber(url) as sub:
            sub.subscribe("sub")
            assert sub.get_message(timeout=5)["type"] == "subscribe"
            fill(url, n)
            got = 0
            t0 = time.perf_counter()
            if batch:
                while got < n and time.perf_counter() - t0 < limit:
                    got += len(sub.get_batch(timeout=5))
            else:
                get = sub.get_message
                while got < n and time.perf_counter() - t0 < limit:
                    if get(timeout=5) is None:
                        break
                    got += 1
            rates.append(got / (time.perf_counter() - t0))
    return tuple(rates)


def run_subscriber_redis_py(url: str, n: int, limit: float) -> float:
    r = redis.Redis.from_url(url)
    p = r.pubsub()
    p.subscribe("sub")
    assert p.get_message(timeout=5)["type"] == "subscribe"
    fill(url, n)
    got = 0
    get = p.get_message
    t0 = time.perf_counter()
    while got < n and time.perf_counter() - t0 < limit:
        if get(timeout=5) is None:
            break
        got += 1
    p.close()
    return got / (time.perf_counter() - t0)


def subscribers(url: str, n: int, limit: float, rounds: int) -> None:
    redis.Redis.from_url(url).config_set("client-output-buffer-limit", "pubsub 0 0 0")
    try:
        import hiredis
        parser = f"hiredis {hiredis.__version__}"
    except ImportError:
        parser = "no hiredis: redis-py's Python parser"
    best = {"fastbus get_batch": 0.0, "fastbus get_message": 0.0, f"redis-py PubSub.get_message ({parser})": 0.0}
    for _ in range(rounds):
        d, b = run_subscriber_fastbus(url, n, limit)
        best["fastbus get_batch"] = max(best["fastbus get_batch"], b)
        best["fastbus get_message"] = max(best["fastbus get_message"], d)
        k = f"redis-py PubSub.get_message ({parser})"
        best[k] = max(best[k], run_subscriber_redis_py(url, n, limit))
    peer = best[f"redis-py PubSub.get_message ({parser})"]
    print(f"\nSubscriber: {n:,} messages of {len(PAYLOAD)} bytes queued by the server, then read; "
          f"best of {rounds}")
    print("\n| subscriber | messages/s | / redis-py |")
    print("|---|---|---|")
    for name, rate in best.items():
        print(f"| {name} | {rate:,.0f} | {rate / peer:.1f}x |")


# -- latency ---------------------------------------------------------------------

LAT_CHANNEL = b"lat"
STAMP = struct.Struct("<qq")                 # sent time (monotonic ns), sequence number
PAD = b"." * (len(PAYLOAD) - STAMP.size)     # 20-byte messages, as above
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
LAT_CLIENTS = {
    "fastbus": "fastbus BufferedPublisher (defaults: no linger)",
    "fastbus-linger": "fastbus BufferedPublisher(max_delay=0.2) (the old default, now a linger)",
    "redis-py": "redis-py Redis.publish() per message",
    "bufferedredis": "seed 000 BufferedRedis (1000 messages or 200 ms)",
}


class SeedBufferedRedis(redis.Redis):
    """Seed 000's BufferedRedis ("A tale of two queues"): publish() adds to a
    redis-py pipeline and executes it at 1000 commands; a thread executes it
    every 200 ms.  As the article's code, with a way to stop the thread."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.buffer = self.pipeline()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self.flusher, daemon=True)
        self._flusher.start()

    def flusher(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                self.buffer.execute()
            self._stop.wait(0.2)             # the article: time.sleep(.2)

    def publish(self, *args, **kwargs):
        with self.lock:
            self.buffer.publish(*args, **kwargs)
            if len(self.buffer.command_stack) >= 1000:
                self.buffer.execute()

    def close(self) -> None:
        self._stop.set()
        self._flusher.join(5)
        with self.lock:
            self.buffer.execute()
        super().close()


def _paced(rate: float, seconds: float):
    """Sequence numbers, each yielded when it is due (i / rate after the
    start); the caller publishes between yields.  Sleeping releases the CPU
    and the GIL until the next one is due.  A client that cannot keep the
    rate stops at twice the time (the report shows the rate achieved)."""
    total = int(rate * seconds)
    start = time.monotonic_ns()
    stop = start + int(2e9 * seconds)
    interval = 1e9 / rate
    sleep = time.sleep
    now_ns = time.monotonic_ns
    for i in range(total):
        due = start + int(i * interval)
        now = now_ns()
        if now < due:
            sleep((due - now) / 1e9)
        elif now > stop:
            return
        yield i


def lat_publisher(client: str, url: str, rate: float, seconds: float, go, out) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if client == "fastbus":
        pub = BufferedPublisher(url)
    elif client == "fastbus-linger":
        pub = BufferedPublisher(url, max_delay=0.2)
    elif client == "redis-py":
        pub = redis.Redis.from_url(url)
    else:
        pub = SeedBufferedRedis.from_url(url)
    publish = pub.publish
    pack = STAMP.pack
    now_ns = time.monotonic_ns
    go.wait(60)
    sent = 0
    t0 = time.monotonic()
    for i in _paced(rate, seconds):
        publish(LAT_CHANNEL, pack(now_ns(), i) + PAD)
        sent += 1
    t1 = time.monotonic()
    pub.close()
    out.put({"sent": sent, "seconds": t1 - t0})


def lat_subscriber(url: str, warm: int, total: int, ready, path: str, limit: float, style: str) -> None:
    """Receive until every message came, or nothing came for 2 s after the
    first, or ``limit`` seconds; write the count and the latencies (ns)
    of the messages numbered ``warm`` and on to ``path``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if style == "raw":
        return _raw_subscriber(url, warm, total, ready, path, limit)
    r = redis.Redis.from_url(url)
    p = r.pubsub(ignore_subscribe_messages=True)
    p.subscribe(LAT_CHANNEL)
    while p.get_message(timeout=1.0) is not None or not p.subscribed:
        pass
    ready.set()
    lat = array("q")
    got = 0
    now_ns = time.monotonic_ns
    unpack = STAMP.unpack_from
    get = p.get_message
    end = time.monotonic() + limit
    last = None
    while got < total:
        now = time.monotonic()
        if now > end or (last is not None and now - last > 2.0):
            break
        m = get(timeout=0.2)
        if m is None:
            continue
        arrived = now_ns()
        sent, seq = unpack(m["data"])
        got += 1
        last = time.monotonic()
        if seq >= warm:
            lat.append(arrived - sent)
    p.close()
    r.close()
    with open(path, "wb") as f:
        f.write(struct.pack("<q", got))
        lat.tofile(f)


def _raw_subscriber(url: str, warm: int, total: int, ready, path: str, limit: float) -> None:
    """The same with a socket: every message on LAT_CHANNEL is the same
    RESP frame length (a 20-byte payload), so a recv is cut into frames
    with no parser; the arrival time is that of the recv."""
    import socket
    from urllib.parse import urlparse
    u = urlparse(url)
    s = socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379))
    s.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(LAT_CHANNEL), LAT_CHANNEL))
    confirm = b"*3\r\n$9\r\nsubscribe\r\n$%d\r\n%s\r\n:1\r\n" % (len(LAT_CHANNEL), LAT_CHANNEL)
    buf = b""
    s.settimeout(10)
    while len(buf) < len(confirm):
        buf += s.recv(4096)
    if not buf.startswith(confirm):
        raise SystemExit(f"raw subscriber: unexpected reply {buf[:80]!r}")
    buf = buf[len(confirm):]
    head = b"*3\r\n$7\r\nmessage\r\n$%d\r\n%s\r\n$%d\r\n" % (len(LAT_CHANNEL), LAT_CHANNEL, len(PAYLOAD))
    frame = len(head) + len(PAYLOAD) + 2
    ready.set()
    lat = array("q")
    got = 0
    now_ns = time.monotonic_ns
    unpack = STAMP.unpack_from
    end = time.monotonic() + limit
    s.settimeout(0.2)
    last = None
    while got < total:
        now = time.monotonic()
        if now > end or (last is not None and now - last > 2.0):
            break
        try:
            chunk = s.recv(1 << 16)
        except TimeoutError:
            continue
        arrived = now_ns()
        if not chunk:
            break
        buf += chunk
        last = time.monotonic()
        k = 0
        while len(buf) - k >= frame:
            if buf[k:k + len(head)] != head:
                raise SystemExit(f"raw subscriber: unexpected frame {buf[k:k + 80]!r}")
            sent, seq = unpack(buf, k + len(head))
            got += 1
            if seq >= warm:
                lat.append(arrived - sent)
            k += frame
        buf = buf[k:]
    s.close()
    with open(path, "wb") as f:
        f.write(struct.pack("<q", got))
        lat.tofile(f)


def percentiles(lat_ns: array) -> dict:
    """Nearest-rank percentiles and the max, in microseconds."""
    if not lat_ns:
        return {}
    a = sorted(lat_ns)
    out = {f"p{p:g}": a[min(len(a) - 1, max(0, int(-(-p * len(a) // 100)) - 1))] / 1e3 for p in PERCENTILES}
    out["max"] = a[-1] / 1e3
    return out


def run_latency_case(url: str, client: str, rate: float, seconds: float, warmup: float, style: str) -> dict:
    ctx = mp.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    out = ctx.Queue()
    fd, path = tempfile.mkstemp(prefix="redis-latency-")
    os.close(fd)
    total = int(rate * (seconds + warmup))
    limit = seconds + warmup + 30.0
    sub = ctx.Process(target=lat_subscriber, args=(url, int(rate * warmup), total, ready, path, limit, style))
    pub = ctx.Process(target=lat_publisher, args=(client, url, rate, seconds + warmup, go, out))
    try:
        sub.start()
        if not ready.wait(60):
            raise SystemExit(f"latency {client}: the subscriber did not start")
        pub.start()
        time.sleep(0.5)                      # the publisher connects
        go.set()
        res = out.get(timeout=limit + 60)
        pub.join(30)
        sub.join(limit + 10)
        with open(path, "rb") as f:
            received = struct.unpack("<q", f.read(8))[0]
            lat = array("q")
            lat.frombytes(f.read())
        return {"client": client, "rate": rate, "sent": res["sent"], "received": received,
                "achieved": res["sent"] / res["seconds"] if res["seconds"] else 0.0, "measured": len(lat),
                **percentiles(lat)}
    finally:
        for proc in (pub, sub):
            if proc.pid is not None and proc.is_alive():
                proc.terminate()
                proc.join(5)
        os.unlink(path)


def _cpu_wait_us() -> int | None:
    """Linux pressure stall information: microseconds in which some task
    waited for a CPU (None where /proc/pressure is missing)."""
    try:
        with open("/proc/pressure/cpu") as f:
            line = f.readline()              # some avg10=... avg60=... avg300=... total=N
        return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def latency(url: str, rates: list[float], clients: list[str], seconds: float, warmup: float,
            style: str = "redis-py", rounds: int = 1) -> list[dict]:
    """Every client at every rate, ``rounds`` times, the clients of a rate
    one after the other in each round (a round compares them under the
    same conditions); every round is reported, none picked."""
    if style == "raw":
        how = "a socket reader in another process (fixed-size frames, no parser)"
    else:
        try:
            import hiredis
            parser = f"hiredis {hiredis.__version__}"
        except ImportError:
            parser = "no hiredis: redis-py's Python parser"
        how = f"a redis-py PubSub.get_message ({parser}) subscriber in another process"
    print(f"\nLatency: one publisher process at a fixed rate, {len(PAYLOAD)}-byte messages, {seconds:g} s "
          f"measured after {warmup:g} s of warm-up; {how}; publish call to subscriber's hand, microseconds. "
          f"cpu wait: share of the case's time in which some task of the machine waited for a CPU "
          f"(/proc/pressure/cpu; the machine's other users show here)")
    results = []
    for rnd in range(rounds):
        for rate in rates:
            for c in clients:
                w0, t0 = _cpu_wait_us(), time.monotonic()
                r = run_latency_case(url, c, rate, seconds, warmup, style)
                w1, t1 = _cpu_wait_us(), time.monotonic()
                r["round"] = rnd + 1
                r["cpu_wait"] = None if w0 is None or w1 is None else (w1 - w0) / 1e6 / (t1 - t0)
                results.append(r)
    print("\n| round | offered | client | p50 | p90 | p99 | p99.9 | max | achieved/s | received | cpu wait "
          "| p99 / fastbus |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        fb = next((x for x in results if x["client"] == "fastbus" and x["rate"] == r["rate"]
                   and x["round"] == r["round"]), None)
        ratio = f"{r['p99'] / fb['p99']:.1f}x" if fb and fb.get("p99") and r.get("p99") and r is not fb else ""
        cells = " | ".join(f"{r[k]:,.0f}" if k in r else "-" for k in ("p50", "p90", "p99", "p99.9", "max"))
        recv = "all" if r["received"] == r["sent"] else f"{r['received']:,}/{r['sent']:,}"
        wait = "-" if r["cpu_wait"] is None else f"{100 * r['cpu_wait']:.0f}%"
        print(f"| {r['round']} | {r['rate']:,.0f}/s | {LAT_CLIENTS[r['client']]} | {cells} | {r['achieved']:,.0f} "
              f"| {recv} | {wait} | {ratio} |")
    for rate in rates:
        p99s = [r["p99"] for r in results if r["client"] == "fastbus" and r["rate"] == rate and "p99" in r]
        if p99s:
            met = sum(p <= 1000 for p in p99s)
            print(f"fastbus (defaults) at {rate:,.0f}/s: p99 {', '.join(f'{p:,.0f}' for p in p99s)} us; "
                  f"target p99 <= 1,000 us publish to subscriber met in {met} of {len(p99s)} rounds")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=30.0, help="time limit per measurement")
    ap.add_argument("--server", help="server binary (default: fastbus's embedded default)")
    ap.add_argument("--rounds", type=int, default=3, help="best of this many rounds per client")
    ap.add_argument("--subscriber-messages", type=int, default=500_000,
                    help="messages for the subscriber benchmark (0: skip it)")
    ap.add_argument("--cases", default="publish,subscribe,latency",
                    help="comma-separated, of: publish (throughput), subscribe, latency (default: %(default)s)")
    ap.add_argument("--latency-rates", default="1000,10000",
                    help="messages per second offered in the latency case, comma-separated (default: %(default)s)")
    ap.add_argument("--latency-clients", default=",".join(LAT_CLIENTS),
                    help="comma-separated, of: " + ", ".join(LAT_CLIENTS) + " (default: all)")
    ap.add_argument("--latency-subscriber", choices=("redis-py", "raw"), default="redis-py",
                    help="the subscriber that records arrivals: redis-py PubSub.get_message, or a socket cut "
                         "into fixed-size frames with no parser (default: %(default)s)")
    ap.add_argument("--latency-rounds", type=int, default=1,
                    help="run every latency case this many times, each reported (default: %(default)s)")
    ap.add_argument("--latency-seconds", type=float, default=3.0,
                    help="measured seconds per latency case (default: %(default)s)")
    ap.add_argument("--warmup", type=float, default=0.5,
                    help="seconds of messages not counted at the start of a latency case (default: %(default)s)")
    args = ap.parse_args()
    cases = {c for c in args.cases.split(",") if c}
    if not cases or cases - {"publish", "subscribe", "latency"}:
        raise SystemExit(f"--cases: publish, subscribe and/or latency, not {args.cases!r}")
    rates = [float(x) for x in args.latency_rates.split(",") if x]
    if "latency" in cases and (not rates or not all(1 <= x <= 200_000 for x in rates)):
        raise SystemExit("--latency-rates must be between 1 and 200,000 messages per second")
    clients = [c for c in args.latency_clients.split(",") if c]
    if not clients or set(clients) - set(LAT_CLIENTS):
        raise SystemExit(f"--latency-clients: of {', '.join(LAT_CLIENTS)}, not {args.latency_clients!r}")
    if not 1 <= args.latency_rounds <= 20:
        raise SystemExit("--latency-rounds must be between 1 and 20")
    if not 0 < args.latency_seconds <= 60 or not 0 <= args.warmup <= 10:
        raise SystemExit("--latency-seconds must be between 0 and 60, --warmup between 0 and 10")
    if not 0 < args.messages <= 100_000_000:
        raise SystemExit("--messages must be between 1 and 100,000,000")
    if not 0 <= args.subscriber_messages <= 10_000_000:
        raise SystemExit("--subscriber-messages must be between 0 and 10,000,000")
    with EmbeddedServer(args.server) as srv:
        print(f"server: {srv.server_name} {srv.version} ({srv.binary})" +
              (f"; {args.messages:,} messages of {len(PAYLOAD)} bytes; best of {args.rounds}"
               if "publish" in cases else ""))
        rows = {}
        for _ in range(args.rounds if "publish" in cases else 0):
            for name, fn in (("redis-benchmark -P 100", lambda: run_redis_benchmark(srv.port, args.messages)),
                             ("fastbus BufferedPublisher", lambda: run_fastbus(srv.url, args.messages,
                                                                               args.seconds)),
                             ("fastbus BufferedPublisher(max_delay=0.2)",
                              lambda: run_fastbus(srv.url, args.messages, args.seconds, max_delay=0.2)),
                             ("seed BufferedRedis (pipeline of 1000)",
                              lambda: run_buffered_redis(srv.url, min(args.messages, 300_000), args.seconds)),
                             ("redis.publish", lambda: run_plain(srv.url, min(args.messages, 30_000),
                                                                 args.seconds))):
                rate = fn()
                if rate is not None:
                    rows[name] = max(rows.get(name, 0.0), rate)
        if rows:
            publishing_table(rows)
        if args.subscriber_messages and "subscribe" in cases:
            subscribers(srv.url, args.subscriber_messages, args.seconds, args.rounds)
        if "latency" in cases:
            latency(srv.url, rates, clients, args.latency_seconds, args.warmup, args.latency_subscriber,
                    args.latency_rounds)


def publishing_table(rows: dict) -> None:
    ceiling = rows.get("redis-benchmark -P 100")
    fb = rows["fastbus BufferedPublisher"]
    print("\n| client | messages/s | fastbus / this |")
    print("|---|---|---|")
    for name, rate in rows.items():
        print(f"| {name} | {rate:,.0f} | {fb / rate:.2f}x |")
    if ceiling:
        for name in ("fastbus BufferedPublisher", "fastbus BufferedPublisher(max_delay=0.2)"):
            print(f"{name} at {100 * rows[name] / ceiling:.0f}% of redis-benchmark -P 100 (target: >= 80%)")
    else:
        print("\nredis-benchmark not found (apt-get install redis-tools): no ceiling measured")


if __name__ == "__main__":
    main()
