"""Messages lost across faults: fastbus, Redis and NATS in one run.

One publisher process sends 20-byte messages, each carrying its sequence
number and the time it was published, at ``--rate`` per second (paced as in
bench/latency_bench.py) for ``--seconds``, on one channel, to one subscriber
process.  Both reach the server through their own TCP forwarder
(tests/forwarder.py), so every case has the same path; at ``--fault-at``
seconds one fault strikes:

  sub-cut   the subscriber's forwarder cuts: its connection is reset (data
            in flight lost, as a network cut) and new connections are reset
            too, for ``--cut`` seconds (0.5)
  pub-cut   the same between the publisher and the server
  restart   the server is killed (SIGKILL) and started again on the same
            port ``--restart-delay`` seconds later (0.5); fastbus's broker
            with ``--broker-args`` each time, and with ``--journal`` a
            journal directory of its own for the case (kept across its
            restart)
  link-cut  (fastbus only, not in the default list) two brokers: the
            publisher's and, below it (``--upstream``), the subscriber's;
            the forwarder on the link between them cuts, as above
  none      (not in the default list) no fault: the baseline

The subscriber records every sequence number it receives, and when; after
the publisher has finished (and flushed) and ``--drain`` seconds more (2),
the case reports:

  sent       messages the publisher handed to its client (publish() called;
             those whose call raised are counted too, as ``pub errors``);
             ``sent/s`` the rate it achieved: a publish() that blocks through
             a fault makes it fall behind, then send back to back (for at
             most 8 s past ``--seconds``, then it stops: fewer are sent)
  received   data messages the subscriber got, duplicates included
  missed     sequence numbers sent and never received
  dups       received more than once; ``reordered``: received after a
             higher sequence number (first arrivals only)
  announced  the loss the client announced: the sum of the ``lost`` counts
             of fastbus's ``gap`` notices (Redis and NATS announce none)
  notices    what the subscriber was told besides data: fastbus's ``gap``,
             ``reconnect`` notices and errors raised; Redis's errors and its
             re-``subscribe`` confirmations; NATS's disconnected /
             reconnected callbacks; ``heard`` is when the first came after
             the fault began
  recovery   from the fault's start (the cut, or the kill) to the arrival of
             the first message published after the fault ended (the cut
             ended, or the server was started again: its start-up counts
             in the recovery); at least the fault's own length (0.5 s).
             "never": no message published after the fault arrived

The JSON line of a case (printed, and appended to ``--json``) has these and
more: ``missed_by_phase`` (the missed, by when they were published: before
the fault, during it, after it), ``missed_span_s`` (when the first and the
last missed were published, from the fault's start), ``pub_notices`` (what
the publisher's client said), ``broker_drops`` (fastbus's drop counters,
since the broker's last start).

Every system runs with its client's defaults (reconnection included), as a
new user would: fastbus's sync ``Client`` (``--client aio``: fastbus.aio's;
``sharded``: a ShardedClient over the one broker), redis-py's PubSub
(its default retries reconnect and resubscribe; an error that still escapes
is counted and the call retried after 50 ms), nats-py (reconnects on its own,
2 s apart after a failed attempt); ``jetstream`` is NATS's durable product
(``nats-server -js``, file storage, its store kept across the restart),
used as a careful user would: each publish awaits its PubAck (256 in
flight) and is tried again until acknowledged, under a ``Nats-Msg-Id`` the
server deduplicates by; a durable pull consumer fetches and acks.  redis-py's publish() is a round trip
(through the forwarder, twice a hop): where it cannot keep up with --rate,
``sent/s`` shows it.  Each case is bounded: its processes are killed
``--seconds`` + 15 s after the start.  Everything is on 127.0.0.1.

    python bench/fault_bench.py                                      # all systems, all faults
    python bench/fault_bench.py --systems fastbus --faults sub-cut --json /tmp/faults.jsonl
    python bench/fault_bench.py --systems fastbus --client sync,aio,sharded --faults none,sub-cut
    python bench/fault_bench.py --systems fastbus --broker-args "--session-linger 0"   # no session resume
    python bench/fault_bench.py --systems fastbus --journal --faults restart      # the broker journals
    python bench/fault_bench.py --systems fastbus --faults link-cut               # between two brokers
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(os.path.dirname(HERE), "tests"))
from forwarder import Forwarder  # noqa: E402
from latency_bench import PAD, STAMP, _apaced, _paced  # noqa: E402
from servers import Server  # noqa: E402

SYSTEMS = ("fastbus", "redis", "nats", "jetstream")
FAULTS = ("sub-cut", "pub-cut", "restart")
#: Faults not in the default list (link-cut: fastbus's brokers only).
MORE_FAULTS = ("link-cut", "none")
CLIENTS = ("sync", "aio", "sharded")
CHANNEL = "faults"
MAX_MESSAGES = 10_000_000
#: Seconds a publisher that fell behind may go on past --seconds; then it stops.
CATCH_UP = 8.0
#: Seconds a publisher's last flush may take.
FLUSH = 3.0
#: JetStream publishes awaiting their PubAck at once.
JS_WINDOW = 256


def _write(path: str, record: dict) -> None:
    with open(path + ".tmp", "wb") as f:
        pickle.dump(record, f)
    os.replace(path + ".tmp", path)


def _note(notes: list, kind: str, lost=None) -> None:
    notes.append((time.monotonic_ns(), kind, lost))


def _read(p, errors: type, running, take, notes: list) -> None:
    """A redis-py-shaped PubSub read while ``running()``: each message to
    ``take``; an error that escapes the client's own retries is noted and
    the read tried again 50 ms later."""
    while running():
        try:
            m = p.get_message(timeout=0.2)
        except errors as exc:
            _note(notes, "error:" + type(exc).__name__)
            time.sleep(0.05)
            continue
        if m is not None:
            take(m)


async def _nats_connect(port: int, notes: list):
    """nats-py's connection, its callbacks noted (what its user is told)."""
    import nats

    async def disconnected() -> None:
        _note(notes, "disconnected")

    async def reconnected() -> None:
        _note(notes, "reconnected")

    async def error(exc: Exception) -> None:
        _note(notes, "error:" + type(exc).__name__)

    return await nats.connect(f"nats://127.0.0.1:{port}", disconnected_cb=disconnected,
                              reconnected_cb=reconnected, error_cb=error)


