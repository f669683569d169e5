"""asyncio round trips under load: what one coroutine waits for while
another coroutine of the same PubSub reads the connection.

An asyncio consumer has a task that reads its PubSub for ever (Channels'
consumers, fastbus.channels) while other coroutines subscribe and publish
on the same loop.  Each round: ``await pubsub.subscribe(new channel)``
(timed: the round trip to the broker and its publishers), a message
published to it by an asyncio client and ``await client.flush()`` (timed),
and the reading task's receipt of it (timed from the publish).  Rounds
``--rounds`` (bounded by ``--seconds`` too); ``--load N`` runs N processes
spinning in Python meanwhile (a loaded machine: what made a lost wake-up
show), each stopped by its own pid at the end.  Reported: p50, p99, p99.9
and max of each, µs, and how many rounds took over 0.5 s.

The broker is ``python -m fastbus broker`` of the interpreter running this,
so to compare two builds run it with each in turn:

    cd /tmp && python /work/main/bench/aio_roundtrip_bench.py --rounds 2000 --load 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from federation_bench import broker  # noqa: E402
from servers import free_port  # noqa: E402

SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"


def percentiles(values: list[float]) -> str:
    v = sorted(values)
    if not v:
        return "no rounds"

    def at(q: float) -> float:
        return v[min(len(v) - 1, int(q * len(v)))] * 1e6

    return (f"p50 {at(0.5):,.0f}  p99 {at(0.99):,.0f}  p99.9 {at(0.999):,.0f}  max {v[-1] * 1e6:,.0f} µs"
            f"  (over 0.5 s: {sum(x > 0.5 for x in v)})")


async def run(endpoint: str, rounds: int, seconds: float) -> dict[str, list[float]]:
    import fastbus.aio
    times: dict[str, list[float]] = {"subscribe": [], "flush": [], "received": []}
    arrived: dict[bytes, float] = {}
    got = asyncio.Event()
    async with fastbus.aio.Client(endpoint=endpoint) as pub:
        sub = fastbus.aio.Client(endpoint=endpoint)
        p = sub.pubsub(ignore_subscribe_messages=True)
        await p.subscribe("warm")

        async def reader() -> None:              # the consumer's task: reads for ever
            while True:
                for channel, _data in await p.get_batch(timeout=1.0):
                    arrived[channel] = time.perf_counter()
                    got.set()

        task = asyncio.create_task(reader())
        end = time.monotonic() + seconds
        try:
            for i in range(rounds):
                if time.monotonic() > end:
                    break
                channel = b"round.%d" % i
                t0 = time.perf_counter()
                await p.subscribe(channel)
                times["subscribe"].append(time.perf_counter() - t0)
                t1 = time.perf_counter()
                await pub.publish(channel, b"x")
                await pub.flush(timeout=10)
                times["flush"].append(time.perf_counter() - t1)
                while channel not in arrived:
                    got.clear()
                    await asyncio.wait_for(got.wait(), 10)
                times["received"].append(arrived.pop(channel) - t1)
                await p.unsubscribe(channel)
        finally:
            task.cancel()
            await p.aclose()
            await sub.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1000, help="rounds (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=120.0, help="at most this long (default: %(default)s)")
    ap.add_argument("--load", type=int, default=0, help="processes spinning in Python meanwhile (default: 0)")
    args = ap.parse_args()
    port = free_port()
    b = broker(port)
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN.format(s=args.seconds + 30)])
                for _ in range(args.load)]
    try:
        times = asyncio.run(run(f"tcp://127.0.0.1:{port}", args.rounds, args.seconds))
    finally:
        for s in spinners:
            s.kill()
            s.wait()
        b.terminate()
        b.wait(10)
    import fastbus
    print(f"fastbus {fastbus.__version__} ({os.path.dirname(fastbus.__file__)}), "
          f"{len(times['subscribe'])} rounds, load {args.load}")
    for name, values in times.items():
        print(f"  {name:9}  {percentiles(values)}")


if __name__ == "__main__":
    main()
