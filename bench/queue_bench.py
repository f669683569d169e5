"""Reliable queues on Redis: fastbus.queue against what redis-py users build
today, against the same server in the same run.

(This file is over 700 lines because every system it compares (fastbus's
queues, Redis Streams, the list recipes) runs from this one file in the same
run, so the ratios it reports come from one command.)

Systems (every one driven from Python through redis-py with hiredis):

  fastbus   WorkQueue: put (B=1) / put_many(B); a registered consumer's
            get (B=1) / get_many(B, timeout) then ack(*msgs): one settle
            script call per batch.  Each operation is one Lua script call.
  fastbus-ackget  the same, the worker's loop as m = c.get(ack=m) at B=1:
            each ack rides in the next get's round trip (two script calls,
            one round trip).
  fastbus-prefetch  that loop on a consumer(prefetch=16): a take asks for
            up to 16 ready messages, get() hands them out one at a time, and
            the acks given meanwhile go with the next take (B=1; B > 1 as
            fastbus).
  streams   Redis Streams as a Streams user drives them: XADD pipelined B per
            round trip (B=1: one XADD per call); XGROUP CREATE once; the
            consumer XREADGROUP GROUP g c COUNT B BLOCK, then one XACK of the
            batch's ids.  No XDEL/MAXLEN: acked entries stay in the stream,
            so its memory grows with every message (the "server memory"
            column shows it); fastbus and the list queue free acked messages.
  list      an rmq-style reliable list queue in plain redis-py: LPUSH
            pipelined B per round trip; the consumer pipelines one BLMOVE
            ready processing RIGHT LEFT (waits for the first message, as the
            others' blocking reads do) and B-1 LMOVEs, then acks with one
            pipeline of LREM processing 1 <payload> per message, in delivery
            order (B=1: one command per call).  LREM is O(n) in the length of
            the processing list: a batch of B acked in delivery order scans
            about B^2/2 entries (the first delivered is the deepest); rmq
            itself moves one message per round trip and polls with a sleep.

Sections:

  throughput  put -> get -> ack of N messages of --size bytes, batch sizes B
              (default 1, 100, 1000).  concurrent: a producer process and a
              consumer process run at once; elapsed = from the producer's
              start until the consumer acked the last message; messages/s =
              N / elapsed.  sequential: one process does put B, get B, ack B
              in turn (three round trips per batch).  Every case is checked:
              the consumer counts what it acked and, once the clock has
              stopped, that the payloads (each carries its index) are all
              distinct and all there; a case that loses or duplicates
              messages says so in capitals, as does one that runs out of
              time.  Where the time goes, per case: the server's CPU time
              (INFO cpu) per message and the part of it spent executing the
              clients' commands (INFO commandstats: a script's time counts
              its inner commands), the commands the clients sent per message,
              the clients' CPU time (process_time), the server's memory after
              the case and what is left in the queue.
  latency     one-at-a-time reads of messages already ready (prefilled):
              fastbus get(timeout) then ack; XREADGROUP COUNT 1 then XACK;
              LMOVE then LREM.  Client-side time.perf_counter_ns of the read
              alone and of read + ack; p50/p99/p99.9/max.
  wakeup      a consumer process blocked in get(timeout) / XREADGROUP BLOCK /
              BLMOVE; the parent puts one message carrying its send time
              (CLOCK_MONOTONIC is shared by the processes) a few ms later;
              latency = the consumer's receive time - send time.
  fanout      a Topic with K logical consumers registered (default 1, 4, 16);
              one producer process publishes M messages with publish_many in
              batches of 1000 while every logical consumer is drained
              (get_many(1000) + ack) by its own thread; consumers are spread
              over at most --fanout-procs processes (default 4: on this
              2-core machine 16 consumer processes delivered less than 4
              processes of 4 threads, 68k against 96k msg/s).  Reported: publish rate alone (registered consumers, no
              reader), publish rate while the consumers drain, and delivered
              messages/s = M * K / elapsed (until the last consumer acked its
              last message).  Every consumer must get all M, distinct.

The server is fastbus's embedded one (the bundled Valkey unless --server
names another binary, e.g. /usr/bin/redis-server), started once for the run;
or --url redis://127.0.0.1:PORT/DB of a running server (loopback addresses
only: 127.0.0.1 or ::1).  The database is FLUSHed between cases; with --url
the bench refuses a non-empty database unless --allow-flush.  Every loop is
bounded by its message count and by --timeout seconds per case.  Clients run
in worker processes (multiprocessing, spawn) started once and reused.

    python bench/queue_bench.py
    python bench/queue_bench.py --server /usr/bin/redis-server --json /tmp/q.json
    python bench/queue_bench.py --quick
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import multiprocessing as mp
import signal
import threading
import time
import traceback
from urllib.parse import urlsplit

SYSTEMS = ("fastbus", "fastbus-ackget", "fastbus-prefetch", "streams", "list")
LABEL = {"fastbus": "fastbus WorkQueue", "fastbus-ackget": "fastbus WorkQueue, get(ack=prev)",
         "fastbus-prefetch": "fastbus WorkQueue, get(ack=prev), prefetch 16",
         "streams": "Redis Streams (redis-py)",
         "list": "rmq-style list (redis-py)"}
QUEUE = "bench"                       # fastbus queue / topic name
STREAM, GROUP, CNAME = "bench:stream", "g", "c1"
LREADY, LPROC = "bench:list:ready", "bench:list:processing"
TAG = "bench-consumer"
# the commands the clients send (scripts' inner commands are other ones: RPUSH, LPOP, HSET...)
TOP_LEVEL = ("evalsha", "eval", "blpop", "xadd", "xreadgroup", "xack", "lpush", "blmove", "lmove", "lrem")
IDLE = 5.0                            # a consumer that gets nothing for this long gives up


def payloads(n: int, size: int, start: int = 0) -> list[bytes]:
    """n distinct payloads of size bytes: a 10-digit index, then padding."""
    pad = b"x" * (size - 10)
    return [b"%010d" % i + pad for i in range(start, start + n)]


# -- the three systems: put / take / ack, the same loop drives them all --------


class Fastbus:
    def __init__(self, url: str) -> None:
        from fastbus.queue import WorkQueue
        self.q = WorkQueue(QUEUE, url)
        self.c = None

    def putter(self, b: int):
        if b == 1:
            put = self.q.put
            return lambda batch: put(batch[0])
        return self.q.put_many

    def taker(self, b: int):
        self.c = c = self.q.consumer(TAG)
        if b == 1:
            get = c.get

            def take(timeout):
                m = get(timeout)
                return ([m], [m.payload]) if m is not None else ((), ())
        else:
            get_many = c.get_many

            def take(timeout):
                ms = get_many(b, timeout)
                return ms, [m.payload for m in ms]

        def ack(ms):
            c.ack(*ms)
        return take, ack

    def close(self) -> None:
        if self.c is not None:
            self.c.close()
        self.q.close()


class FastbusAckGet(Fastbus):
    """fastbus, a worker's loop as ``m = c.get(ack=m)`` (B=1): each ack goes
    in the round trip of the next get; the last one (``expect`` reached)
    on its own.  B > 1 as fastbus."""

    expect = 0
    prefetch = 1

    def taker(self, b: int):
        if b != 1:
            return super().taker(b)
        # (prefetch only where asked: a build before it takes no such argument)
        self.c = c = self.q.consumer(TAG, **({"prefetch": self.prefetch} if self.prefetch > 1 else {}))
        get = c.get
        pending: list = []
        taken = 0

        def take(timeout):
            nonlocal taken
            m = get(timeout, ack=pending.pop() if pending else None)
            if m is None:
                return (), ()
            taken += 1
            return [m], [m.payload]

        def ack(ms):
            if taken >= self.expect:
                c.ack(*ms)                       # the last: nothing follows to carry it
            else:
                pending.extend(ms)
        return take, ack


class Streams:
    def __init__(self, url: str) -> None:
        import redis
        self.r = redis.Redis.from_url(url)

    def putter(self, b: int):
        r = self.r
        if b == 1:
            return lambda batch: r.xadd(STREAM, {"d": batch[0]})
        pipe = r.pipeline(transaction=False)

        def put(batch):
            for p in batch:
                pipe.xadd(STREAM, {"d": p})
            pipe.execute()
        return put

    def taker(self, b: int):
        r = self.r

        def take(timeout):
            res = r.xreadgroup(GROUP, CNAME, {STREAM: ">"}, count=b, block=max(1, int(timeout * 1000)))
            if not res:
                return (), ()
            entries = res[0][1]
            return [e[0] for e in entries], [e[1][b"d"] for e in entries]

        def ack(ids):
            r.xack(STREAM, GROUP, *ids)
        return take, ack

    def close(self) -> None:
        self.r.close()


class ListQueue:
    def __init__(self, url: str) -> None:
        import redis
        self.r = redis.Redis.from_url(url)

    def putter(self, b: int):
        r = self.r
        if b == 1:
            return lambda batch: r.lpush(LREADY, batch[0])
        pipe = r.pipeline(transaction=False)

        def put(batch):
            for p in batch:
                pipe.lpush(LREADY, p)
            pipe.execute()
        return put

    def taker(self, b: int):
        r = self.r
        if b == 1:
            def take(timeout):
                p = r.blmove(LREADY, LPROC, timeout, "RIGHT", "LEFT")
                return ((p,), (p,)) if p is not None else ((), ())

            def ack(ps):
                r.lrem(LPROC, 1, ps[0])
            return take, ack
        pipe = r.pipeline(transaction=False)

        def take(timeout):
            pipe.blmove(LREADY, LPROC, timeout, "RIGHT", "LEFT")
            for _ in range(b - 1):
                pipe.lmove(LREADY, LPROC, "RIGHT", "LEFT")
            got = [p for p in pipe.execute() if p is not None]
            return got, got

        def ack(ps):
            for p in ps:
                pipe.lrem(LPROC, 1, p)
            pipe.execute()
        return take, ack

    def close(self) -> None:
        self.r.close()


class FastbusPrefetch(FastbusAckGet):
    """fastbus-ackget's loop on a consumer taking 16 ahead (B=1)."""

    prefetch = 16


