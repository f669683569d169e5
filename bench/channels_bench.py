"""Django Channels layers: group_send to a group spread over processes, and
a named channel's tasks shared by worker processes.

Layers, each on its own server started for each case (loopback only,
defaults kept, as a new user would run them):

  fastbus       fastbus.channels.ChannelLayer(endpoint=...) on a `fastbus broker`
  redis         channels_redis.core.RedisChannelLayer(hosts=[...]) on redis-server
  redis-pubsub  channels_redis.pubsub.RedisPubSubChannelLayer(hosts=[...]) on
                redis-server

The servers are bench/servers.py's (the same as the pub/sub benchmarks').

Workload: ``--consumers`` processes (4), each makes ``--channels`` channels
(25) with new_channel() and adds each to one group (4 x 25 = a group of
100 channels), then receives on every channel, one asyncio task per
channel, as Channels' consumers do, and does a little Python work per
message (the json.dumps of a small reply, as a consumer sending a frame to
its websocket).  One producer process calls ``await group_send()`` on the
group, paced at ``--rate`` group messages per second (the sent time taken
just before each call, so a group_send that blocks counts), or flat out
(rate 0) for the same time, bounded by ``--max-messages`` as well.  The
first ``--warmup`` seconds are sent but not measured.

Each message carries its sequence number and the time group_send was
called (``time.monotonic_ns()``: one clock for every process of the
machine); each consumer records ``monotonic_ns() - sent`` when receive()
returns.  Reported per layer and offered rate:

  group_send/s   the rate the producer achieved
  delivered/s    channel deliveries (one group message to 100 channels is
                 100) per second, from the first group_send to the last
                 receive()
  p50 .. max     latency from group_send to receive() returning, µs, over the
                 measured messages of every channel
  lost           expected deliveries (group messages sent x channels in the
                 group) minus the distinct ones received; ``dup`` counts
                 a message received twice on one channel
  CPU µs/deliv.  CPU time of every process (producer, consumers, server)
                 per delivery

and the ratios fastbus / peer for delivered/s and p99.

The worker case (``--case worker``): ``--consumers`` worker processes
(4) each receive() on one named channel (what Channels' ``runworker``
does), with the same Python work per message; one producer process calls
``await send()`` on it, paced or flat out.  A named channel gives each
message to one worker: ``lost`` is what no worker got, ``dup`` what two
did.  A send() refused with ChannelFull (the channel holds ``--capacity``)
is tried again after 1 ms, counted as ``full``: the producer is held back
to what the workers take.  RedisPubSubChannelLayer is left out of it
(every receiver of a named channel gets every message there).

Consumers stop when they have everything that was sent, or when the
producer is done and nothing came for ``--idle`` seconds, or at a hard
limit; every loop is bounded in count and time, and every process started
here is stopped by its own pid, also on error.

    cd /tmp && python /work/main/bench/channels_bench.py                        # all three layers
    cd /tmp && python /work/main/bench/channels_bench.py --layers redis,redis-pubsub --seconds 5
    cd /tmp && python /work/main/bench/channels_bench.py --case worker --layers fastbus,redis
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import multiprocessing as mp
import os
import signal
import struct
import sys
import tempfile
import time
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latency_bench import _cpu_seconds, _rate_label, percentiles  # noqa: E402
from servers import Server  # noqa: E402

LAYERS = ("fastbus", "redis", "redis-pubsub")
SERVER_OF = {"fastbus": "fastbus", "redis": "redis", "redis-pubsub": "redis"}
GROUP = "bench"
WORK = "bench-work"          # the worker case's named channel
CASES = ("group", "worker")
TEXT = "a chat line of about forty characters...."


# -- layers --------------------------------------------------------------------

def make_layer(layer: str, info: dict, capacity: int, expiry: int):
    """The channel layer ``layer`` on the server ``info`` (in the calling
    process), with Channels' defaults but for capacity and expiry."""
    if layer == "fastbus":
        from fastbus.channels import ChannelLayer
        return ChannelLayer(endpoint=info["endpoint"], capacity=capacity, expiry=expiry)
    hosts = [f"redis://127.0.0.1:{info['port']}"]
    if layer == "redis":
        from channels_redis.core import RedisChannelLayer
        return RedisChannelLayer(hosts=hosts, capacity=capacity, expiry=expiry)
    from channels_redis.pubsub import RedisPubSubChannelLayer   # no capacity, no expiry: pub/sub
    return RedisPubSubChannelLayer(hosts=hosts)


