"""Producers of one message at a time from many threads: fastbus's
WorkQueue.put() (whose overlapping calls go in one script call,
fastbus/queue/gather.py) against Redis Streams' XADD and an rmq-style
LPUSH, on the same server, in one run.

For each system and each thread count, the threads of one process put()
20-byte messages one at a time, back to back, for --seconds; reported:
messages/s, the server's CPU per message (INFO cpu, the whole server
process, user + sys), and fastbus's script calls per message.  The
server: fastbus's embedded one (bundled Valkey), or --url.  The order of
the systems is reversed every other round.

    cd /tmp && python /work/main/bench/queue_put_threads_bench.py
    cd /tmp && python /work/main/bench/queue_put_threads_bench.py --threads 1,4,16 --seconds 3 --rounds 2
"""

from __future__ import annotations

import argparse
import threading
import time

SYSTEMS = ("fastbus", "streams", "list")


def server_cpu(r) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def putter(system: str, url: str):
    """(put(payload), close()) for one system, shared by the threads."""
    if system == "fastbus":
        from fastbus.queue import WorkQueue
        q = WorkQueue("putbench", url)
        return q.put, q.close, (q if hasattr(q, "_puts") else None)   # (a build from before gathering: no count)
    import redis
    r = redis.Redis.from_url(url, max_connections=64)
    if system == "streams":
        return (lambda p: r.xadd("putbench:stream", {"d": p})), r.close, None
    return (lambda p: r.lpush("putbench:list", p)), r.close, None


def run(system: str, url: str, threads: int, seconds: float, admin) -> dict:
    admin.flushall()
    put, close, q = putter(system, url)
    put(b"warm")
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def producer(i: int) -> None:
        payload = b"x" * 20
        start.wait()
        n = 0
        while not stop.is_set() and n < 10_000_000:
            put(payload)
            n += 1
        counts[i] = n

    ts = [threading.Thread(target=producer, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    calls0 = q._puts.calls if q is not None else 0
    cpu0 = server_cpu(admin)
    start.wait()
    t0 = time.monotonic()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join(60)
    elapsed = time.monotonic() - t0
    cpu = server_cpu(admin) - cpu0
    total = sum(counts)
    out = {"system": system, "threads": threads, "msgs": total, "rate": total / elapsed,
           "server_us": cpu / total * 1e6 if total else 0.0}
    if q is not None:
        out["calls_per_msg"] = (q._puts.calls - calls0) / total if total else 0.0
    close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,16", help="thread counts (default 1,16)")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds a case (default 3)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, the systems' order reversed every other (default 2)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {', '.join(SYSTEMS)} (default all)")
    ap.add_argument("--url", help="a Redis-compatible server on loopback (it is flushed); default: the embedded one")
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    if any(s not in SYSTEMS for s in systems):
        raise SystemExit(f"--systems: of {', '.join(SYSTEMS)}")
    threads = [int(x) for x in args.threads.split(",")]
    if not all(1 <= t <= 256 for t in threads) or not 0.5 <= args.seconds <= 60 or not 1 <= args.rounds <= 20:
        raise SystemExit("--threads 1 to 256, --seconds 0.5 to 60, --rounds 1 to 20")
    import redis

    from fastbus.redis import EmbeddedServer
    srv = None
    if args.url:
        host = redis.Redis.from_url(args.url).connection_pool.connection_kwargs.get("host")
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise SystemExit("--url: loopback only")
        url = args.url
    else:
        srv = EmbeddedServer().start()
        url = srv.url
    admin = redis.Redis.from_url(url)
    results = []
    try:
        for rnd in range(args.rounds):
            order = systems if rnd % 2 == 0 else systems[::-1]
            for n in threads:
                for system in order:
                    r = run(system, url, n, args.seconds, admin)
                    results.append(r)
                    extra = f", {r['calls_per_msg']:.3f} script calls a message" if "calls_per_msg" in r else ""
                    print(f"round {rnd + 1} {system:8} {n:3} threads: {r['rate']:>9,.0f} msg/s, "
                          f"server {r['server_us']:.1f} us CPU a message{extra}", flush=True)
    finally:
        admin.close()
        if srv is not None:
            srv.stop()
    print()
    print("| round | threads | " + " | ".join(f"{s} msg/s (server us/msg)" for s in systems) +
          (" | fastbus / streams |" if "fastbus" in systems and "streams" in systems else " |"))
    print("|---" * (2 + len(systems) + ("fastbus" in systems and "streams" in systems)) + "|")
    for rnd in range(args.rounds):
        for n in threads:
            row = {r["system"]: r for r in results[rnd * len(threads) * len(systems):][:len(threads) * len(systems)]
                   if r["threads"] == n}
            cells = [f"{row[s]['rate']:,.0f} ({row[s]['server_us']:.1f})" for s in systems]
            ratio = (f" | {row['fastbus']['rate'] / row['streams']['rate']:.2f}x"
                     if "fastbus" in row and "streams" in row else "")
            print(f"| {rnd + 1} | {n} | " + " | ".join(cells) + ratio + " |")


if __name__ == "__main__":
    main()
