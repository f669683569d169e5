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
server is fastbus's embedded one (the bundled Valkey unless --server names
another binary, e.g. /usr/bin/redis-server).  Every loop is bounded by its
message count and by --seconds.

    python bench/redis_bench.py --messages 1000000
    python bench/redis_bench.py --server /usr/bin/redis-server
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import time

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


def run_fastbus(url: str, n: int, limit: float) -> float:
    pub = BufferedPublisher(url)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=30.0, help="time limit per measurement")
    ap.add_argument("--server", help="server binary (default: fastbus's embedded default)")
    ap.add_argument("--rounds", type=int, default=3, help="best of this many rounds per client")
    ap.add_argument("--subscriber-messages", type=int, default=500_000,
                    help="messages for the subscriber benchmark (0: skip it)")
    args = ap.parse_args()
    if not 0 < args.messages <= 100_000_000:
        raise SystemExit("--messages must be between 1 and 100,000,000")
    if not 0 <= args.subscriber_messages <= 10_000_000:
        raise SystemExit("--subscriber-messages must be between 0 and 10,000,000")
    with EmbeddedServer(args.server) as srv:
        print(f"server: {srv.server_name} {srv.version} ({srv.binary}); {args.messages:,} messages of "
              f"{len(PAYLOAD)} bytes; best of {args.rounds}")
        rows = {}
        for _ in range(args.rounds):
            for name, fn in (("redis-benchmark -P 100", lambda: run_redis_benchmark(srv.port, args.messages)),
                             ("fastbus BufferedPublisher", lambda: run_fastbus(srv.url, args.messages,
                                                                               args.seconds)),
                             ("seed BufferedRedis (pipeline of 1000)",
                              lambda: run_buffered_redis(srv.url, min(args.messages, 300_000), args.seconds)),
                             ("redis.publish", lambda: run_plain(srv.url, min(args.messages, 30_000),
                                                                 args.seconds))):
                rate = fn()
                if rate is not None:
                    rows[name] = max(rows.get(name, 0.0), rate)
        if args.subscriber_messages:
            subscribers(srv.url, args.subscriber_messages, args.seconds, args.rounds)
    ceiling = rows.get("redis-benchmark -P 100")
    fb = rows["fastbus BufferedPublisher"]
    print("\n| client | messages/s | fastbus / this |")
    print("|---|---|---|")
    for name, rate in rows.items():
        print(f"| {name} | {rate:,.0f} | {fb / rate:.2f}x |")
    if ceiling:
        print(f"\nfastbus at {100 * fb / ceiling:.0f}% of redis-benchmark -P 100 (target: >= 80%)")
    else:
        print("\nredis-benchmark not found (apt-get install redis-tools): no ceiling measured")


if __name__ == "__main__":
    main()