async def _jetstream_stream(port: int) -> None:
    """The stream the JetStream cases publish into (file storage)."""
    import nats
    from nats.js.api import StorageType, StreamConfig
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    await nc.jetstream().add_stream(StreamConfig(name="FAULTS", subjects=[CHANNEL], storage=StorageType.FILE))
    await nc.close()


# -- the publisher ---------------------------------------------------------------

def publisher(system: str, client: str, port: int, rate: float, seconds: float, ready, go, done,
              path: str) -> None:
    """Publish seq 0, 1, ... when due; write each one's publish time (index:
    seq), the seqs whose publish raised, and what the client said.  A
    publisher that fell behind (a publish() that blocked through a fault)
    sends back to back, for at most CATCH_UP seconds more than ``seconds``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sent_ns, errors, notes = array("q"), array("q"), []
    now_ns = time.monotonic_ns
    out = {"sent_ns": sent_ns, "errors": errors, "notes": notes}
    if system == "fastbus" and client != "aio":
        import fastbus
        ep = f"tcp://127.0.0.1:{port}"
        c = fastbus.ShardedClient([ep]) if client == "sharded" else fastbus.Client(endpoint=ep)
        c.flush(10)                          # connected
        ready.set()
        if not go.wait(60):                  # (the bench is gone)
            return
        stop_at = now_ns() + int((seconds + CATCH_UP) * 1e9)
        publish = c.publish
        for i in _paced(rate, seconds, MAX_MESSAGES):
            t = now_ns()
            if t > stop_at:
                break
            sent_ns.append(t)
            try:
                publish(CHANNEL, STAMP.pack(t, i) + PAD)
            except fastbus.FastbusError as exc:
                errors.append(i)
                _note(notes, "error:" + type(exc).__name__)
        try:
            c.flush(FLUSH)
        except (fastbus.FastbusError, TimeoutError) as exc:
            _note(notes, "flush:" + type(exc).__name__)
        _write(path, out)
        done.set()
        c.close(5)
    elif system == "fastbus":
        import fastbus

        async def run() -> None:
            c = fastbus.aio.Client(endpoint=f"tcp://127.0.0.1:{port}")
            await c.flush(10)
            ready.set()
            if not await asyncio.to_thread(go.wait, 60):
                return
            stop_at = now_ns() + int((seconds + CATCH_UP) * 1e9)
            async for i in _apaced(rate, seconds, MAX_MESSAGES):
                t = now_ns()
                if t > stop_at:
                    break
                sent_ns.append(t)
                try:
                    await c.publish(CHANNEL, STAMP.pack(t, i) + PAD)
                except fastbus.FastbusError as exc:
                    errors.append(i)
                    _note(notes, "error:" + type(exc).__name__)
            try:
                await c.flush(FLUSH)
            except (fastbus.FastbusError, TimeoutError) as exc:
                _note(notes, "flush:" + type(exc).__name__)
            _write(path, out)
            done.set()
            await c.close(5)
        asyncio.run(run())
    elif system == "redis":
        import redis
        r = redis.Redis(host="127.0.0.1", port=port)
        r.ping()
        ready.set()
        if not go.wait(60):                  # (the bench is gone)
            return
        stop_at = now_ns() + int((seconds + CATCH_UP) * 1e9)
        for i in _paced(rate, seconds, MAX_MESSAGES):
            t = now_ns()
            if t > stop_at:
                break
            sent_ns.append(t)
            try:
                r.publish(CHANNEL, STAMP.pack(t, i) + PAD)
            except redis.RedisError as exc:
                errors.append(i)
                _note(notes, "error:" + type(exc).__name__)
        _write(path, out)
        done.set()
        r.close()
    elif system == "jetstream":
        async def run() -> None:
            nc = await _nats_connect(port, notes)
            js = nc.jetstream()
            ready.set()
            if not await asyncio.to_thread(go.wait, 60):
                return
            stop_at = now_ns() + int((seconds + CATCH_UP) * 1e9)
            inflight: set = set()

            async def publish(i: int, data: bytes) -> None:
                # As a careful JetStream user: each message acknowledged
                # (PubAck), tried again until it is, under a message id the
                # server deduplicates by (its duplicate window: 2 min).
                until = time.monotonic() + seconds + CATCH_UP
                while time.monotonic() < until:
                    try:
                        await js.publish(CHANNEL, data, timeout=1.0, headers={"Nats-Msg-Id": str(i)})
                        return
                    except Exception as exc:  # noqa: BLE001 - nats-py's errors have no common base
                        _note(notes, "error:" + type(exc).__name__)
                        await asyncio.sleep(0.05)
                errors.append(i)

            async for i in _apaced(rate, seconds, MAX_MESSAGES):
                t = now_ns()
                if t > stop_at:
                    break
                sent_ns.append(t)
                task = asyncio.ensure_future(publish(i, STAMP.pack(t, i) + PAD))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                if len(inflight) >= JS_WINDOW:
                    await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
            if inflight:
                await asyncio.wait(inflight, timeout=CATCH_UP)
            _write(path, out)
            done.set()
            await nc.close()
        asyncio.run(run())
    else:
        async def run() -> None:

            nc = await _nats_connect(port, notes)
            ready.set()
            if not await asyncio.to_thread(go.wait, 60):
                return
            stop_at = now_ns() + int((seconds + CATCH_UP) * 1e9)
            async for i in _apaced(rate, seconds, MAX_MESSAGES):
                t = now_ns()
                if t > stop_at:
                    break
                sent_ns.append(t)
                try:
                    await nc.publish(CHANNEL, STAMP.pack(t, i) + PAD)
                except Exception as exc:     # noqa: BLE001 - nats-py's errors have no common base
                    errors.append(i)
                    _note(notes, "error:" + type(exc).__name__)
            until = time.monotonic() + FLUSH
            while nc.is_reconnecting and time.monotonic() < until:
                await asyncio.sleep(0.05)    # (flush() would not wait: close() would drop what is pending)
            try:
                await nc.flush(timeout=FLUSH)
            except Exception as exc:  # noqa: BLE001
                _note(notes, "flush:" + type(exc).__name__)
            _write(path, out)
            done.set()
            await nc.close()
        asyncio.run(run())


# -- the subscriber --------------------------------------------------------------

def subscriber(system: str, client: str, port: int, ready, stop, path: str, limit: float) -> None:
    """Receive until ``stop`` (or ``limit`` seconds); write every seq received
    with its arrival time, and the notices (time, kind, lost)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    seqs, recv_ns, notes = array("q"), array("q"), []
    now_ns = time.monotonic_ns
    end = time.monotonic() + limit
    out = {"seqs": seqs, "recv_ns": recv_ns, "notes": notes}
    unpack = STAMP.unpack_from

    def running() -> bool:
        return not stop.is_set() and time.monotonic() < end

    def take(m) -> None:
        if m["type"] == "message":
            seqs.append(unpack(m["data"])[1])
            recv_ns.append(now_ns())
        elif m["type"] == "gap":
            _note(notes, "gap", m["data"].get("lost"))
        else:
            _note(notes, m["type"])

    if system == "fastbus" and client != "aio":
        import fastbus
        ep = f"tcp://127.0.0.1:{port}"
        c = fastbus.ShardedClient([ep]) if client == "sharded" else fastbus.Client(endpoint=ep)
        p = c.pubsub(ignore_subscribe_messages=True)
        p.subscribe(CHANNEL)                 # returns once in effect
        ready.set()
        _read(p, fastbus.FastbusError, running, take, notes)
        _write(path, out)
        c.close()
    elif system == "fastbus":
        import fastbus

        async def run() -> None:
            c = fastbus.aio.Client(endpoint=f"tcp://127.0.0.1:{port}")
            p = c.pubsub(ignore_subscribe_messages=True)
            await p.subscribe(CHANNEL)
            ready.set()
            while running():
                try:
                    m = await p.get_message(timeout=0.2)
                except fastbus.FastbusError as exc:
                    _note(notes, "error:" + type(exc).__name__)
                    await asyncio.sleep(0.05)
                    continue
                if m is not None:
                    take(m)
            _write(path, out)
            await c.close()
        asyncio.run(run())
    elif system == "redis":
        import redis
        r = redis.Redis(host="127.0.0.1", port=port)
        p = r.pubsub()
        p.subscribe(CHANNEL)
        if (m := p.get_message(timeout=5.0)) is None or m["type"] != "subscribe":
            raise SystemExit(f"redis subscriber: no confirmation ({m!r})")
        ready.set()
        _read(p, redis.RedisError, running, take, notes)
        _write(path, out)
        r.close()
    elif system == "jetstream":
        async def run() -> None:
            from nats.js.api import AckPolicy, ConsumerConfig
            nc = await _nats_connect(port, notes)
            js = nc.jetstream()
            # A durable pull consumer: what it did not ack stays on the
            # server, through cuts and restarts (file storage).
            psub = await js.pull_subscribe(CHANNEL, durable="faults", config=ConsumerConfig(ack_policy=AckPolicy.ALL))
            ready.set()
            while running():
                try:
                    msgs = await psub.fetch(batch=500, timeout=0.2)
                except Exception as exc:  # noqa: BLE001 - a fetch timeout, or the connection down
                    if type(exc).__name__ not in ("TimeoutError", "FetchTimeoutError"):
                        _note(notes, "error:" + type(exc).__name__)
                        await asyncio.sleep(0.05)
                    continue
                t = now_ns()
                for m in msgs:
                    seqs.append(unpack(m.data)[1])
                    recv_ns.append(t)
                if msgs:
                    try:
                        await msgs[-1].ack()        # (AckPolicy.ALL: everything up to it)
                    except Exception as exc:  # noqa: BLE001
                        _note(notes, "ack:" + type(exc).__name__)
            _write(path, out)
            await nc.close()
        asyncio.run(run())
    else:
        async def run() -> None:

            async def cb(msg) -> None:
                seqs.append(unpack(msg.data)[1])
                recv_ns.append(now_ns())

            nc = await _nats_connect(port, notes)
            await nc.subscribe(CHANNEL, cb=cb)
            await nc.flush()
            ready.set()
            while running():
                await asyncio.sleep(0.05)
            _write(path, out)
            await nc.close()
        asyncio.run(run())


