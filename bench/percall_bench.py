"""What one call costs the thread that makes it: ``publish()`` and
``get_message()`` of fastbus against pyzmq's ``send()`` and ``recv()``
through a libzmq proxy, in the same run.

On a machine with a core for every process (16 cores, bench/RESULTS.md)
the seed workload's throughput is set by these loops: one publishing
thread and one reading thread per process.  On 2 cores pubsub_bench mixes
them with the scheduling of four processes; here each side is measured
alone, against a real server and a real peer process on loopback:

  publish   this process publishes N 20-byte messages to 50 channels in
            turn as fast as it can (fastbus ``Client.publish``; zmq
            ``PUB.send(b"channel payload")``, seed 000's ZMQPubSub), while
            a subscriber process drains them
  read      a publisher process sends N messages as fast as it can; this
            process reads them one call per message as the seed does
            (fastbus ``PubSub.get_message()``; zmq ``recv(NOBLOCK)`` +
            partition + the message dict, seed 000's ZMQPubSub.listen(), a
            poll only when nothing is there, as pubsub_bench's reader)

For each: the calling thread's CPU per call (``time.thread_time``), the
whole process's (the library's own threads too), and wall time.  Run it
with another build's Python for a before/after; every loop is bounded by N
and by a timeout.

    python bench/percall_bench.py --messages 2000000 --rounds 3
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import Server  # noqa: E402

CHANNELS = [str(i).encode() for i in range(50)]
PAYLOAD = b"x" * 20

# The peer processes: a drain for "publish", a flat-out sender for "read".
_DRAIN = r"""
import sys, time
system, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
deadline = time.monotonic() + 300
got = 0
if system == "fastbus":
    import fastbus
    c = fastbus.Client(endpoint=addr)
    p = c.pubsub(ignore_subscribe_messages=True)
    p.subscribe(*[str(i) for i in range(50)])
    print("ready", flush=True)
    while got < n and time.monotonic() < deadline:
        got += len(p.get_batch(timeout=1.0))
else:
    import zmq
    s = zmq.Context().socket(zmq.SUB)
    s.rcvhwm = 0
    s.subscribe(b"")
    s.connect(addr)
    time.sleep(0.5)
    print("ready", flush=True)
    while got < n and time.monotonic() < deadline:
        if s.poll(1000):
            s.recv(); got += 1
print(got, flush=True)
"""

_SEND = r"""
import sys, time, itertools
system, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
chans = itertools.cycle([str(i).encode() for i in range(50)])
msg = b"x" * 20
if system == "fastbus":
    import fastbus
    c = fastbus.Client(endpoint=addr)
    deadline = time.monotonic() + 30
    while not c.is_wanted("7") and time.monotonic() < deadline:
        time.sleep(0.01)
    print("ready", flush=True)
    for _ in range(n):
        c.publish(next(chans), msg)
    c.close(timeout=120)
else:
    import zmq
    s = zmq.Context().socket(zmq.PUB)
    s.sndhwm = 0
    s.connect(addr)
    time.sleep(0.5)
    print("ready", flush=True)
    for _ in range(n):
        s.send(b"%s %s" % (next(chans), msg))
    s.close(linger=-1)
