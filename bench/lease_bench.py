"""What filtering publishers cost the broker while nothing is delivered: the
broker process's CPU (from /proc) while N publisher clients each publish a
message nobody wants every 20 ms.  Each publisher then filters under a lease
from the broker (docs/PROTOCOL.md, "Publisher-side filtering", step 2) and
renews it with a lease ping about ten to twenty times a second, which is
most of what the broker has to do: the figure is the price of the leases.

With ``--kind subscribers``, the clients are idle subscribers instead
(each subscribed to a channel of its own, nothing published): what is
left is their liveness pings, one a ``ping_interval`` (1 s) each.

Run it with the interpreter of the fastbus to measure; the broker is that
fastbus's ``python -m fastbus broker``.  To compare two builds, run it with
each interpreter in turn, alternating (the machine's noise hits each alike):

    python bench/lease_bench.py --publishers 100 --seconds 5 --runs 3
    python bench/lease_bench.py --kind subscribers --publishers 100 --ping-interval 0.05 --seconds 5 --runs 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import Server, cpu_seconds  # noqa: E402

PROCS = 4                      # publisher processes (the clients are spread over them)
INTERVAL = 0.02                # seconds between two messages of one publisher


def publishers(endpoint: str, n: int, seconds: float, ready, first: int = 0, idle: bool = False,
               ping_interval: float = 1.0) -> None:
    import fastbus
    clients = [fastbus.Client(endpoint=endpoint, ping_interval=ping_interval) for _ in range(n)]
    if idle:
        subs = [c.pubsub() for c in clients]
        for i, p in enumerate(subs):
            p.subscribe(f"idle.{first + i}")
    ready.put(1)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if idle:
            time.sleep(0.1)
            continue
        for c in clients:
            c.publish("nobody-wants-this", b"x")
        time.sleep(INTERVAL)
    for c in clients:
        c.close()


def one_run(n: int, seconds: float, idle: bool = False, ping_interval: float = 1.0) -> tuple[float, dict]:
    """The broker's CPU (share of one core) over ``seconds`` of the steady
    state, and its counters."""
    import fastbus
    server = Server("fastbus")
    try:
        with fastbus.Client(endpoint=server.endpoint) as client:
            p = client.pubsub()
            p.subscribe("wanted")          # a subscription: the publishers get a view, and filter
            ready: mp.Queue = mp.Queue()
            per = [n // PROCS + (1 if i < n % PROCS else 0) for i in range(PROCS)]
            procs = [mp.Process(target=publishers, args=(server.endpoint, k, seconds + 3.0, ready, sum(per[:i]), idle,
                                                                  ping_interval))
                     for i, k in enumerate(per) if k]
            for proc in procs:
                proc.start()
            for _ in procs:
                ready.get(timeout=60)
            time.sleep(1.5)                # every publisher filtering
            s0 = client.broker_stats()
            c0, t0 = cpu_seconds(server.proc.pid), time.monotonic()
            time.sleep(seconds)
            c1, t1 = cpu_seconds(server.proc.pid), time.monotonic()
            stats = client.broker_stats()
            stats["control_in"] -= s0["control_in"]           # over the measured seconds
            stats["messages_in"] -= s0["messages_in"]
            for proc in procs:
                proc.join(timeout=seconds + 30)
                if proc.is_alive():
                    proc.kill()
            return (c1 - c0) / (t1 - t0), stats
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--publishers", type=int, default=100, help="clients (default %(default)s)")
    ap.add_argument("--kind", choices=("publishers", "subscribers"), default="publishers",
                    help="filtering publishers, or idle subscribers (default %(default)s)")
    ap.add_argument("--ping-interval", type=float, default=1.0,
                    help="the clients' ping_interval, seconds (default %(default)s, the client's)")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run (default %(default)s)")
    ap.add_argument("--runs", type=int, default=3, help="runs (default %(default)s)")
    args = ap.parse_args(argv)
    if not 1 <= args.publishers <= 1000 or not 0.5 <= args.seconds <= 120 or not 1 <= args.runs <= 50:
        ap.error("--publishers 1..1000, --seconds 0.5..120, --runs 1..50")
    shares = []
    for _ in range(args.runs):
        share, stats = one_run(args.publishers, args.seconds, args.kind == "subscribers", args.ping_interval)
        shares.append(share)
        print(f"broker CPU {100 * share:.1f}% of a core; control messages {stats['control_in']} "
              f"({stats['control_in'] / args.seconds:,.0f}/s), messages in {stats['messages_in']}", flush=True)
    what = "filtering publishers" if args.kind == "publishers" else "idle subscribers"
    print(f"{args.publishers} {what}, {args.runs} runs of {args.seconds:g} s: broker CPU "
          f"min / median / max {100 * min(shares):.1f} / {100 * statistics.median(shares):.1f} / "
          f"{100 * max(shares):.1f}% of a core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
