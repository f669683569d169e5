"""How long a subscription takes to be in effect: fastbus's subscribe()
(which returns once every publisher's filter has the subscription) beside
redis-py's SUBSCRIBE (the call, then reading its confirmations: the moment
Redis has processed it), with 1 or 100 channels in one call and 1 or 100
publishers connected.

The publishers are real clients in their own processes (spread over
--publisher-procs).  With ``--publisher-mode filtering`` (the default) each
publishes a message nobody wants every 20 ms, so every fastbus publisher
has its filter in use (under a lease) and must acknowledge each new
subscription: the worst case.  With ``busy`` they do the same, and spend
the time between two messages in pure Python (an application at work,
holding its interpreter): whatever of a publisher must answer the broker
then either runs without the interpreter lock or waits for it.  With
``idle`` they are connected and publish nothing: a publisher without a
lease does not filter, and the broker does not wait for it.  Redis has no such step: its publishers do
not filter.  Each round subscribes a new set of channels on one
connection, then unsubscribes them.  Latency as percentiles
(microseconds).

    python bench/subscribe_bench.py                       # both systems, all cases
    python bench/subscribe_bench.py --rounds 2000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import Server  # noqa: E402

SYSTEMS = ("fastbus", "redis")


def _publishers(info: dict, count: int, mode: str, ready, stop) -> None:
    """``count`` publishing clients in this process, each sending a message
    nobody wants every 20 ms (mode "filtering"; "busy": spinning in Python
    in between), or nothing ("idle"), until ``stop``."""
    if info["system"] == "fastbus":
        import fastbus
        clients = [fastbus.Client(endpoint=info["endpoint"]) for _ in range(count)]
        for c in clients:
            c.flush()

        def publish(c):
            c.publish("noise", b"x")
    else:
        import redis
        clients = [redis.Redis(port=info["port"]) for _ in range(count)]
        for c in clients:
            c.ping()

        def publish(c):
            c.publish("noise", b"x")
    ready.release()
    i = 0
    while not stop.is_set():
        if mode == "idle":
            stop.wait(0.1)
            continue
        publish(clients[i % count])
        i += 1
        if mode == "busy":
            end = time.perf_counter() + 0.02 / count
            while time.perf_counter() < end:    # pure Python: holds the interpreter
                pass
        else:
            time.sleep(0.02 / count)
    for c in clients:
        c.close()


def _subscribe_rounds(info: dict, channels: int, rounds: int) -> array:
    """Nanoseconds from the subscribe call until the subscription is in
    effect, one figure per round."""
    lat = array("q")
    if info["system"] == "fastbus":
        import fastbus
        c = fastbus.Client(endpoint=info["endpoint"])
        p = c.pubsub(ignore_subscribe_messages=True)
        p.subscribe("warmup")
        for r in range(rounds):
            names = [f"s{r}.{i}" for i in range(channels)]
            t0 = time.perf_counter_ns()
            p.subscribe(*names)                    # returns once in effect
            lat.append(time.perf_counter_ns() - t0)
            p.unsubscribe(*names)
            while p.get_message(timeout=0) is not None:
                pass
        c.close()
    else:
        import redis
        c = redis.Redis(port=info["port"])
        p = c.pubsub()
        for r in range(rounds):
            names = [f"s{r}.{i}" for i in range(channels)]
            t0 = time.perf_counter_ns()
            p.subscribe(*names)                    # sent; in effect once Redis answered
            got = 0
            while got < channels:
                m = p.get_message(timeout=5)
                if m is None:
                    raise SystemExit("redis: a SUBSCRIBE was not confirmed within 5 s")
                got += m["type"] == "subscribe"
            lat.append(time.perf_counter_ns() - t0)
            p.unsubscribe(*names)
            got = 0
            while got < channels:
                m = p.get_message(timeout=5)
                got += m is not None and m["type"] == "unsubscribe"
        p.close()
        c.close()
    return lat


def percentiles(lat: array) -> dict:
    s = sorted(lat)
    n = len(s)

    def q(x: float) -> float:
        return s[min(n - 1, int(x * n))] / 1e3
    return {"n": n, "p50": q(0.50), "p90": q(0.90), "p99": q(0.99), "p999": q(0.999), "max": s[-1] / 1e3}


def run_case(system: str, publishers: int, channels: int, rounds: int, procs: int, mode: str) -> dict:
    server = Server(system, lossless=False)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    ready = ctx.Semaphore(0)
    workers = []
    try:
        n = max(1, min(procs, publishers))
        for k in range(n):
            count = publishers // n + (1 if k < publishers % n else 0)
            w = ctx.Process(target=_publishers, args=(server.info, count, mode, ready, stop), daemon=True)
            w.start()
            workers.append(w)
        for _ in workers:
            if not ready.acquire(timeout=60):
                raise SystemExit("publishers did not start")
        time.sleep(0.5)                            # their filters are in use
        lat = _subscribe_rounds(server.info, channels, rounds)
        return {"system": system, "publishers": publishers, "mode": mode, "channels": channels,
                **percentiles(lat)}
    finally:
        stop.set()
        for w in workers:
            w.join(10)
            if w.is_alive():
                w.kill()
        server.stop()


def table(results: list[dict]) -> str:
    lines = ["| publishers | channels a call | system | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | p50 / Redis | "
             "p99 / Redis |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    redis = {(r["publishers"], r["mode"], r["channels"]): r for r in results if r["system"] == "redis"}
    for r in results:
        peer = redis.get((r["publishers"], r["mode"], r["channels"]))
        ratio = (f"{r['p50'] / peer['p50']:.2f}x | {r['p99'] / peer['p99']:.2f}x"
                 if peer is not None and r["system"] != "redis" else "| ")
        lines.append(f"| {r['publishers']} {r['mode']} | {r['channels']} | {r['system']} | {r['p50']:,.0f} | "
                     f"{r['p90']:,.0f} | {r['p99']:,.0f} | {r['p999']:,.0f} | {r['max']:,.0f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, of: " + ", ".join(SYSTEMS))
    ap.add_argument("--publishers", default="1,100", help="publishers connected, per case (default: %(default)s)")
    ap.add_argument("--channels", default="1,100", help="channels in one subscribe call (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=1000, help="subscribe calls per case (default: %(default)s)")
    ap.add_argument("--publisher-procs", type=int, default=4,
                    help="processes the publishers are spread over (default: %(default)s)")
    ap.add_argument("--publisher-mode", default="filtering,idle",
                    help="comma-separated: filtering (each publisher's filter in use), busy (the same, "
                         "spinning in Python between messages), idle (default: %(default)s)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 1_000_000:
        raise SystemExit("--rounds must be between 1 and 1,000,000")
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            raise SystemExit(f"unknown system {s!r}: one of {', '.join(SYSTEMS)}")
    modes = [m for m in args.publisher_mode.split(",") if m]
    for m in modes:
        if m not in ("filtering", "busy", "idle"):
            raise SystemExit(f"unknown --publisher-mode {m!r}: filtering, busy or idle")
    results = []
    for mode in modes:
        for pubs in (int(x) for x in args.publishers.split(",")):
            for chans in (int(x) for x in args.channels.split(",")):
                for system in systems:
                    r = run_case(system, pubs, chans, args.rounds, args.publisher_procs, mode)
                    print(f"{system:8} {pubs:4} {mode} publishers {chans:4} channels: p50 {r['p50']:,.0f} µs, "
                          f"p99 {r['p99']:,.0f} µs, p99.9 {r['p999']:,.0f} µs", flush=True)
                    results.append(r)
    print()
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