CLASSES = {"fastbus": Fastbus, "fastbus-ackget": FastbusAckGet, "fastbus-prefetch": FastbusPrefetch,
           "streams": Streams, "list": ListQueue}


def setup_system(r, system: str) -> None:
    """After the flush, before the clients start."""
    if system == "streams":
        r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)


def leftover(r, system: str) -> int:
    """Messages still in the queue or unacked after a case."""
    if system.startswith("fastbus"):
        ns = f"fastbus:q:{{{QUEUE}}}:"
        n = r.llen(ns + "ready")
        for tag in r.smembers(ns + "consumers"):
            n += r.hlen(ns + "unacked:" + tag.decode())
        return n
    if system == "streams":
        pend = r.xpending(STREAM, GROUP)["pending"]
        info = r.xinfo_groups(STREAM)[0]
        return pend + int(info.get("lag") or 0)
    return r.llen(LREADY) + r.llen(LPROC)


# -- the loops -------------------------------------------------------------


def produce(put, items: list[bytes], b: int, deadline: float) -> tuple[int, str]:
    clock = time.perf_counter
    sent = 0
    n = len(items)
    while sent < n:
        if clock() > deadline:
            return sent, f"producer timed out after {sent:,} of {n:,}"
        put(items[sent:sent + b])
        sent += b
    return n, "ok"