# -- the faults ------------------------------------------------------------------

def relaunch(srv: Server, argv: list[str]) -> None:
    """Start ``srv``'s server again from ``argv`` (its command line), in its
    directory, on its port; returns once it accepts connections."""
    srv.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=srv.dir)
    srv._wait_listening()


def kill(srv: Server) -> list[str]:
    """SIGKILL the server, as a crash; its command line."""
    argv = list(srv.proc.args)
    srv.proc.kill()
    srv.proc.wait(10)
    return argv


def strike(fault: str, srv: Server, sub_fwd: Forwarder, pub_fwd: Forwarder, link_fwd: Forwarder | None,
           args) -> tuple[int, int]:
    """Apply ``fault``; the monotonic ns when it began and when it ended."""
    t0 = time.monotonic_ns()
    if fault == "none":
        return t0, t0
    if fault == "restart":
        argv = kill(srv)
        time.sleep(args.restart_delay)
        t1 = time.monotonic_ns()
        relaunch(srv, argv)
        return t0, t1
    fwd = sub_fwd if fault == "sub-cut" else link_fwd if fault == "link-cut" else pub_fwd
    fwd.cut(args.cut)
    deadline = time.monotonic() + args.cut + 10
    while fwd.restored_at is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if fwd.restored_at is None:
        raise RuntimeError("the forwarder did not end its cut")
    return t0, int(fwd.restored_at * 1e9)