async def close_layer(layer) -> None:
    """Close a layer's connections without removing what it holds on the
    server (flush() would, for RedisChannelLayer and maybe fastbus's):
    close() where there is one, close_pools() for RedisChannelLayer, the
    pub/sub layer's flush() (which only drops local state and
    connections)."""
    from channels_redis.pubsub import RedisPubSubChannelLayer
    if isinstance(layer, RedisPubSubChannelLayer):
        call = layer.flush
    else:
        call = getattr(layer, "close", None) or getattr(layer, "close_pools", None)
    if call is not None:
        await asyncio.wait_for(call(), 10)


# -- producer ------------------------------------------------------------------

async def paced(rate: float, seconds: float, max_messages: int):
    """Sequence numbers, each yielded when it is due (``i / rate`` after the
    start; back to back while behind), or flat out with rate 0; at most
    ``max_messages`` and none after ``seconds`` (a producer that cannot
    keep up sends fewer: its achieved rate is reported)."""
    total = max_messages if rate <= 0 else min(max_messages, int(rate * seconds))
    now_ns = time.monotonic_ns
    start = now_ns()
    end = start + int(seconds * 1e9)
    interval = 0 if rate <= 0 else 1e9 / rate
    for i in range(total):
        now = now_ns()
        if now > end:
            return
        if interval:
            due = start + int(i * interval)
            if now < due:
                await asyncio.sleep((due - now) / 1e9)
        elif i & 255 == 0:
            await asyncio.sleep(0)           # the layer's own tasks run, as in an application's loop
        yield i


def producer(layer_name: str, info: dict, rate: float, seconds: float, warmup: float, max_messages: int,
             capacity: int, expiry: int, go, sent_total, out, work: bool = False) -> None:
    """``group_send()`` to the group, paced or flat out; with ``work`` (the
    worker case) ``send()`` to the named channel, tried again 1 ms after a
    ChannelFull (counted), so the producer is held to what the workers take."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from channels.exceptions import ChannelFull

    async def run() -> dict:
        layer = make_layer(layer_name, info, capacity, expiry)
        now_ns = time.monotonic_ns
        full = 0
        give_up = now_ns() + int((seconds + warmup + 60) * 1e9)

        async def deliver(message: dict) -> None:
            nonlocal full
            if not work:
                await layer.group_send(GROUP, message)
                return
            while True:
                try:
                    await layer.send(WORK, message)
                    return
                except ChannelFull:                 # held back: the workers have `capacity` waiting
                    full += 1
                    if now_ns() > give_up:
                        raise
                    await asyncio.sleep(0.001)

        # One before the clock starts: connections opened, scripts loaded.
        warm = {"type": "bench.message"}
        await (layer.send(WORK + "-warm", warm) if work else layer.group_send(GROUP + "-nobody", warm))
        await asyncio.to_thread(go.wait, 60)
        warm_until = now_ns() + int(warmup * 1e9)
        sent = 0
        slowest = 0
        t0 = now_ns()
        async for i in paced(rate, seconds + warmup, max_messages):
            t = now_ns()
            await deliver({"type": "bench.message", "seq": i, "t": t, "w": t < warm_until, "text": TEXT})
            slowest = max(slowest, now_ns() - t)
            sent += 1
        t1 = now_ns()
        sent_total.value = sent
        stats = {k: v for k, v in layer.stats().items() if v} if hasattr(layer, "stats") else {}
        if full:
            stats["channel_full_retries"] = full
        await close_layer(layer)
        return {"sent": sent, "layer_stats": stats, "t0_ns": t0, "seconds": (t1 - t0) / 1e9,
                "slowest_group_send_us": slowest / 1e3}

    try:
        res = asyncio.run(run())
    except BaseException as exc:         # the parent reports it; it must not wait for a result
        out.put({"error": f"producer: {type(exc).__name__}: {exc}"})
        raise
    res["cpu_s"] = time.process_time()
    out.put(res)


# -- consumers -----------------------------------------------------------------

def _work(m: dict, max_messages: int, state: dict) -> int:
    """A consumer's handler: a little Python work per message (the json of
    the reply frame it would send its websocket); the message's sequence
    number, or -1 for one that is not the benchmark's (counted as bad)."""
    reply = json.dumps({"type": "websocket.send", "text": m.get("text", ""), "seq": m.get("seq")})
    seq = m.get("seq", -1)
    if not 0 <= seq < max_messages or not reply.startswith("{"):
        state["bad"] += 1
        return -1
    return seq