def consume(take, ack, n: int, deadline: float) -> dict:
    """Take and ack until n messages are acked (or the deadline, or IDLE
    seconds without a message); returns counts and the time of the last ack."""
    clock = time.perf_counter
    kept = []
    keep = kept.append
    got = 0
    status = "ok"
    last = clock()
    while got < n:
        handles, ps = take(0.2)
        now = clock()
        if not ps:
            if now > deadline:
                status = f"consumer timed out after {got:,} of {n:,}"
                break
            if now - last > IDLE:
                status = f"consumer got nothing for {IDLE:.0f} s after {got:,} of {n:,}"
                break
            continue
        ack(handles)
        got += len(ps)
        keep(ps)
        last = clock()
        if last > deadline:
            status = f"consumer timed out after {got:,} of {n:,}"
            break
    end, cpu = clock(), time.process_time()
    return {"end": end, "cpu_end": cpu, "received": got, "distinct": distinct(kept), "status": status}


def distinct(batches: list) -> int:
    """How many distinct payloads (by their index) the batches hold: checked
    after the clock stopped, so that the check costs the timed loop nothing
    but keeping a reference to each batch."""
    seen: set[bytes] = set()
    for ps in batches:
        seen.update([p[:10] for p in ps])
    return len(seen)


# -- worker processes --------------------------------------------------------


def _wait_go(conn, limit: float = 120.0) -> None:
    conn.send(("ready", None))
    if not conn.poll(limit):
        raise RuntimeError("no go signal from the parent")
    if conn.recv() != "go":
        raise RuntimeError("unexpected message from the parent")


def task_produce(conn, url, system, n, size, batch, timeout):
    s = CLASSES[system](url)
    put = s.putter(batch)
    items = payloads(n, size)
    _wait_go(conn)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    sent, status = produce(put, items, batch, t0 + timeout)
    t1 = time.perf_counter()
    cpu = time.process_time() - cpu0
    s.close()
    return {"start": t0, "end": t1, "sent": sent, "status": status, "cpu": cpu}


def task_consume(conn, url, system, n, batch, timeout):
    s = CLASSES[system](url)
    s.expect = n
    take, ack = s.taker(batch)
    _wait_go(conn)
    cpu0 = time.process_time()
    r = consume(take, ack, n, time.perf_counter() + timeout)
    r["cpu"] = r.pop("cpu_end") - cpu0
    s.close()
    return r


def task_sequential(conn, url, system, n, size, batch, timeout):
    s = CLASSES[system](url)
    s.expect = n
    put = s.putter(batch)
    take, ack = s.taker(batch)
    items = payloads(n, size)
    _wait_go(conn)
    clock = time.perf_counter
    cpu0 = time.process_time()
    t0 = clock()
    deadline = t0 + timeout
    kept = []
    got = sent = 0
    status = "ok"
    while sent < n:
        if clock() > deadline:
            status = f"timed out after {got:,} of {n:,}"
            break
        put(items[sent:sent + batch])
        sent += batch
        while got < sent:
            handles, ps = take(1.0)
            if not ps:
                status = f"nothing to get after {got:,} of {sent:,} put"
                break
            ack(handles)
            got += len(ps)
            kept.append(ps)
        if status != "ok":
            break
    t1 = clock()
    cpu = time.process_time() - cpu0
    s.close()
    return {"start": t0, "end": t1, "received": got, "distinct": distinct(kept), "status": status, "cpu": cpu}


def _one_reader(system: str, url: str):
    """(read one ready message -> handle, ack(handle)) for the latency runs."""
    if system.startswith("fastbus"):
        s = Fastbus(url)
        c = s.c = s.q.consumer(TAG)
        return s, (lambda: c.get(1.0)), c.ack
    import redis
    s = Streams(url) if system == "streams" else ListQueue(url)
    r: redis.Redis = s.r
    if system == "streams":
        def read():
            return r.xreadgroup(GROUP, CNAME, {STREAM: ">"}, count=1)[0][1][0][0]
        return s, read, (lambda mid: r.xack(STREAM, GROUP, mid))
    return s, (lambda: r.lmove(LREADY, LPROC, "RIGHT", "LEFT")), (lambda p: r.lrem(LPROC, 1, p))


def task_latency(conn, url, system, n, size, timeout):
    s, read, ack = _one_reader(system, url)
    put = s.putter(1000)
    items = payloads(n, size)
    for i in range(0, n, 1000):
        put(items[i:i + 1000])
    _wait_go(conn)
    clock = time.perf_counter_ns
    deadline = time.perf_counter() + timeout
    reads, totals = [], []
    for _ in range(n):
        t0 = clock()
        h = read()
        t1 = clock()
        if h is None:
            raise RuntimeError(f"{system}: no message ready")
        ack(h)
        t2 = clock()
        reads.append(t1 - t0)
        totals.append(t2 - t0)
        if time.perf_counter() > deadline:
            break
    s.close()
    return {"read_ns": reads, "read_ack_ns": totals}