# -- a case ----------------------------------------------------------------------

def analyse(pub: dict, sub: dict, t0: int, t1: int) -> dict:
    sent_ns, seqs, recv_ns = pub["sent_ns"], sub["seqs"], sub["recv_ns"]
    sent = len(sent_ns)
    seen: set[int] = set()
    top = -1
    reordered = 0
    recovery = None
    for s, r in zip(seqs, recv_ns):
        if recovery is None and r >= t0 and 0 <= s < sent and sent_ns[s] >= t1:
            recovery = (r - t0) / 1e9
        if s in seen:
            continue
        seen.add(s)
        if s < top:
            reordered += 1
        else:
            top = s
    missed = [s for s in range(sent) if s not in seen]
    phase = {"before": 0, "during": 0, "after": 0}   # the missed, by when they were published
    for s in missed:
        phase["before" if sent_ns[s] < t0 else "during" if sent_ns[s] < t1 else "after"] += 1
    notes = sub["notes"]
    kinds: dict[str, int] = {}
    for _t, kind, _lost in notes:
        kinds[kind] = kinds.get(kind, 0) + 1
    heard = [t for t, _k, _l in notes if t >= t0]
    span = (sent_ns[-1] - sent_ns[0]) / 1e9 if sent > 1 else 0.0
    return {"sent": sent, "received": len(seqs), "missed": len(missed), "duplicates": len(seqs) - len(seen),
            "reordered": reordered, "announced": sum(lost or 0 for _t, k, lost in notes if k == "gap"),
            "pub_errors": len(pub["errors"]), "notices": kinds,
            "pub_notices": sorted({k for _t, k, _l in pub["notes"]}),
            "heard_s": (min(heard) - t0) / 1e9 if heard else None, "recovery_s": recovery,
            "missed_by_phase": phase,
            "missed_span_s": [(sent_ns[missed[0]] - t0) / 1e9, (sent_ns[missed[-1]] - t0) / 1e9] if missed else None,
            "fault_s": (t1 - t0) / 1e9, "achieved_per_s": (sent - 1) / span if span else 0.0}