def _took(m: dict, t: int, state: dict, lat: array) -> None:
    """A message received at ``t`` (monotonic ns), counted; its latency kept
    unless it was sent in the warm-up."""
    state["received"] += 1
    state["last_ns"] = t
    if not m["w"]:
        lat.append(t - m["t"])

def consumer(layer_name: str, info: dict, index: int, channels: int, capacity: int, expiry: int,
             max_messages: int, idle: float, limit: float, ready, pub_done, sent_total, path: str) -> None:
    """``channels`` channels in the group, a receive() task on each, until
    everything sent has come, or the producer is done and nothing came for
    ``idle`` seconds, or ``limit`` seconds; writes the counts, this
    process's CPU time and the latencies to ``path``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lat = array("q")
    seen = [bytearray(max_messages) for _ in range(channels)]     # one byte per sequence number
    state = {"received": 0, "dup": 0, "bad": 0, "last_ns": 0, "errors": [], "layer_stats": {}}
    now_ns = time.monotonic_ns

    async def receiver(layer, name: str, k: int) -> None:
        mine = seen[k]
        receive = layer.receive
        for _ in range(max_messages * 2 + 10):                   # bounded; cancelled at the end
            m = await receive(name)
            t = now_ns()
            seq = _work(m, max_messages, state)
            if seq < 0:
                continue
            if mine[seq]:
                state["dup"] += 1
                continue
            mine[seq] = 1
            _took(m, t, state, lat)

    async def run() -> None:
        layer = make_layer(layer_name, info, capacity, expiry)
        names = [await layer.new_channel() for _ in range(channels)]
        for name in names:
            await layer.group_add(GROUP, name)
        tasks = [asyncio.ensure_future(receiver(layer, n, k)) for k, n in enumerate(names)]
        await asyncio.sleep(0.2)             # the receives are waiting
        ready.set()
        end = time.monotonic() + limit
        last_count, last_change = 0, time.monotonic()
        last_tick = last_change
        while time.monotonic() < end:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            if state["received"] != last_count or now - last_tick > 0.5:
                # Something came, or this task itself did not run for a while (the
                # loop was busy in the layer): the receivers get their idle time anew.
                last_count, last_change = state["received"], now
            last_tick = now
            failed = [t for t in tasks if t.done()]
            if failed:
                for t in failed:
                    if not t.cancelled() and t.exception() is not None:
                        state["errors"].append(f"consumer {index}: {type(t.exception()).__name__}: "
                                               f"{t.exception()}")
                break
            if pub_done.is_set():
                if state["received"] >= sent_total.value * channels or now - last_change > idle:
                    break
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks, timeout=10)
        for name in names:
            try:
                await asyncio.wait_for(layer.group_discard(GROUP, name), 5)
            except Exception:  # noqa: BLE001 - leaving; the server is stopped next anyway
                break
        await _leave(layer, state, f"consumer {index}")

    _run_and_report(run, state, f"consumer {index}", ready, path, lat)


async def _leave(layer, state: dict, who: str) -> None:
    """A consumer's end: its layer's counters (fastbus's: what it
    delivered, dropped and why), then its connections closed."""
    if hasattr(layer, "stats"):
        state["layer_stats"] = {k: v for k, v in layer.stats().items() if v}
    try:
        await close_layer(layer)
    except Exception as exc:  # noqa: BLE001
        state["errors"].append(f"{who}: close: {type(exc).__name__}: {exc}")


def _run_and_report(run, state: dict, who: str, ready, path: str, *arrays: array) -> None:
    """Run a consumer's coroutine; then write this process's CPU time (ns),
    its state (JSON) and the arrays to ``path``: each but the last after its
    length (_read_report reads it back)."""
    try:
        asyncio.run(run())
    except Exception as exc:  # noqa: BLE001 - reported by the parent
        state["errors"].append(f"{who}: {type(exc).__name__}: {exc}")
        ready.set()
    head = json.dumps(state).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<qq", int(time.process_time() * 1e9), len(head)))
        f.write(head)
        for a in arrays[:-1]:
            f.write(struct.pack("<q", len(a)))
            a.tofile(f)
        arrays[-1].tofile(f)


def _read_report(path: str, narrays: int) -> tuple[int, dict, list[array]]:
    """What _run_and_report wrote: CPU ns, state, the arrays ('q')."""
    with open(path, "rb") as f:
        cpu_ns, head_len = struct.unpack("<qq", f.read(16))
        head = json.loads(f.read(head_len))
        out = []
        for _ in range(narrays - 1):
            (n,) = struct.unpack("<q", f.read(8))
            a = array("q")
            a.frombytes(f.read(n * 8))
            out.append(a)
        last = array("q")
        last.frombytes(f.read())
        out.append(last)
    return cpu_ns, head, out


# -- the worker case: one named channel, shared by worker processes ----------------

def worker(layer_name: str, info: dict, index: int, channels: int, capacity: int, expiry: int,
           max_messages: int, idle: float, limit: float, ready, pub_done, sent_total, path: str) -> None:
    """One worker process: receive() on the named channel until the
    producer is done and nothing came for ``idle`` seconds (or ``limit``);
    writes what it took (sequence numbers) and the latencies to ``path``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lat = array("q")
    seqs = array("q")
    state = {"received": 0, "dup": 0, "bad": 0, "last_ns": 0, "errors": [], "layer_stats": {}}
    now_ns = time.monotonic_ns

    async def receiver(layer) -> None:
        receive = layer.receive
        for _ in range(max_messages * 2 + 10):
            m = await receive(WORK)
            t = now_ns()
            seq = _work(m, max_messages, state)
            if seq >= 0:
                seqs.append(seq)
                _took(m, t, state, lat)

    async def run() -> None:
        layer = make_layer(layer_name, info, capacity, expiry)
        task = asyncio.ensure_future(receiver(layer))
        await asyncio.sleep(0.5)             # its receive() waits (the broker has the member)
        ready.set()
        end = time.monotonic() + limit
        last_count, last_change = 0, time.monotonic()
        while time.monotonic() < end and not task.done():
            await asyncio.sleep(0.05)
            now = time.monotonic()
            if state["received"] != last_count:
                last_count, last_change = state["received"], now
            if pub_done.is_set() and now - last_change > idle:
                break
        if task.done() and not task.cancelled() and task.exception() is not None:
            state["errors"].append(f"worker {index}: {type(task.exception()).__name__}: {task.exception()}")
        task.cancel()
        await asyncio.wait([task], timeout=10)
        await _leave(layer, state, f"worker {index}")

    _run_and_report(run, state, f"worker {index}", ready, path, seqs, lat)