"""


def _peer(code: str, system: str, addr: str, n: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code, system, addr, str(n)], stdout=subprocess.PIPE, text=True)
    if p.stdout.readline().strip() != "ready":
        p.kill()
        raise SystemExit(f"{system}: the peer process did not start")
    return p


def _timed(loop) -> tuple[float, float, float]:
    t, c, w = time.thread_time(), time.process_time(), time.perf_counter()
    n = loop()
    return ((time.thread_time() - t) / n * 1e9, (time.process_time() - c) / n * 1e9,
            (time.perf_counter() - w) / n * 1e9)


def publish_case(system: str, srv: Server, n: int) -> tuple[float, float, float]:
    chans = itertools.cycle(CHANNELS)
    if system == "fastbus":
        import fastbus
        drain = _peer(_DRAIN, system, srv.endpoint, n)
        c = fastbus.Client(endpoint=srv.endpoint)
        deadline = time.monotonic() + 30
        while not c.is_wanted("7") and time.monotonic() < deadline:
            time.sleep(0.01)
        publish = c.publish

        def loop() -> int:
            for _ in range(n):
                publish(next(chans), PAYLOAD)
            return n
        out = _timed(loop)
        c.close(timeout=120)
    else:
        import zmq
        drain = _peer(_DRAIN, system, f"tcp://127.0.0.1:{srv.port2}", n)
        s = zmq.Context.instance().socket(zmq.PUB)
        s.sndhwm = 0
        s.connect(f"tcp://127.0.0.1:{srv.port}")
        time.sleep(0.5)
        send = s.send

        def loop() -> int:
            for _ in range(n):
                send(b"%s %s" % (next(chans), PAYLOAD))
            return n
        out = _timed(loop)
        s.close(linger=-1)
    got = int(drain.communicate(timeout=360)[0].strip() or 0)
    if got != n:
        raise SystemExit(f"{system} publish: {got:,} of {n:,} arrived")
    return out


def read_case(system: str, srv: Server, n: int) -> tuple[float, float, float]:
    if system == "fastbus":
        import fastbus
        c = fastbus.Client(endpoint=srv.endpoint)
        p = c.pubsub(ignore_subscribe_messages=True)
        p.subscribe(*CHANNELS)
        sender = _peer(_SEND, system, srv.endpoint, n)
        time.sleep(1.0)                           # a backlog: the reader is never idle
        get = p.get_message

        def loop() -> int:
            got = 0
            while got < n:
                if get(timeout=5.0) is None:
                    break
                got += 1
            return got
        out = _timed(loop)
        c.close()
    else:
        import zmq
        s = zmq.Context.instance().socket(zmq.SUB)
        s.rcvhwm = 0
        for ch in CHANNELS:
            s.subscribe(ch + b" ")
        s.connect(f"tcp://127.0.0.1:{srv.port2}")
        time.sleep(0.5)
        sender = _peer(_SEND, system, f"tcp://127.0.0.1:{srv.port}", n)
        time.sleep(1.0)
        recv = s.recv

        def loop() -> int:
            # As pubsub_bench's zmq reader: a poll, then what is there
            # without one (a poll per message would cost it 4 µs more).
            got = 0
            while got < n:
                if not s.poll(5000):
                    break
                for _ in range(1000):
                    try:
                        raw = recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    channel, _, data = raw.partition(b" ")       # seed 000's ZMQPubSub.listen()
                    {"type": "message", "channel": channel, "data": data}
                    got += 1
            return got
        out = _timed(loop)
        s.close(linger=0)
    sender.wait(timeout=360)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2_000_000, help="calls per case (at most 20,000,000)")
    ap.add_argument("--rounds", type=int, default=3, help="times each case runs (the median is reported)")
    args = ap.parse_args()
    if not 0 < args.messages <= 20_000_000 or not 0 < args.rounds <= 10:
        raise SystemExit("--messages must be 1..20,000,000 and --rounds 1..10")
    import fastbus
    print(f"fastbus {fastbus.__version__} from {os.path.dirname(fastbus.__file__)}", flush=True)
    results: dict[tuple[str, str], list] = {}
    for case, fn in (("publish", publish_case), ("read", read_case)):
        for r in range(args.rounds):
            for system in ("fastbus", "zmq"):       # alternated, so the machine's mood hits both
                srv = Server(system, lossless=True)
                try:
                    res = fn(system, srv, args.messages)
                finally:
                    srv.stop()
                results.setdefault((case, system), []).append(res)
                print(f"  {case} {system} round {r + 1}: {res[0]:,.0f} ns thread CPU, {res[1]:,.0f} ns process CPU, "
                      f"{res[2]:,.0f} ns wall a call", flush=True)

    def med(xs: list, i: int) -> float:
        return sorted(x[i] for x in xs)[len(xs) // 2]

    print("\n| call | fastbus: thread / process / wall ns | zmq: thread / process / wall ns | zmq / fastbus (thread) |")
    print("|---|---|---|---|")
    for case, what in (("publish", "publish() / send()"), ("read", "get_message() / recv()+dict")):
        fb, zq = results[(case, "fastbus")], results[(case, "zmq")]
        cells = [" / ".join(f"{med(x, i):,.0f}" for i in range(3)) for x in (fb, zq)]
        print(f"| {what} | {cells[0]} | {cells[1]} | {med(zq, 0) / med(fb, 0):.1f}x |")


if __name__ == "__main__":
    main()
