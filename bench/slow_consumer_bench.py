"""What a slow subscriber costs the broker and everybody else: a publisher
process sends 20-byte messages on 50 channels (each on a random one of
them) at ``--rate`` messages/s (each when due, so one that falls behind
sends back to back) or flat out; a healthy subscriber takes them with
``get_batch()`` (latency from publish() to its hand as percentiles when
paced); ``--stuck`` subscribers on the same channels never read, so the
broker queues for each of them up to ``--max-queue-bytes`` and then drops
their oldest batches (``--slow-policy drop``, flow control off: the steady
state of a stuck consumer, not a pause).  Reported: the broker's CPU per
message delivered to the healthy subscriber (from /proc), the messages
the stuck ones lost, the healthy one's latency.  With ``--stuck 0`` the
same run without them.  The broker is ``python -m fastbus broker`` of the
interpreter running this, so to compare two builds run it with each in
turn, alternating:

    python bench/slow_consumer_bench.py --messages 300000 --runs 3
    python bench/slow_consumer_bench.py --messages 60000 --rate 20000 --runs 3
    python bench/slow_consumer_bench.py --messages 60000 --rate 20000 --stuck 0 --runs 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from federation_bench import CHANNELS, broker, latency_text, publisher, summary, take  # noqa: E402
from servers import cpu_seconds, free_port  # noqa: E402


def stuck_subscriber(ctx: zmq.Context, endpoint: str, i: int) -> zmq.Socket:
    """A session that subscribes to every channel and never reads (its
    pipe, and then the broker's queue for it, fill up)."""
    from fastbus import SUBSCRIBE
    from fastbus import protocol as P
    s = ctx.socket(zmq.DEALER)
    s.rcvhwm = 1
    s.rcvbuf = 65536
    s.linger = 0
    s.connect(endpoint)
    s.send_multipart([P.HELLO, P.dump_json({"v": P.VERSION, "role": "client", "name": f"stuck-{i}"})])
    s.send_multipart([P.SUB, P.pack_u64(1), P.encode_ops([(SUBSCRIBE, ch.encode(), False) for ch in CHANNELS])])
    return s


def one_run(n: int, seconds: float, rate: float, stuck: int, max_queue: int) -> tuple:
    """(messages/s delivered, the broker's CPU µs per message, delivered,
    lost by the stuck subscribers, latencies in ns where paced)."""
    import fastbus
    from fastbus.client import query_stats
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    b = broker(port, "--max-queue-bytes", str(max_queue), "--slow-policy", "drop", "--flow-pause-bytes", "0")
    # (broker() passes a --max-queue-bytes of its own first; this one, later, wins)
    ctx = zmq.Context()
    socks = []
    try:
        with fastbus.Client(endpoint=endpoint) as sub_client, fastbus.Client(endpoint=endpoint) as probe:
            p = sub_client.pubsub(ignore_subscribe_messages=True)
            p.subscribe(*CHANNELS)
            socks = [stuck_subscriber(ctx, endpoint, i) for i in range(stuck)]
            deadline = time.monotonic() + 20
            while not (probe.stats()["filter_active"] and all(probe.is_wanted(ch) for ch in CHANNELS)):
                if time.monotonic() > deadline:
                    raise SystemExit("the subscriptions did not reach the publisher")
                time.sleep(0.05)
            while query_stats(endpoint)["subscriptions"] < len(CHANNELS) * (stuck + 1):
                if time.monotonic() > deadline:
                    raise SystemExit("the stuck subscribers did not subscribe")
                time.sleep(0.05)
            go, done = mp.Event(), mp.Event()
            proc = mp.Process(target=publisher, args=(endpoint, n, rate, go, done))
            proc.start()
            time.sleep(1.0)                                          # its client connected and filtering
            before = query_stats(endpoint)["drops"]["slow_consumer"]
            c0, t0 = cpu_seconds(b.pid), time.monotonic()
            go.set()
            got, lat = take(p, n, rate, t0 + seconds)
            t1, c1 = time.monotonic(), cpu_seconds(b.pid)
            lost = query_stats(endpoint)["drops"]["slow_consumer"] - before
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
            return got / (t1 - t0), (c1 - c0) / max(got, 1) * 1e6, got, lost, lat
    finally:
        for s in socks:
            s.close()
        ctx.term()
        b.terminate()
        try:
            b.wait(10)
        except Exception:
            b.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=300_000, help="messages per run (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=30.0, help="at most this long per run (default %(default)s)")
    ap.add_argument("--runs", type=int, default=3, help="runs (default %(default)s)")
    ap.add_argument("--rate", type=float, default=0, help="messages/s, paced (default: flat out)")
    ap.add_argument("--stuck", type=int, default=2, help="subscribers that never read (default %(default)s)")
    ap.add_argument("--max-queue-bytes", type=int, default=4 << 20,
                    help="the broker's queue bound per subscriber (default %(default)s)")
    args = ap.parse_args(argv)
    if not 1000 <= args.messages <= 10_000_000 or not 1 <= args.seconds <= 300 or not 1 <= args.runs <= 20 \
            or not 0 <= args.rate <= 1_000_000 or not 0 <= args.stuck <= 100 \
            or not 1 << 16 <= args.max_queue_bytes <= 1 << 30:
        ap.error("--messages 1000..10000000, --seconds 1..300, --runs 1..20, --rate 0..1000000, --stuck 0..100, "
                 "--max-queue-bytes 64 KiB..1 GiB")
    rates, costs = [], []
    for _ in range(args.runs):
        rate, cost, got, lost, lat = one_run(args.messages, args.seconds, args.rate, args.stuck,
                                             args.max_queue_bytes)
        rates.append(rate)
        costs.append(cost)
        print(f"{got:,} of {args.messages:,} delivered: {rate:,.0f} msg/s; broker {cost:.2f} CPU-µs per message; "
              f"{args.stuck} stuck subscribers lost {lost:,}{latency_text(lat)}", flush=True)
    print(summary(rates, costs, "broker"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
