"""A worker loop's round trip on the asyncio queue client: ``m = await
c.get(ack=m)`` (ACK1 + GET1 pipelined, one round trip a message), one at a
time, against the bundled Redis-compatible server; p50, p99 and p99.9 in
µs.  Run it with two builds to compare them (the same server binary).

    cd /tmp && python /work/main/bench/queue_async_roundtrip.py --messages 3000
"""

from __future__ import annotations

import argparse
import asyncio
import time


def percentile(v: list[float], q: float) -> float:
    return v[min(len(v) - 1, int(len(v) * q))] * 1e6


async def run(url: str, n: int, size: int) -> list[float]:
    from fastbus.queue import AsyncWorkQueue
    q = AsyncWorkQueue("bench-async-roundtrip", url)
    await q.purge("ready")
    await q.put_many([b"x" * size] * n)
    c = await q.consumer("bench", heartbeat_ttl=60.0, clean_interval=None)
    lat = []
    deadline = time.monotonic() + 60
    m = await c.get(timeout=1.0)
    for _ in range(n - 1):
        t = time.perf_counter()
        m = await c.get(timeout=1.0, ack=m)
        lat.append(time.perf_counter() - t)
        if time.monotonic() > deadline:
            break
    await c.ack(m)
    await c.close()
    await q.close()
    return sorted(lat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=3000, help="messages taken one at a time (default 3000)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes (default 100)")
    args = ap.parse_args()
    from fastbus.redis import EmbeddedServer
    with EmbeddedServer() as server:
        lat = asyncio.run(run(server.url, args.messages, args.size))
    print(f"asyncio get(ack=) round trip, {len(lat)} messages: p50 {percentile(lat, 0.5):.0f}  "
          f"p99 {percentile(lat, 0.99):.0f}  p99.9 {percentile(lat, 0.999):.0f} µs")


if __name__ == "__main__":
    main()