def task_wake_consumer(conn, url, system, rounds, timeout):
    """Blocked reads; the parent puts one message per round after "armed"."""
    s = CLASSES[system](url)
    take, ack = s.taker(1)
    _wait_go(conn)
    clock = time.perf_counter_ns
    lat = []
    deadline = time.perf_counter() + timeout
    for _ in range(rounds):
        if time.perf_counter() > deadline:
            break
        conn.send(("armed", None))
        handles, ps = take(5.0)
        t = clock()
        if not ps:
            conn.send(("armed", "nothing came"))
            break
        lat.append(t - int(ps[0][:20]))
        ack(handles)
    s.close()
    return {"wake_ns": lat}


def _drain_topic(url, cname, m, timeout, out, i):
    from fastbus.queue import Topic
    t = Topic(QUEUE, url)
    c = t.consumer(cname, tag=f"{cname}-1", register=False)
    try:
        out[i] = consume(lambda to: _topic_take(c, to), lambda ms: c.ack(*ms), m, time.perf_counter() + timeout)
    finally:
        c.close()
        t.close()


def _topic_take(c, timeout):
    ms = c.get_many(1000, timeout)
    return ms, [m.payload for m in ms]


def task_fan_consume(conn, url, names, m, timeout):
    out = [None] * len(names)
    _wait_go(conn)
    cpu0 = time.process_time()
    if len(names) == 1:
        _drain_topic(url, names[0], m, timeout, out, 0)
    else:
        threads = [threading.Thread(target=_drain_topic, args=(url, n, m, timeout, out, i))
                   for i, n in enumerate(names)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout + 30)
    return {"consumers": out, "cpu": time.process_time() - cpu0}


def task_fan_publish(conn, url, m, size, timeout):
    from fastbus.queue import Topic
    t = Topic(QUEUE, url)
    items = payloads(m, size)
    _wait_go(conn)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + timeout
    sent, status = 0, "ok"
    while sent < m:
        if time.perf_counter() > deadline:
            status = f"publisher timed out after {sent:,} of {m:,}"
            break
        t.publish_many(items[sent:sent + 1000])
        sent += 1000
    t1 = time.perf_counter()
    cpu = time.process_time() - cpu0
    t.close()
    return {"start": t0, "end": t1, "sent": min(sent, m), "status": status, "cpu": cpu}


TASKS = {f.__name__[5:]: f for f in (task_produce, task_consume, task_sequential, task_latency,
                                      task_wake_consumer, task_fan_consume, task_fan_publish)}


