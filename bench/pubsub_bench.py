"""Seed 000's pub/sub workload on fastbus, Redis and a libzmq proxy, in one run.

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

Rates are taken over the middle of the run (after a warm-up).  Then the
publishers stop and the subscribers drain what is queued for them, for at
most --drain seconds.  "dropped" is what a server discarded (fastbus's own
counter; the peers' settings here never discard); "undelivered" is
published x subscribers - received - dropped: a backlog still queued when the
drain time ran out, when publishers outran subscribers.  Everything runs on
loopback; every loop is bounded in time.

    python bench/pubsub_bench.py --cases 1:2,1:1,2:2,4:4 --styles seed,bulk --seconds 5 --png bench/pubsub.png
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

CHANNELS = [str(i) for i in range(50)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def channel_cycle(seed: int):
    rng = random.Random(seed)
    return itertools.cycle([rng.choice(CHANNELS).encode() for _ in range(10007)])


# -- servers ---------------------------------------------------------------

class Server:
    def __init__(self, system: str) -> None:
        self.system = system
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix=f"bench-{system}-")
        if system == "fastbus":
            self.endpoint = f"tcp://127.0.0.1:{self.port}"
            # Lossless like the peers' settings (Redis: unlimited pub/sub output
            # buffer; libzmq: HWM 0): a subscriber queue the run cannot fill.
            cmd = [sys.executable, "-m", "fastbus", "broker", "--bind", self.endpoint, "--log-level", "WARNING",
                   "--stats-interval", "0", "--max-queue-bytes", str(8 << 30)]
        elif system == "redis":
            exe = shutil.which("redis-server")
            if not exe:
                raise SystemExit("redis-server not found (apt-get install redis-server)")
            cmd = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--dir", self.dir, "--client-output-buffer-limit", "pubsub", "0", "0", "0"]
        else:
            self.port2 = free_port()
            cmd = [sys.executable, __file__, "--zmq-proxy", str(self.port), str(self.port2)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir)
        time.sleep(0.5)
        if self.proc.poll() is not None:
            raise SystemExit(f"{system} server exited")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def zmq_proxy(front: int, back: int) -> None:
    import zmq
    ctx = zmq.Context()
    xsub = ctx.socket(zmq.XSUB)
    xpub = ctx.socket(zmq.XPUB)
    for s in (xsub, xpub):
        s.sndhwm = 0
        s.rcvhwm = 0
    xsub.bind(f"tcp://127.0.0.1:{front}")
    xpub.bind(f"tcp://127.0.0.1:{back}")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    zmq.proxy(xsub, xpub)


# -- clients ---------------------------------------------------------------

def publisher(system: str, server: dict, size: int, stop, ready_pub, count, seed: int,
              window: int = 0, pub_counts=(), sub_counts=()) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    chans = channel_cycle(seed)
    msg = b"x" * size
    n = 0
    ready_pub.wait()
    if window:
        # Paced: stay at most `window` messages ahead of the slowest
        # subscriber (application-level flow control, the same for every
        # system; the slower publishers of the peers rarely reach it).
        stop = _Paced(stop, window, pub_counts, sub_counts)
    if system == "fastbus":
        import fastbus
        c = fastbus.Client(endpoint=server["endpoint"])
        while not c.stats()["filter_active"]:
            time.sleep(0.01)
        publish = c.publish
        while not stop.is_set():
            for _ in range(1000):
                publish(next(chans), msg)
            n += 1000
            count.value = n
        c.close(timeout=30)
    elif system == "redis":
        import redis
        r = redis.Redis(host="127.0.0.1", port=server["port"])
        pipe = r.pipeline(transaction=False)
        while not stop.is_set():
            # BufferedRedis flushes every 1000 messages (its 200 ms timer
            # never fires at this volume).
            for _ in range(1000):
                pipe.publish(next(chans), msg)
            pipe.execute()
            n += 1000
            count.value = n
    else:
        import zmq
        s = zmq.Context().socket(zmq.PUB)
        s.sndhwm = 0
        s.connect(f"tcp://127.0.0.1:{server['port']}")
        time.sleep(0.5)
        send = s.send
        while not stop.is_set():
            for _ in range(1000):
                send(b"%s %s" % (next(chans), msg))     # seed 000's ZMQPubSub.publish
            n += 1000
            count.value = n
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


def subscriber(system: str, style: str, server: dict, stop_all, ready, count, drain: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
    count.value = n


def run_case(system: str, style: str, npubs: int, nclients: int, seconds: float, size: int,
             drain: float, window: int = 0) -> dict:
    srv = Server(system)
    ctx = mp.get_context("spawn")
    info = {"endpoint": getattr(srv, "endpoint", None), "port": srv.port, "port2": getattr(srv, "port2", None)}
    stop_pub, stop_all, ready_pub = ctx.Event(), ctx.Event(), ctx.Event()
    pubc = [ctx.Value("q", 0) for _ in range(npubs)]
    subc = [ctx.Value("q", 0) for _ in range(nclients)]
    readies = [ctx.Event() for _ in range(nclients)]
    subs = [ctx.Process(target=subscriber, args=(system, style, info, stop_all, readies[i], subc[i], drain))
            for i in range(nclients)]
    pubs = [ctx.Process(target=publisher, args=(system, info, size, stop_pub, ready_pub, pubc[i], i,
                                                window, pubc, subc))
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
        received = sum(c.value for c in subc)
        expected = published * nclients
        dropped = 0
        if system == "fastbus":
            from fastbus.cli import query_stats
            dropped = query_stats(info["endpoint"])["drops"]["slow_consumer"]
        return {"system": system, "style": style, "case": f"{npubs}:{nclients}", "publishers": npubs,
                "window": window,
                "clients": nclients,
                "delivered_per_s": (s1 - s0) / (t1 - t0),
                "per_subscriber_per_s": [(b - a) / (t1 - t0) for a, b in zip(per0, per1)],
                "published": published, "received": received, "dropped": dropped,
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
    ap.add_argument("--systems", default="fastbus,redis,zmq")
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
    ap.add_argument("--zmq-proxy", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.zmq_proxy:
        zmq_proxy(*args.zmq_proxy)
        return
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
                      f"published {r['published']:,}, dropped {r['dropped']:,}, "
                      f"undelivered after the drain {r['undelivered']:,} ({r['undelivered_pct']:.1f}%)", flush=True)
    print("\n| style | pub:sub | " + " | ".join(dict.fromkeys(r["system"] for r in results)) +
          " | fastbus / redis | fastbus / zmq |")
    print("|---|---|" + "---|" * (len(set(r["system"] for r in results)) + 2))
    for style, case in dict.fromkeys((r["style"], r["case"]) for r in results):
        row = {r["system"]: r for r in results if r["case"] == case and r["style"] == style}
        cells = [f"{row[s]['delivered_per_s']:,.0f}" + (f" ({row[s]['dropped']:,} dropped)" if row[s]["dropped"] else "")
                 + (f" ({row[s]['undelivered_pct']:.0f}% backlog)" if row[s]["undelivered"] else "") for s in row]
        fb = row.get("fastbus", {}).get("delivered_per_s")
        ratios = [f"{fb / row[s]['delivered_per_s']:.1f}x" if fb and s in row else "" for s in ("redis", "zmq")]
        print(f"| {style} | {case} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    if args.png:
        plot(results, args.png)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
