"""Django Channels layers: send() to consumers' own channels (new_channel()'s),
the way a view or a background task answers one consumer.

One process, one event loop: ``--channels`` channels (10), a receive()
task on each with a little Python work per message (the json.dumps of a
reply frame), and one task that sends ``--messages`` messages (30,000)
round robin to them, awaiting each send(), flat out or paced at
``--rate`` messages/s (each sent when due: one that falls behind sends
back to back).  Each layer runs on its
own server (bench/servers.py, loopback, defaults):

  fastbus   fastbus.channels.ChannelLayer on a `fastbus broker`
  redis     channels_redis.core.RedisChannelLayer on redis-server

Reported per layer and round: messages/s from the first send to the last
receive, and the latency from send() called to receive() returned (p50,
p99, p99.9, µs; flat out, that is how far the sender ran ahead), then
fastbus / redis.  The layers' capacity is
``--messages`` (nothing is refused); a round gives up after 120 s.

    cd /tmp && python /work/main/bench/channels_direct_bench.py
    cd /tmp && python /work/main/bench/channels_direct_bench.py --rate 1000 --messages 5000
    cd /tmp && python /work/main/bench/channels_direct_bench.py --layers fastbus --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import Server  # noqa: E402

LAYERS = ("fastbus", "redis")


def make_layer(name: str, srv: Server, capacity: int):
    if name == "fastbus":
        from fastbus.channels import ChannelLayer
        return ChannelLayer(endpoint=srv.info["endpoint"], capacity=capacity)
    from channels_redis.core import RedisChannelLayer
    return RedisChannelLayer(hosts=[f"redis://127.0.0.1:{srv.port}"], capacity=capacity)


def pct(sorted_us: list[float], q: float) -> float:
    return sorted_us[min(len(sorted_us) - 1, int(q * len(sorted_us)))]


async def one_round(layer, channels: int, messages: int, rate: float) -> dict:
    names = [await layer.new_channel() for _ in range(channels)]
    per = messages // channels
    lat: list[int] = []
    now = time.monotonic_ns

    async def receiver(name: str) -> None:
        for _ in range(per):
            m = await layer.receive(name)
            t = now()
            json.dumps({"type": "websocket.send", "text": m["text"], "i": m["i"]})
            lat.append(t - m["t"])

    tasks = [asyncio.ensure_future(receiver(n)) for n in names]
    await asyncio.sleep(0.2)                    # the receives are waiting
    t0 = now()
    for i in range(per * channels):
        if rate > 0:
            due = t0 + int(i * 1e9 / rate)
            if due > now():
                await asyncio.sleep((due - now()) / 1e9)
        await layer.send(names[i % channels], {"type": "x", "i": i, "t": now(), "text": "a chat line"})
    await asyncio.wait_for(asyncio.gather(*tasks), 120)
    seconds = (now() - t0) / 1e9
    us = sorted(v / 1e3 for v in lat)
    return {"msg_s": len(lat) / seconds, "p50": pct(us, 0.5), "p99": pct(us, 0.99), "p999": pct(us, 0.999)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default=",".join(LAYERS), help="comma-separated, of: " + ", ".join(LAYERS))
    ap.add_argument("--channels", type=int, default=10, help="consumers' channels (default: %(default)s)")
    ap.add_argument("--messages", type=int, default=30_000, help="messages a round (default: %(default)s)")
    ap.add_argument("--rate", type=float, default=0, help="messages/s, 0: flat out (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per layer, alternated (default: %(default)s)")
    args = ap.parse_args()
    layers = [x for x in args.layers.split(",") if x]
    if not layers or any(x not in LAYERS for x in layers):
        raise SystemExit(f"--layers: of {', '.join(LAYERS)}")
    if args.channels < 1 or args.messages < args.channels:
        raise SystemExit("--channels at least 1, --messages at least --channels")
    servers = {name: Server("fastbus" if name == "fastbus" else "redis", lossless=False) for name in layers}
    results: dict[str, list[dict]] = {name: [] for name in layers}
    try:
        for r in range(args.rounds):
            for name in layers:
                async def run() -> dict:
                    layer = make_layer(name, servers[name], args.messages)
                    try:
                        return await one_round(layer, args.channels, args.messages, args.rate)
                    finally:
                        await layer.flush()
                res = asyncio.run(run())
                results[name].append(res)
                print(f"{name:8} round {r + 1}: {res['msg_s']:>9,.0f} msg/s  p50 {res['p50']:>8,.0f}  "
                      f"p99 {res['p99']:>8,.0f}  p99.9 {res['p999']:>8,.0f} µs", flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
    if "fastbus" in results and "redis" in results:
        for r in range(args.rounds):
            f, x = results["fastbus"][r], results["redis"][r]
            print(f"round {r + 1}: fastbus / redis {f['msg_s'] / x['msg_s']:.2f}x msg/s, "
                  f"p99 {f['p99'] / x['p99']:.2f}x")


if __name__ == "__main__":
    main()