# -- a case --------------------------------------------------------------------

def run_case(layer: str, rate: float, args, case: str = "group") -> dict:
    """One layer at one offered rate: the group case (channels of every
    consumer in one group) or the worker case (one named channel)."""
    work = case == "worker"
    srv = Server(SERVER_OF[layer], lossless=False)
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="channels-bench-")
    n = args.consumers
    ready = [ctx.Event() for _ in range(n)]
    go, pub_done = ctx.Event(), ctx.Event()
    sent_total = ctx.Value("q", 0)
    out = ctx.Queue()
    total = args.seconds + args.warmup
    max_messages = args.max_messages if rate <= 0 else min(args.max_messages, int(rate * total) + 1)
    limit = total + args.idle + 60.0
    paths = [os.path.join(tmp, f"consumer{i}.bin") for i in range(n)]
    cons = [ctx.Process(target=worker if work else consumer,
                        args=(layer, srv.info, i, args.channels, args.capacity, args.expiry,
                                               max_messages, args.idle, limit, ready[i], pub_done, sent_total,
                                               paths[i]))
            for i in range(n)]
    prod = ctx.Process(target=producer,
                       args=(layer, srv.info, rate, args.seconds, args.warmup, max_messages,
                             args.capacity, args.expiry, go, sent_total, out, work))
    try:
        for p in cons:
            p.start()
        for i, r in enumerate(ready):
            if not r.wait(60):
                raise SystemExit(f"{layer}: consumer {i} did not get ready in 60 s")
        prod.start()
        time.sleep(1.0)                      # the producer connects (its first group_send is done)
        cpu0 = {p.pid: _cpu_seconds(p.pid) for p in cons}
        server_cpu0 = _cpu_seconds(srv.proc.pid)
        go.set()
        res = out.get(timeout=total + 120)
        pub_done.set()
        if "error" in res:
            raise SystemExit(f"{layer}: {res['error']}")
        prod.join(30)
        for p in cons:
            p.join(limit + 15)
        server_cpu = _cpu_seconds(srv.proc.pid) - server_cpu0
        broker = {}
        if SERVER_OF[layer] == "fastbus":
            from fastbus.client import query_stats
            st = query_stats(srv.endpoint)
            broker = {k: st[k] for k in ("messages_in", "messages_out", "flow_pauses", "flow_timeouts", "queued_bytes", "held_kept",
                                         "held_given") if st.get(k)}
            broker["drops"] = {k: v for k, v in st.get("drops", {}).items() if v}
        lat = array("q")
        taken = array("q")                   # the worker case: every sequence number a worker took
        per_worker = []
        received = dup = bad = 0
        last_ns = 0
        cons_cpu = 0.0
        errors = []
        layer_stats: dict[str, int] = {}
        for p, path in zip(cons, paths):
            if not os.path.exists(path):
                errors.append(f"consumer pid {p.pid} wrote nothing (exit {p.exitcode})")
                continue
            cpu_ns, head, arrays = _read_report(path, 2 if work else 1)
            if work:
                taken.extend(arrays[0])
                per_worker.append(len(arrays[0]))
            lat.extend(arrays[-1])
            # A consumer's CPU during the case: its total, less what it had used setting up.
            cons_cpu += max(0.0, cpu_ns / 1e9 - cpu0.get(p.pid, 0.0))
            received += head["received"]
            dup += head["dup"]
            bad += head["bad"]
            last_ns = max(last_ns, head["last_ns"])
            errors += head["errors"]
            for k, v in head["layer_stats"].items():
                layer_stats[k] = layer_stats.get(k, 0) + v
        group = 1 if work else n * args.channels
        expected = res["sent"] * group
        if work:                              # each message to one worker: dup across them
            distinct = len(set(taken))
            dup, received = len(taken) - distinct, distinct
        span = (last_ns - res["t0_ns"]) / 1e9 if last_ns > res["t0_ns"] else 0.0
        cpu = res["cpu_s"] + cons_cpu + server_cpu
        return {"layer": layer, "case": case, "rate": rate, "consumers": n, "channels": args.channels,
                "group": group, "per_worker": per_worker,
                "sent": res["sent"], "group_send_per_s": res["sent"] / res["seconds"] if res["seconds"] else 0.0,
                "slowest_group_send_us": res["slowest_group_send_us"],
                "expected": expected, "received": received, "lost": expected - received, "dup": dup, "bad": bad,
                "delivered_per_s": received / span if span else 0.0, "span_s": span,
                "measured": len(lat), "errors": errors, "layer_stats": layer_stats,
                "producer_layer_stats": res["layer_stats"], "broker": broker,
                "cpu": {"producer_s": res["cpu_s"], "consumers_s": cons_cpu, "server_s": server_cpu,
                        "us_per_delivery": cpu / received * 1e6 if received else 0.0},
                **percentiles(lat)}
    finally:
        pub_done.set()
        go.set()
        for p in [prod, *cons]:
            if p.pid is not None and p.is_alive():
                p.terminate()
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join(5)
        srv.stop()
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)
        os.rmdir(tmp)