def _worker(conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        name, kwargs = msg
        try:
            conn.send(("done", TASKS[name](conn, **kwargs)))
        except Exception:  # noqa: BLE001 - reported to the parent
            conn.send(("error", traceback.format_exc()))


class Pool:
    """Worker processes, started on demand and reused across cases."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.workers: list = []

    def _take(self, k: int) -> list:
        while len(self.workers) < k:
            parent, child = self.ctx.Pipe()
            p = self.ctx.Process(target=_worker, args=(child,), daemon=True)
            p.start()
            child.close()
            self.workers.append((p, parent))
        return self.workers[:k]

    def start(self, tasks: list[tuple[str, dict]]) -> list:
        """Send the tasks; wait until every worker has set up and is ready."""
        ws = self._take(len(tasks))
        for (_, conn), task in zip(ws, tasks):
            conn.send(task)
        for (_, conn), (name, _) in zip(ws, tasks):
            kind, val = self._recv(conn, 120.0, name)
            if kind != "ready":
                raise RuntimeError(f"worker {name} failed to start:\n{val}")
        return ws

    @staticmethod
    def go(ws) -> None:
        for _, conn in ws:
            conn.send("go")

    def _recv(self, conn, limit: float, what: str):
        if not conn.poll(limit):
            self.kill()
            raise RuntimeError(f"worker {what}: no answer in {limit:.0f} s (workers killed)")
        kind, val = conn.recv()
        if kind == "error":
            self.kill()
            raise RuntimeError(f"worker {what} failed:\n{val}")
        return kind, val

    def collect(self, ws, limit: float, names) -> list:
        deadline = time.monotonic() + limit
        out = []
        for (_, conn), name in zip(ws, names):
            kind, val = self._recv(conn, max(1.0, deadline - time.monotonic()), name)
            assert kind == "done", kind
            out.append(val)
        return out

    def kill(self) -> None:
        for p, conn in self.workers:
            if p.is_alive():
                p.terminate()
                p.join(5)
            conn.close()
        self.workers = []

    def close(self) -> None:
        for p, conn in self.workers:
            try:
                conn.send(None)
            except OSError:
                pass
        for p, conn in self.workers:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
            conn.close()
        self.workers = []


# -- the cases, run from the parent ------------------------------------------------


class Bench:
    def __init__(self, url: str, args) -> None:
        import redis
        self.url = url
        self.args = args
        self.r = redis.Redis.from_url(url)
        self.pool = Pool()

    def fresh(self) -> None:
        self.r.execute_command("FLUSHDB", "SYNC")     # Valkey 8+ flushes lazily (async) by default

    def server_cpu(self) -> float:
        i = self.r.info("cpu")
        return float(i["used_cpu_sys"]) + float(i["used_cpu_user"])

    def commandstats(self) -> dict:
        """{command: [calls, usec]} since the last CONFIG RESETSTAT (commands
        run inside scripts are counted under their own names as well)."""
        out = {}
        for k, v in self.r.info("commandstats").items():
            out[k.removeprefix("cmdstat_")] = [int(v["calls"]), int(v["usec"])]
        return out

    def memory(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def throughput(self, mode: str, system: str, b: int, n: int) -> dict:
        a = self.args
        self.fresh()
        setup_system(self.r, system)
        mem0 = self.memory()
        if mode == "concurrent":
            # the consumer first: it registers before the producer starts
            kw = {"url": self.url, "system": system, "n": n, "batch": b, "timeout": a.timeout}
            tasks = [("consume", kw), ("produce", {**kw, "size": a.size})]
        else:
            tasks = [("sequential", {"url": self.url, "system": system, "n": n, "size": a.size, "batch": b,
                                     "timeout": a.timeout})]
        ws = self.pool.start(tasks)
        self.r.config_resetstat()
        cpu0 = self.server_cpu()
        self.pool.go(ws)
        res = self.pool.collect(ws, a.timeout + 60, [t[0] for t in tasks])
        scpu = self.server_cpu() - cpu0
        cmds = self.commandstats()
        if mode == "concurrent":
            cons, prod = res
            start, end = prod["start"], cons["end"]
            status = prod["status"] if prod["status"] != "ok" else cons["status"]
            extra = {"producer_s": prod["end"] - prod["start"], "producer_cpu_s": prod["cpu"],
                     "consumer_cpu_s": cons["cpu"]}
        else:
            cons = res[0]
            start, end, status = cons["start"], cons["end"], cons["status"]
            extra = {"client_cpu_s": cons["cpu"]}
        mem = self.memory() - mem0
        left = leftover(self.r, system)
        elapsed = end - start
        got, distinct = cons["received"], cons["distinct"]
        problems = []
        if got != distinct:
            problems.append(f"DUPLICATED {got - distinct:,}")
        if distinct < n:
            problems.append(f"LOST/UNDELIVERED {n - distinct:,}")
        if status != "ok":
            problems.append(status.upper())
        r = {"section": "throughput", "mode": mode, "system": system, "batch": b, "messages": n,
             "size": a.size, "elapsed_s": elapsed, "msgs_per_s": got / elapsed if elapsed > 0 else 0.0,
             "received": got, "distinct": distinct, "leftover": left, "server_cpu_s": scpu,
             "server_cpu_pct": 100 * scpu / elapsed if elapsed > 0 else 0.0,
             "server_us_per_msg": 1e6 * scpu / max(1, got), "server_mem_after_bytes": mem,
             "check": "; ".join(problems) or "ok", "commandstats": cmds,
             "client_cmds_per_msg": sum(cmds.get(c, [0])[0] for c in TOP_LEVEL) / max(1, got),
             "server_cmd_us_per_msg": sum(cmds.get(c, [0, 0])[1] for c in TOP_LEVEL) / max(1, got),
             **extra}
        self.fresh()
        return r

    def latency(self, system: str, n: int) -> dict:
        a = self.args
        self.fresh()
        setup_system(self.r, system)
        ws = self.pool.start([("latency", {"url": self.url, "system": system, "n": n, "size": a.size,
                                           "timeout": a.timeout})])
        self.pool.go(ws)
        res = self.pool.collect(ws, a.timeout + 60, ["latency"])[0]
        self.fresh()
        return {"section": "latency", "system": system, "gets": len(res["read_ns"]),
                "read_us": pct(res["read_ns"]), "read_ack_us": pct(res["read_ack_ns"])}

    def wakeup(self, system: str, rounds: int) -> dict:
        a = self.args
        self.fresh()
        setup_system(self.r, system)
        s = CLASSES[system](self.url)
        put = s.putter(1)
        ws = self.pool.start([("wake_consumer", {"url": self.url, "system": system, "rounds": rounds,
                                                 "timeout": a.timeout})])
        self.pool.go(ws)
        conn = ws[0][1]
        pad = b"x" * max(0, a.size - 20)
        deadline = time.monotonic() + a.timeout + 10
        kind, val = None, "no answer"
        try:
            while time.monotonic() < deadline:
                if not conn.poll(max(0.1, deadline - time.monotonic())):
                    break
                kind, val = conn.recv()
                if kind != "armed" or val is not None:
                    break
                time.sleep(0.003)                # the consumer is blocked by now
                put([b"%020d" % time.perf_counter_ns() + pad])
            if kind == "error":
                raise RuntimeError(f"wake-up consumer failed:\n{val}")
            if kind != "done":
                self.pool.kill()
                raise RuntimeError(f"wake-up consumer: {val}")
            res = val
        finally:
            s.close()
        self.fresh()
        return {"section": "wakeup", "system": system, "rounds": len(res["wake_ns"]), "wake_us": pct(res["wake_ns"])}

    def fanout(self, k: int, m: int) -> dict:
        from fastbus.queue import Topic
        a = self.args
        names = [f"c{i}" for i in range(k)]
        # publishing alone: K registered consumers, nobody reading
        self.fresh()
        with Topic(QUEUE, self.url) as t:
            for n in names:
                t.register(n)
        pub = ("fan_publish", {"url": self.url, "m": m, "size": a.size, "timeout": a.timeout})
        ws = self.pool.start([pub])
        self.pool.go(ws)
        alone = self.pool.collect(ws, a.timeout + 60, ["fan_publish"])[0]
        # publishing while K consumers drain
        self.fresh()
        with Topic(QUEUE, self.url) as t:
            for n in names:
                t.register(n)
        procs = max(1, min(k, a.fanout_procs))
        groups = [names[i::procs] for i in range(procs)]
        tasks = [("fan_consume", {"url": self.url, "names": g, "m": m, "timeout": a.timeout}) for g in groups]
        tasks.append(pub)
        ws = self.pool.start(tasks)
        cpu0 = self.server_cpu()
        self.pool.go(ws)
        res = self.pool.collect(ws, a.timeout + 90, [t[0] for t in tasks])
        scpu = self.server_cpu() - cpu0
        pub = res[-1]
        consumers = [c for r in res[:-1] for c in r["consumers"]]
        problems = []
        if pub["status"] != "ok" or alone["status"] != "ok":
            problems.append((pub["status"] if pub["status"] != "ok" else alone["status"]).upper())
        for name, c in zip([n for g in groups for n in g], consumers):
            if c is None:
                problems.append(f"consumer {name} FAILED")
                continue
            if c["received"] != c["distinct"]:
                problems.append(f"{name} DUPLICATED {c['received'] - c['distinct']:,}")
            if c["distinct"] < m:
                problems.append(f"{name} LOST/UNDELIVERED {m - c['distinct']:,}")
            if c["status"] != "ok":
                problems.append(f"{name}: {c['status'].upper()}")
        end = max((c["end"] for c in consumers if c), default=pub["end"])
        elapsed = end - pub["start"]
        delivered = sum(c["received"] for c in consumers if c)
        self.fresh()
        return {"section": "fanout", "consumers": k, "processes": procs, "messages": m, "size": a.size,
                "publish_alone_s": alone["end"] - alone["start"],
                "publish_alone_per_s": alone["sent"] / (alone["end"] - alone["start"]),
                "publish_s": pub["end"] - pub["start"], "publish_per_s": pub["sent"] / (pub["end"] - pub["start"]),
                "elapsed_s": elapsed, "delivered": delivered, "delivered_per_s": delivered / elapsed,
                "server_cpu_pct": 100 * scpu / elapsed, "publisher_cpu_s": pub["cpu"],
                "consumers_cpu_s": sum(r["cpu"] for r in res[:-1]), "check": "; ".join(problems) or "ok"}


def pct(ns: list[int]) -> dict:
    if not ns:
        return {}
    s = sorted(ns)

    def q(f):
        return s[min(len(s) - 1, int(f * len(s)))] / 1000.0
    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p99.9": q(0.999), "max": s[-1] / 1000.0,
            "mean": sum(s) / len(s) / 1000.0}


# -- output ---------------------------------------------------------------------


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def report(results: list[dict], systems: list[str], head: str) -> None:
    print(f"\n{head}\n")
    thr = [r for r in results if r["section"] == "throughput"]
    if thr:
        print("### put -> get -> ack, messages/s (end to end)\n")
        cols = " | ".join(LABEL[s] for s in systems)
        print(f"| mode | batch | {cols} | fastbus / Streams | fastbus / list |")
        print("|---|---|" + "---|" * (len(systems) + 2))
        for mode, b in dict.fromkeys((r["mode"], r["batch"]) for r in thr):
            row = {r["system"]: r for r in thr if r["mode"] == mode and r["batch"] == b}
            cells = []
            for s in systems:
                r = row.get(s)
                cells.append("-" if r is None else f"{r['msgs_per_s']:,.0f}" +
                             ("" if r["check"] == "ok" else f" **{r['check']}**"))
            fb = row.get("fastbus", {}).get("msgs_per_s")
            print(f"| {mode} | {b} | " + " | ".join(cells) +
                  f" | {_ratio(fb, row.get('streams', {}).get('msgs_per_s'))}"
                  f" | {_ratio(fb, row.get('list', {}).get('msgs_per_s'))} |")
        print("\n### Where the time goes (per case)\n")
        print("| mode | batch | system | messages | elapsed s | server CPU % | server CPU us/msg | "
              "of which in commands | client commands/msg | producer CPU s | consumer CPU s | "
              "server memory after | left in queue | check |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in thr:
            pc = r.get("producer_cpu_s")
            cc = r.get("consumer_cpu_s", r.get("client_cpu_s"))
            print(f"| {r['mode']} | {r['batch']} | {r['system']} | {r['messages']:,} | {r['elapsed_s']:.2f} | "
                  f"{r['server_cpu_pct']:.0f} | {r['server_us_per_msg']:.2f} | {r['server_cmd_us_per_msg']:.2f} | "
                  f"{r['client_cmds_per_msg']:.2f} | "
                  f"{'-' if pc is None else f'{pc:.2f}'} | {cc:.2f}{'' if pc is not None else ' (one process)'} | "
                  f"{r['server_mem_after_bytes'] / 2**20:,.1f} MiB | {r['leftover']:,} | {r['check']} |")
    lat = {r["system"]: r for r in results if r["section"] == "latency"}
    wake = {r["system"]: r for r in results if r["section"] == "wakeup"}
    if lat or wake:
        print("\n### One at a time, microseconds (client side)\n")
        print("| system | read of a ready message p50 | p99 | p99.9 | max | read + ack p50 | p99 | "
              "blocked read woken by a put p50 | p99 | max |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        reads = {"fastbus": "get(timeout) + ack", "fastbus-ackget": "get(timeout) + ack (the latency run reads as fastbus)",
                 "fastbus-prefetch": "get(timeout) + ack (the latency run reads as fastbus)", "streams": "XREADGROUP COUNT 1 + XACK",
                 "list": "LMOVE + LREM"}
        for s in systems:
            if s not in lat and s not in wake:
                continue
            cells = []
            if s in lat:
                r, ra = lat[s]["read_us"], lat[s]["read_ack_us"]
                cells += [f"{r['p50']:.0f}", f"{r['p99']:.0f}", f"{r['p99.9']:.0f}", f"{r['max']:,.0f}",
                          f"{ra['p50']:.0f}", f"{ra['p99']:.0f}"]
            else:
                cells += ["-"] * 6
            if s in wake:
                w = wake[s]["wake_us"]
                cells += [f"{w['p50']:.0f}", f"{w['p99']:.0f}", f"{w['max']:,.0f}"]
            else:
                cells += ["-"] * 3
            print(f"| {s}: {reads[s]} | " + " | ".join(cells) + " |")
    fan = [r for r in results if r["section"] == "fanout"]
    if fan:
        print("\n### Topic fan-out: publish_many(1000) -> K logical consumers, get_many(1000) + ack\n")
        print("| logical consumers | processes x threads | messages | publish alone msg/s | "
              "publish while draining msg/s | delivered msg/s (M x K / elapsed) | elapsed s | "
              "server CPU % | check |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in fan:
            print(f"| {r['consumers']} | {r['processes']} x {-(-r['consumers'] // r['processes'])} | "
                  f"{r['messages']:,} | {r['publish_alone_per_s']:,.0f} | {r['publish_per_s']:,.0f} | "
                  f"{r['delivered_per_s']:,.0f} | {r['elapsed_s']:.2f} | {r['server_cpu_pct']:.0f} | "
                  f"{r['check']} |")
    # targets
    print("\n### Targets\n")
    fbb = [r for r in thr if r["system"] == "fastbus" and r["mode"] == "concurrent" and r["batch"] > 1]
    for r in fbb:
        st = next((x for x in thr if x["system"] == "streams" and x["mode"] == r["mode"]
                   and x["batch"] == r["batch"]), None)
        ok = r["msgs_per_s"] >= 200_000
        line = (f"- fastbus batch {r['batch']}: {r['msgs_per_s']:,.0f} msg/s end to end "
                f"({'met' if ok else 'NOT met'}: >= 200,000)")
        if st:
            line += (f"; {_ratio(r['msgs_per_s'], st['msgs_per_s'])} Redis Streams "
                     f"({'met' if r['msgs_per_s'] >= st['msgs_per_s'] else 'NOT met'}: >= 1x)")
        print(line)
    if "fastbus" in lat:
        p99 = lat["fastbus"]["read_us"]["p99"]
        print(f"- fastbus one-at-a-time get p99: {p99:,.0f} us ({'met' if p99 < 1000 else 'NOT met'}: < 1 ms)")
    bad = [r for r in results if r.get("check", "ok") != "ok"]
    if bad:
        print(f"\n**{len(bad)} case(s) FAILED their checks: see the check column.**")


# -- main ------------------------------------------------------------------------


def loopback_url(url: str) -> str:
    u = urlsplit(url)
    if u.scheme != "redis":
        raise SystemExit(f"--url must be redis://127.0.0.1:PORT[/DB] or redis://[::1]:PORT[/DB], not {url!r}")
    try:
        ok = ipaddress.ip_address(u.hostname or "") in (ipaddress.ip_address("127.0.0.1"),
                                                       ipaddress.ip_address("::1"))
    except ValueError:
        ok = False
    if not ok:
        raise SystemExit(f"--url: refusing {u.hostname!r}: this bench only talks to 127.0.0.1 or ::1")
    return url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("--server", help="server binary for the embedded server (default: fastbus's default, the bundled "
                         "Valkey), e.g. /usr/bin/redis-server")
    add("--url", help="use this running server instead: redis://127.0.0.1:PORT[/DB] or "
                      "redis://[::1]:PORT[/DB] (its database is FLUSHed between cases)")
    add("--allow-flush", action="store_true", help="with --url: flush the database even if it is not empty")
    add("--systems", default=",".join(SYSTEMS), help="among fastbus,streams,list (default: all)")
    add("--batches", default="1,100,1000", help="batch sizes B, 1..1000 (default 1,100,1000)")
    add("--modes", help="throughput modes: concurrent (producer and consumer processes at once), sequential "
                        "(one process: put B, get B, ack B) (default both; --quick: concurrent)")
    add("--messages", type=int, help="messages per case for B > 1 (default 200,000; --quick 20,000)")
    add("--messages-single", type=int, help="messages per case for B = 1 (default 20,000; --quick 2,000)")
    add("--size", type=int, default=100, help="payload bytes, >= 20 (default 100)")
    add("--latency-gets", type=int, help="one-at-a-time reads of ready messages per system "
                                         "(0: skip; default 5,000; --quick 1,000)")
    add("--wakeup-rounds", type=int, help="blocked-read wake-ups per system (0: skip; default 500; --quick 100)")
    add("--fanout", help="logical consumer counts for the Topic fan-out ('': skip; default 1,4,16; "
                         "--quick 1,4)")
    add("--fanout-messages", type=int, help="messages published per fan-out case (default 50,000; "
                                            "--quick 5,000)")
    add("--fanout-procs", type=int, default=4, help="at most this many consumer processes per fan-out "
                                                    "case; more logical consumers run as threads (default 4)")
    add("--rounds", type=int, default=1, help="throughput: best of this many rounds per case (default 1)")
    add("--timeout", type=float, help="seconds per case before it is aborted (default 60; --quick 20)")
    add("--quick", action="store_true", help="smoke run (< 20 s): smaller defaults, as listed above")
    add("--json", help="write the raw results (every case, all percentiles, commandstats) to this file")
    args = ap.parse_args()
    # --quick changes the defaults only: options given explicitly win
    for name, normal, quick in (("messages", 200_000, 20_000), ("messages_single", 20_000, 2_000),
                                ("latency_gets", 5000, 1000), ("wakeup_rounds", 500, 100),
                                ("fanout", "1,4,16", "1,4"), ("fanout_messages", 50_000, 5_000),
                                ("modes", "concurrent,sequential", "concurrent"), ("timeout", 60.0, 20.0)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else normal)
    systems = [s for s in args.systems.split(",") if s]
    if not systems or any(s not in SYSTEMS for s in systems):
        raise SystemExit(f"--systems: among {','.join(SYSTEMS)}")
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in ("concurrent", "sequential") for m in modes):
        raise SystemExit("--modes: concurrent and/or sequential")
    batches = [int(b) for b in args.batches.split(",") if b]
    if any(not 1 <= b <= 1000 for b in batches):
        raise SystemExit("--batches: between 1 and 1000 (fastbus sends at most 1000 per script call)")
    fanout = [int(k) for k in args.fanout.split(",") if k]
    if any(not 1 <= k <= 64 for k in fanout):
        raise SystemExit("--fanout: between 1 and 64 consumers")
    for name, lo, hi in (("messages", 1, 2_000_000), ("messages_single", 1, 1_000_000),
                         ("latency_gets", 0, 1_000_000), ("wakeup_rounds", 0, 100_000),
                         ("fanout_messages", 1000, 2_000_000), ("size", 20, 1 << 20), ("rounds", 1, 10),
                         ("fanout_procs", 1, 64)):
        if not lo <= getattr(args, name) <= hi:
            raise SystemExit(f"--{name.replace('_', '-')}: between {lo:,} and {hi:,}")
    if not 1 <= args.timeout <= 3600:
        raise SystemExit("--timeout: between 1 and 3600 seconds")
    if args.url and args.server:
        raise SystemExit("--url and --server exclude each other")

    from fastbus.redis import EmbeddedServer
    srv = None
    if args.url:
        url = loopback_url(args.url)
    else:
        srv = EmbeddedServer(args.server).start()
        url = srv.url
    bench = None
    results: list[dict] = []
    t_start = time.monotonic()
    try:
        bench = Bench(url, args)
        info = bench.r.info("server")
        name = "valkey" if "valkey_version" in info else "redis"
        version = info.get("valkey_version") or info.get("redis_version")
        if args.url and bench.r.dbsize() and not args.allow_flush:
            raise SystemExit("--url: the database is not empty and the bench flushes it; "
                             "pass --allow-flush, or another database (/DB)")
        import hiredis
        import redis
        head = (f"server: {name} {version}" + (f" ({srv.binary})" if srv else f" at {url}") +
                f"; redis-py {redis.__version__}, hiredis {hiredis.__version__}; payload {args.size} bytes; "
                f"{args.messages:,} messages per case for batches > 1, {args.messages_single:,} for batch 1")
        print(head, flush=True)
        for mode in modes:
            for b in batches:
                n = args.messages_single if b == 1 else args.messages
                for s in systems:
                    runs = [bench.throughput(mode, s, b, n) for _ in range(args.rounds)]
                    failed = [r for r in runs if r["check"] != "ok"]
                    best = failed[0] if failed else max(runs, key=lambda r: r["msgs_per_s"])
                    results.append(best)
                    print(f"{mode:10s} B={b:<5d} {s:8s} {best['msgs_per_s']:>10,.0f} msg/s  "
                          f"{best['elapsed_s']:6.2f} s  server CPU {best['server_cpu_pct']:3.0f}%  "
                          f"{best['check']}", flush=True)
        if args.latency_gets:
            for s in systems:
                r = bench.latency(s, args.latency_gets)
                results.append(r)
                print(f"latency {s:8s} read p50 {r['read_us']['p50']:.0f} us  p99 {r['read_us']['p99']:.0f} us",
                      flush=True)
        if args.wakeup_rounds:
            for s in systems:
                r = bench.wakeup(s, args.wakeup_rounds)
                results.append(r)
                print(f"wake-up {s:8s} p50 {r['wake_us']['p50']:.0f} us  p99 {r['wake_us']['p99']:.0f} us",
                      flush=True)
        for k in fanout:
            r = bench.fanout(k, args.fanout_messages)
            results.append(r)
            print(f"fan-out {k:2d} consumers: delivered {r['delivered_per_s']:,.0f} msg/s  publish "
                  f"{r['publish_per_s']:,.0f} msg/s (alone {r['publish_alone_per_s']:,.0f})  {r['check']}",
                  flush=True)
    finally:
        if bench is not None:
            bench.pool.close()
            bench.r.close()
        if srv is not None:
            srv.stop()
    report(results, systems, head)
    print(f"\n(total {time.monotonic() - t_start:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"head": head, "args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
