"""What surviving a broker restart costs: fastbus with ``--journal``
against the same broker without it, and NATS JetStream (file storage), the
durable peer, in one run.

One publisher process sends ``--count`` messages (JetStream
``--jetstream-count``) of ``--size`` bytes as
fast as its client lets it, each acknowledged by the server before the
publisher counts it done: fastbus's ``publish()`` and a final ``flush()``
(which returns once the broker's TOOK covers everything: with a journal,
once it is written), JetStream's ``js.publish`` (a PubAck each, at most
``--window`` in flight).  One subscriber process takes them: fastbus's
``get_batch()``, JetStream's durable pull consumer (``fetch`` of
``--batch``, ack policy none, as fastbus's subscriber acknowledges in bulk
with TAKEN).  Reported: delivered msg/s at the subscriber (its first
message to its last), the publisher's acknowledged msg/s, and the ratios
against fastbus without the journal, in the same run.  Systems alternate
over ``--rounds``; every server on loopback, stopped by its own pid.

    python bench/journal_bench.py
    python bench/journal_bench.py --systems fastbus,fastbus-journal --rounds 3 --count 2000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import Server  # noqa: E402

SYSTEMS = ("fastbus", "fastbus-journal", "fastbus-journal-always", "jetstream")
SUBJECT = "bench"


def subscriber(system: str, server: dict, count: int, ready, out) -> None:
    """Take ``count`` messages; put (first, last, received) monotonic times."""
    if system == "jetstream":
        async def run() -> tuple:
            import nats
            from nats.js.api import AckPolicy, ConsumerConfig
            nc = await nats.connect(f"nats://127.0.0.1:{server['port']}")
            js = nc.jetstream()
            psub = await js.pull_subscribe(SUBJECT, durable="bench", config=ConsumerConfig(ack_policy=AckPolicy.NONE))
            ready.set()
            got, first = 0, None
            deadline = time.monotonic() + 300
            while got < count and time.monotonic() < deadline:
                try:
                    msgs = await psub.fetch(batch=1000, timeout=2)
                except Exception:          # noqa: BLE001 - a fetch that found nothing yet
                    continue
                if first is None and msgs:
                    first = time.monotonic()
                got += len(msgs)
            last = time.monotonic()
            await nc.close()
            return first, last, got
        out.put(asyncio.run(run()))
        return
    import fastbus
    with fastbus.Client(server["endpoint"]) as c:
        p = c.pubsub()
        p.subscribe(SUBJECT)
        ready.set()
        got, first = 0, None
        deadline = time.monotonic() + 300
        while got < count and time.monotonic() < deadline:
            batch = p.get_batch(timeout=2)
            if batch and first is None:
                first = time.monotonic()
            got += len(batch)
        out.put((first, time.monotonic(), got))
        p.close()


def publisher(system: str, server: dict, count: int, size: int, window: int, out) -> None:
    payload = b"x" * size
    if system == "jetstream":
        async def run() -> float:
            import nats
            nc = await nats.connect(f"nats://127.0.0.1:{server['port']}")
            js = nc.jetstream()
            t0 = time.monotonic()
            pending: list = []
            for _ in range(count):
                pending.append(asyncio.ensure_future(js.publish(SUBJECT, payload)))
                if len(pending) >= window:
                    await asyncio.gather(*pending)
                    pending = []
            await asyncio.gather(*pending)
            t1 = time.monotonic()
            await nc.close()
            return t1 - t0
        out.put(asyncio.run(run()))
        return
    import fastbus
    with fastbus.Client(server["endpoint"]) as c:
        t0 = time.monotonic()
        for _ in range(count):
            c.publish(SUBJECT, payload)
        c.flush(timeout=300)
        out.put(time.monotonic() - t0)


def run_case(system: str, args) -> dict:
    count = args.jetstream_count if system == "jetstream" else args.count
    srv = Server(system, lossless=True)
    try:
        info = srv.info
        if system == "jetstream":
            async def stream() -> None:
                import nats
                from nats.js.api import StorageType, StreamConfig
                nc = await nats.connect(f"nats://127.0.0.1:{srv.port}")
                await nc.jetstream().add_stream(StreamConfig(name="BENCH", subjects=[SUBJECT],
                                                             storage=StorageType.FILE))
                await nc.close()
            asyncio.run(stream())
        ctx = mp.get_context("spawn")
        ready, subq, pubq = ctx.Event(), ctx.Queue(), ctx.Queue()
        sub = ctx.Process(target=subscriber, args=(system, info, count, ready, subq))
        sub.start()
        if not ready.wait(30):
            raise RuntimeError("the subscriber did not start")
        time.sleep(0.5)                       # (fastbus: the publisher learns who subscribes)
        pub = ctx.Process(target=publisher, args=(system, info, count, args.size, args.window, pubq))
        pub.start()
        pub_s = pubq.get(timeout=400)
        first, last, got = subq.get(timeout=400)
        pub.join(30)
        sub.join(30)
        span = (last - first) if first is not None else 0.0
        return {"system": system, "count": count, "received": got,
                "delivered_per_s": got / span if span else 0.0, "acked_per_s": count / pub_s if pub_s else 0.0}
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, of: " + ", ".join(SYSTEMS))
    ap.add_argument("--count", type=int, default=1_000_000, help="messages per case (default: %(default)s)")
    ap.add_argument("--jetstream-count", type=int, default=100_000,
                    help="messages per JetStream case (it is ~100x slower: a rate over fewer; default: %(default)s)")
    ap.add_argument("--size", type=int, default=20, help="payload bytes (default: %(default)s)")
    ap.add_argument("--window", type=int, default=2000,
                    help="JetStream publishes in flight, awaiting their PubAck (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=2, help="each system this many times, alternated")
    ap.add_argument("--json", help="append one JSON line per case to this file")
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    if not set(systems) <= set(SYSTEMS):
        raise SystemExit(f"--systems: of {', '.join(SYSTEMS)}")
    results: dict[str, list[dict]] = {s: [] for s in systems}
    for r in range(args.rounds):
        for system in systems if r % 2 == 0 else systems[::-1]:
            res = run_case(system, args)
            results[system].append(res)
            print(f"round {r + 1}: {system}: {res['delivered_per_s']:,.0f} delivered/s, "
                  f"{res['acked_per_s']:,.0f} acknowledged/s ({res['received']:,} of {res['count']:,})", flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({**res, "round": r + 1}) + "\n")
    base = statistics.median(x["delivered_per_s"] for x in results["fastbus"]) if "fastbus" in results else None
    print()
    print("| system | delivered msg/s (median) | acknowledged msg/s (median) | delivered vs fastbus |")
    print("|---|---|---|---|")
    for system, rs in results.items():
        d = statistics.median(x["delivered_per_s"] for x in rs)
        a = statistics.median(x["acked_per_s"] for x in rs)
        ratio = f"{d / base:.2f}x" if base else "-"
        print(f"| {system} | {d:,.0f} | {a:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