# -- report --------------------------------------------------------------------

def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else ""


def table(results: list[dict]) -> str:
    peers = [x for x in dict.fromkeys(r["layer"] for r in results) if x != "fastbus"]
    head = ("| case | offered | layer | sent/s | delivered/s | p50 | p90 | p99 | p99.9 | max | lost | "
            "CPU µs/deliv. |")
    for p in peers:
        head += f" delivered/s fastbus/{p} | p99 fastbus/{p} |"
    lines = [head, "|" + "---|" * (12 + 2 * len(peers))]
    for r in results:
        same = [x for x in results if x["rate"] == r["rate"] and x["case"] == r["case"]]
        fb = next((x for x in same if x["layer"] == "fastbus"), None)
        cells = [f"{r[k]:,.0f}" if k in r else "-" for k in ("p50", "p90", "p99", "p99.9", "max")]
        lost = f"{r['lost']:,} of {r['expected']:,}" if r["lost"] else "0"
        if r["dup"]:
            lost += f" ({r['dup']:,} dup)"
        line = (f"| {r['case']} | {_rate_label(r['rate'])} | {r['layer']} | {r['group_send_per_s']:,.0f} | "
                f"{r['delivered_per_s']:,.0f} | " + " | ".join(cells) +
                f" | {lost} | {r['cpu']['us_per_delivery']:.1f} |")
        for p in peers:
            peer = next((x for x in same if x["layer"] == p), None)
            if r["layer"] == "fastbus" and fb and peer:
                line += f" {_ratio(fb['delivered_per_s'], peer['delivered_per_s'])} | " \
                        f"{_ratio(fb.get('p99'), peer.get('p99'))} |"
            else:
                line += " | |"
        lines.append(line)
    return "\n".join(lines)