def run_case(system: str, client: str, fault: str, args) -> dict:
    label = system if system != "fastbus" or client == "sync" else f"fastbus ({client})"
    if system == "fastbus" and args.journal:
        label += f" --journal --fsync {args.fsync}"
    result = {"system": label, "fault": fault, "rate": args.rate, "seconds": args.seconds}
    srv = Server(system, lossless=False)
    below: Server | None = None               # link-cut: the subscriber's broker, below srv
    link_fwd: Forwarder | None = None
    fwds: list[Forwarder] = []
    procs: list = []
    tmp = tempfile.mkdtemp(prefix="faults-")
    paths = {k: os.path.join(tmp, k) for k in ("pub", "sub")}
    try:
        extra = shlex.split(args.broker_args)
        if system == "fastbus" and args.journal:
            extra += ["--journal", os.path.join(tmp, "journal"), "--fsync", args.fsync]
        if fault == "link-cut":
            if system != "fastbus":
                raise RuntimeError("link-cut is a fault between two fastbus brokers")
            extra += ["--allow-broker", "local"]
        if system == "fastbus" and extra:
            relaunch(srv, kill(srv) + extra)
        if system == "jetstream":
            asyncio.run(_jetstream_stream(srv.port))
        sub_port = srv.port
        if fault == "link-cut":
            link_fwd = Forwarder(srv.port)
            fwds.append(link_fwd)
            below = Server("fastbus", lossless=False)
            relaunch(below, kill(below) + shlex.split(args.broker_args) +
                     ["--upstream", f"tcp://127.0.0.1:{link_fwd.port}"])
            sub_port = below.port
        fwds += [Forwarder(sub_port), Forwarder(srv.port)]
        sub_fwd, pub_fwd = fwds[-2:]
        ctx = mp.get_context("spawn")
        sub_ready, pub_ready, go, done, stop = (ctx.Event() for _ in range(5))
        limit = args.seconds + 15
        sub = ctx.Process(target=subscriber, args=(system, client, sub_fwd.port, sub_ready, stop, paths["sub"],
                                                   limit + 30))
        pub = ctx.Process(target=publisher, args=(system, client, pub_fwd.port, args.rate, args.seconds,
                                                  pub_ready, go, done, paths["pub"]))
        procs = [sub, pub]
        for name, p, ready in (("subscriber", sub, sub_ready), ("publisher", pub, pub_ready)):
            p.start()
            until = time.monotonic() + 30
            while not ready.wait(0.1):
                if not p.is_alive() or time.monotonic() > until:
                    raise RuntimeError(f"the {name} did not start (exit code {p.exitcode})")
        time.sleep(0.5)                       # the publisher learns who subscribes
        start = time.monotonic()
        deadline = start + limit
        go.set()
        time.sleep(max(0.0, start + args.fault_at - time.monotonic()))
        t0, t1 = strike(fault, srv, sub_fwd, pub_fwd, link_fwd, args)
        done.wait(max(0.0, deadline - args.drain - time.monotonic()))
        time.sleep(max(0.0, min(args.drain, deadline - time.monotonic())))
        stop.set()
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
        if system == "fastbus":
            try:
                from fastbus.client import query_stats
                result["broker_drops"] = {k: v for k, v in query_stats(srv.endpoint, timeout=2)["drops"].items()
                                          if v}
            except Exception as exc:  # noqa: BLE001 - a detail of the report, never its failure
                result["broker_drops"] = f"unknown ({type(exc).__name__})"
        missing = [k for k, path in paths.items() if not os.path.exists(path)]
        if missing:
            raise RuntimeError(f"no results from the {' and '.join(missing)} "
                               f"(exit codes {[p.exitcode for p in procs]})")
        with open(paths["pub"], "rb") as f:
            pub_rec = pickle.load(f)
        with open(paths["sub"], "rb") as f:
            sub_rec = pickle.load(f)
        result.update(analyse(pub_rec, sub_rec, t0, t1))
    except Exception as exc:  # noqa: BLE001 - one failed case is reported; the others still run
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        for f in fwds:
            f.close()
        srv.stop()
        if below is not None:
            below.stop()
        for path in paths.values():
            if os.path.exists(path):
                os.unlink(path)
        shutil.rmtree(tmp, ignore_errors=True)
    return result


