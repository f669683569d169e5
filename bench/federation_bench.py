"""What crossing a federation link costs the downstream broker: messages
published at a downstream broker B for a subscriber at its upstream broker
A (``--direction up``), or at A for a subscriber at B (``down``), and B's
CPU per message (from /proc) while they cross.

    up:    publisher --PUB--> B --[PUB, batch] on its DEALER--> A --DATA--> subscriber
    down:  publisher --PUB--> A --[DATA, seq, batch]--> B's DEALER; B --DATA--> subscriber

The publisher sends ``--messages`` 20-byte messages on 50 channels (each
on a random one of them), flat out or at ``--rate`` messages/s (each when
due, so one that falls behind sends back to back); the subscriber takes
them with ``get_batch()``.  At a rate, each message carries its send time
and the latency from publish() to the subscriber's hand is reported as
percentiles.  Every count and wait is bounded (``--seconds``).  Both
brokers are ``python -m fastbus broker`` of the interpreter running this,
so to compare two builds run it with each interpreter in turn,
alternating (the machine's noise hits each alike):

    python bench/federation_bench.py --messages 500000 --runs 3
    python bench/federation_bench.py --messages 5000 --rate 1000 --runs 3
    python bench/federation_bench.py --direction down --messages 60000 --rate 20000 --runs 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import cpu_seconds, free_port  # noqa: E402

CHANNELS = [f"fed.{i}" for i in range(50)]
PAYLOAD = b"x" * 20


def broker(port: int, *args: str) -> subprocess.Popen:
    endpoint = f"tcp://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "fastbus", "broker", "--bind", endpoint, "--log-level",
                             "WARNING", "--stats-interval", "0", "--max-queue-bytes", str(8 << 30), *args],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
    from fastbus.client import query_stats
    deadline = time.monotonic() + 20
    while True:
        try:
            query_stats(endpoint, timeout=0.3)
            return proc
        except TimeoutError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log.seek(0)
                raise SystemExit(f"broker did not start: {log.read().decode()[-2000:]}") from None
            time.sleep(0.05)


def publisher(endpoint: str, n: int, rate: float, go, done) -> None:
    import fastbus
    rnd = random.Random(1)
    chans = [rnd.choice(CHANNELS) for _ in range(4096)]
    with fastbus.Client(endpoint=endpoint) as c:
        go.wait(30)
        pub = c.publish
        if not rate:
            for i in range(n):
                pub(chans[i & 4095], PAYLOAD)
        else:
            now, step = time.monotonic, 1.0 / rate
            due = now()
            for i in range(n):
                while (early := due - now()) > 0:
                    time.sleep(early if early > 0.0005 else 0)     # the last half millisecond: spin
                pub(chans[i & 4095], time.monotonic_ns().to_bytes(8, "little") + PAYLOAD[8:])
                due += step
        c.flush()
        done.set()


def take(p, n: int, rate: float, end: float) -> tuple[int, list[int]]:
    """Take up to n messages with get_batch() until ``end`` (monotonic):
    (how many, their latencies in ns where paced: each carries its send
    time)."""
    got = 0
    lat: list[int] = []
    while got < n and time.monotonic() < end:
        batch = p.get_batch(max_messages=10000, timeout=0.2)
        if rate:
            t = time.monotonic_ns()
            lat.extend(t - int.from_bytes(data[:8], "little") for _ch, data in batch)
        got += len(batch)
    return got, lat


def latency_text(lat: list[int]) -> str:
    """"; latency p50 / p99 / p99.9 ... µs", or "" when not paced."""
    if not lat:
        return ""
    lat.sort()
    pct = [lat[min(len(lat) - 1, int(q * len(lat)))] / 1000 for q in (0.5, 0.99, 0.999)]
    return "; latency p50 / p99 / p99.9 {:,.0f} / {:,.0f} / {:,.0f} µs".format(*pct)


def summary(rates: list[float], costs: list[float], whose: str) -> str:
    return (f"{len(rates)} runs: msg/s min / median / max {min(rates):,.0f} / {statistics.median(rates):,.0f} / "
            f"{max(rates):,.0f}; {whose} CPU-µs per message {min(costs):.2f} / {statistics.median(costs):.2f} / "
            f"{max(costs):.2f}")


def one_run(n: int, seconds: float, rate: float, down: bool = False) -> tuple[float, float, int, list[int]]:
    """(messages/s delivered, B's CPU µs per message, messages received,
    latencies in ns where paced)."""
    import fastbus
    pa, pb = free_port(), free_port()
    a = broker(pa, "--allow-broker", "127.0.0.1")
    b = broker(pb, "--upstream", f"tcp://127.0.0.1:{pa}")
    try:
        sub_at, pub_at = (f"tcp://127.0.0.1:{pb}", f"tcp://127.0.0.1:{pa}") if down else \
            (f"tcp://127.0.0.1:{pa}", f"tcp://127.0.0.1:{pb}")
        with fastbus.Client(endpoint=sub_at) as sub_client, fastbus.Client(endpoint=pub_at) as probe:
            p = sub_client.pubsub(ignore_subscribe_messages=True)
            p.subscribe(*CHANNELS)
            deadline = time.monotonic() + 20
            while not (probe.stats()["filter_active"] and all(probe.is_wanted(ch) for ch in CHANNELS)):
                # (until the subscriptions reached the publishers' broker's publishers)
                if time.monotonic() > deadline:
                    raise SystemExit("the subscriptions did not reach the downstream broker")
                probe.publish(CHANNELS[0], b"warm-up")
                time.sleep(0.05)
            while p.get_batch(timeout=0.2):                          # warm-up messages
                pass
            go, done = mp.Event(), mp.Event()
            proc = mp.Process(target=publisher, args=(pub_at, n, rate, go, done))
            proc.start()
            time.sleep(1.0)                                          # its client connected and filtering
            c0, t0 = cpu_seconds(b.pid), time.monotonic()
            go.set()
            got, lat = take(p, n, rate, t0 + seconds)
            t1, c1 = time.monotonic(), cpu_seconds(b.pid)
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
            return got / (t1 - t0), (c1 - c0) / max(got, 1) * 1e6, got, lat
    finally:
        for proc in (b, a):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=500_000, help="messages per run (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=30.0, help="at most this long per run (default %(default)s)")
    ap.add_argument("--runs", type=int, default=3, help="runs (default %(default)s)")
    ap.add_argument("--rate", type=float, default=0, help="messages/s, paced (default: flat out)")
    ap.add_argument("--direction", choices=("up", "down"), default="up",
                    help="up: published at the downstream broker; down: at the upstream (default %(default)s)")
    args = ap.parse_args(argv)
    if not 1000 <= args.messages <= 10_000_000 or not 1 <= args.seconds <= 300 or not 1 <= args.runs <= 20 \
            or not 0 <= args.rate <= 1_000_000:
        ap.error("--messages 1000..10000000, --seconds 1..300, --runs 1..20, --rate 0..1000000")
    rates, costs = [], []
    for _ in range(args.runs):
        rate, cost, got, lat = one_run(args.messages, args.seconds, args.rate, args.direction == "down")
        rates.append(rate)
        costs.append(cost)
        print(f"{got:,} of {args.messages:,} delivered: {rate:,.0f} msg/s; downstream broker {cost:.2f} CPU-µs "
              f"per message{latency_text(lat)}", flush=True)
    print(summary(rates, costs, "downstream broker"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