def targets(results: list[dict], rate: float, case: str = "group") -> list[str]:
    """The issue's targets against RedisChannelLayer (and the pub/sub layer,
    for information): flat out, fastbus's delivered/s at least 10x; at
    ``rate``, fastbus's p99 no higher."""
    out = []
    results = [r for r in results if r["case"] == case]
    for peer in ("redis", "redis-pubsub"):
        flat = {r["layer"]: r for r in results if r["rate"] <= 0}
        at = {r["layer"]: r for r in results if r["rate"] == rate}
        if "fastbus" in flat and peer in flat and flat[peer]["delivered_per_s"]:
            x = flat["fastbus"]["delivered_per_s"] / flat[peer]["delivered_per_s"]
            out.append(f"{case}, flat out, delivered/s fastbus/{peer}: {x:.2f}x (target >= 10x: "
                       f"{'met' if x >= 10 else 'NOT met'})")
        if "fastbus" in at and peer in at and at[peer].get("p99") and at["fastbus"].get("p99"):
            x = at["fastbus"]["p99"] / at[peer]["p99"]
            out.append(f"{case}, {_rate_label(rate)}, p99 fastbus/{peer}: {x:.2f}x "
                       f"({at['fastbus']['p99']:,.0f} vs {at[peer]['p99']:,.0f} µs; target <= 1: "
                       f"{'met' if x <= 1 else 'NOT met'})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default=",".join(LAYERS), help="comma-separated, of: " + ", ".join(LAYERS) +
                    " (default: %(default)s)")
    ap.add_argument("--case", default=",".join(CASES),
                    help="comma-separated, of: group (group_send to a group spread over the consumers), worker "
                         "(send() to one named channel the consumers work on) (default: %(default)s)")
    ap.add_argument("--consumers", type=int, default=4,
                    help="consumer (worker) processes (default: %(default)s)")
    ap.add_argument("--channels", type=int, default=25,
                    help="channels per consumer process, all in the group (default: %(default)s)")
    ap.add_argument("--rate", default="1000,0",
                    help="group messages per second, comma-separated, one case each; 0 is flat out "
                         "(default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per case (default: %(default)s)")
    ap.add_argument("--warmup", type=float, default=0.5,
                    help="seconds sent first and not measured (default: %(default)s)")
    ap.add_argument("--max-messages", type=int, default=200_000,
                    help="at most this many group messages per case (default: %(default)s)")
    ap.add_argument("--capacity", type=int, default=100,
                    help="the layers' capacity (Channels' default: %(default)s)")
    ap.add_argument("--expiry", type=int, default=60, help="the layers' expiry, s (default: %(default)s)")
    ap.add_argument("--idle", type=float, default=2.0,
                    help="a consumer stops after the producer and this many seconds without a message, "
                         "if it has not everything already (default: %(default)s)")
    ap.add_argument("--json", metavar="OUT", help="write the results here")
    args = ap.parse_args()
    layers = [x for x in args.layers.split(",") if x]
    if not layers or any(x not in LAYERS for x in layers):
        raise SystemExit(f"--layers: of {', '.join(LAYERS)}, comma-separated")
    cases = [c for c in args.case.split(",") if c]
    if not cases or any(c not in CASES for c in cases):
        raise SystemExit(f"--case: of {', '.join(CASES)}, comma-separated")
    rates = [float(r) for r in args.rate.split(",") if r]
    if not rates or any(r < 0 or r > 1e6 for r in rates):
        raise SystemExit("--rate: group messages per second, 0 (flat out) to 1,000,000")
    if not 0 < args.seconds <= 120 or not 0 <= args.warmup <= 30 or not 0.1 <= args.idle <= 60:
        raise SystemExit("--seconds 0-120, --warmup 0-30, --idle 0.1-60")
    if not 1 <= args.consumers <= 64 or not 1 <= args.channels <= 1000:
        raise SystemExit("--consumers 1-64, --channels 1-1000")
    if not 1 <= args.max_messages <= 10_000_000 or args.capacity < 1:
        raise SystemExit("--max-messages 1-10,000,000, --capacity >= 1")
    build = {}
    if "fastbus" in layers:
        try:
            mod = importlib.import_module("fastbus.channels")
        except ImportError as exc:
            raise SystemExit(f"fastbus.channels cannot be imported ({exc}); run with --layers redis,redis-pubsub")
        import hashlib
        with open(mod.__file__, "rb") as f:         # which layer ran: the installed file's digest
            build = {"fastbus.channels": mod.__file__, "sha256": hashlib.sha256(f.read()).hexdigest()[:12]}
        print(f"fastbus.channels: {build['fastbus.channels']} (sha256 {build['sha256']})", flush=True)
    results = []
    for case, rate, layer in [(c, r, x) for c in cases for r in rates for x in layers]:
        if case == "worker" and layer == "redis-pubsub":
            continue                          # (every receiver of a named channel gets every message)
        r = run_case(layer, rate, args, case)
        results.append(r)
        print(f"{case:6s} {_rate_label(rate):>10} {layer:12s} "
              + " ".join(f"{k}={r[k]:,.0f}" for k in ("p50", "p99", "p99.9", "max") if k in r)
              + f" us; sent {r['sent']:,} at {r['group_send_per_s']:,.0f}/s (slowest group_send "
              + f"{r['slowest_group_send_us']:,.0f} us), delivered {r['received']:,}/{r['expected']:,} "
              + f"at {r['delivered_per_s']:,.0f}/s over {r['span_s']:.2f} s, dup {r['dup']}, "
              + f"CPU {r['cpu']['us_per_delivery']:.1f} us/delivery"
              + (f"; producer's layer stats {r['producer_layer_stats']}" if r["producer_layer_stats"] else "")
              + (f"; consumers' layer stats {r['layer_stats']}" if r["layer_stats"] else "")
              + (f"; broker {r['broker']}" if r["broker"] else "")
              + (f"; per worker {r['per_worker']}" if r["per_worker"] else "")
              + (f"; errors: {r['errors']}" if r["errors"] else ""), flush=True)
    print()
    print(f"group: of {args.consumers} x {args.channels} = {args.consumers * args.channels} channels; worker: "
          f"{args.consumers} workers on one named channel; capacity {args.capacity}; latency in µs")
    print(table(results))
    lines = [line for case in cases for rate in (rates if any(r > 0 for r in rates) else [1.0])
             for line in targets(results, rate, case)]
    lines = list(dict.fromkeys(lines))        # the flat-out lines once
    if lines:
        print()
        for line in lines:
            print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "build": build, "results": results, "targets": lines}, f, indent=1)


if __name__ == "__main__":
    main()