# -- the report ------------------------------------------------------------------

def _secs(x) -> str:
    return "never" if x is None else f"{x:.2f} s"


def table(results: list[dict]) -> str:
    lines = ["| system | fault | sent | sent/s | received | missed | dups | reordered | announced | pub errors | "
             "notices (subscriber) | heard | recovery |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['system']} | {r['fault']} | failed: {r['error']} |" + " |" * 10)
            continue
        notices = ", ".join(f"{k} x{n}" for k, n in sorted(r["notices"].items())) or "-"
        announced = f"{r['announced']:,}" if r["system"].startswith("fastbus") else "-"
        heard = "-" if r["heard_s"] is None else f"{r['heard_s'] * 1000:.0f} ms"
        recovery = "-" if r["fault"] == "none" else _secs(r["recovery_s"])
        lines.append(f"| {r['system']} | {r['fault']} | {r['sent']:,} | {r['achieved_per_s']:,.0f} | "
                     f"{r['received']:,} | {r['missed']:,} | {r['duplicates']:,} | {r['reordered']:,} | "
                     f"{announced} | {r['pub_errors']:,} | {notices} | {heard} | {recovery} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, of: " + ", ".join(SYSTEMS))
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help="comma-separated, of: " + ", ".join(FAULTS + MORE_FAULTS) + " (default: %(default)s)")
    ap.add_argument("--client", default="sync",
                    help="fastbus clients, comma-separated, each a row: " + ", ".join(CLIENTS) +
                         " (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=8.0, help="publishing time per case (default: %(default)s)")
    ap.add_argument("--rate", type=float, default=10_000, help="messages per second (default: %(default)s)")
    ap.add_argument("--fault-at", type=float, default=3.0, help="seconds after the start (default: %(default)s)")
    ap.add_argument("--cut", type=float, default=0.5, help="length of a cut, seconds (default: %(default)s)")
    ap.add_argument("--restart-delay", type=float, default=0.5,
                    help="seconds between the kill and the new start (default: %(default)s)")
    ap.add_argument("--drain", type=float, default=2.0,
                    help="seconds the subscriber keeps receiving after the publisher finished (default: %(default)s)")
    ap.add_argument("--broker-args", default="", help='more `fastbus broker` arguments, e.g. "--session-linger 0"')
    ap.add_argument("--journal", action="store_true",
                    help="fastbus's broker journals (--journal, a directory of its own per case)")
    ap.add_argument("--fsync", choices=("always", "everysec", "no"), default="everysec",
                    help="with --journal: the broker's --fsync (default: %(default)s)")
    ap.add_argument("--json", help="append one JSON line per case to this file")
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    faults = [f for f in args.faults.split(",") if f]
    clients = [c for c in args.client.split(",") if c]
    if not set(systems) <= set(SYSTEMS) or not systems:
        raise SystemExit(f"--systems: of {', '.join(SYSTEMS)}")
    if not set(faults) <= set(FAULTS + MORE_FAULTS) or not faults:
        raise SystemExit(f"--faults: of {', '.join(FAULTS + MORE_FAULTS)}")
    if "link-cut" in faults and systems != ["fastbus"]:
        raise SystemExit("--faults link-cut: a fault between two fastbus brokers (--systems fastbus)")
    if not set(clients) <= set(CLIENTS) or not clients:
        raise SystemExit(f"--client: of {', '.join(CLIENTS)}")
    if not 0 < args.rate <= 200_000 or not 0 < args.seconds <= 120:
        raise SystemExit("--rate must be in (0, 200000], --seconds in (0, 120]")
    if not 0 <= args.fault_at < args.seconds or not 0 < args.cut <= 30 or not 0 <= args.restart_delay <= 30:
        raise SystemExit("--fault-at must fall within --seconds; --cut in (0, 30]; --restart-delay in [0, 30]")
    results = []
    for system in systems:
        for client in (clients if system == "fastbus" else ["sync"]):
            for fault in faults:
                r = run_case(system, client, fault, args)
                results.append(r)
                print(json.dumps(r), flush=True)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(r) + "\n")
    print()
    print(f"{args.rate:,.0f} msg/s for {args.seconds:g} s, fault at {args.fault_at:g} s "
          f"(cut {args.cut:g} s, restart after {args.restart_delay:g} s)")
    print(table(results))


if __name__ == "__main__":
    main()
