"""Latency of the broker hop alone: a raw pyzmq DEALER publisher -> broker
-> a raw DEALER subscriber, speaking the fastbus protocol
(docs/PROTOCOL.md), one message per PUB batch, each sent when it is due
(paced with time.sleep), so that neither client batches anything.

Each message carries its send time (``time.monotonic_ns()``, one clock for
the machine); the subscriber records ``monotonic_ns() - sent`` when a DATA
batch arrives.  Reported: p50/p90/p99/p99.9/max in microseconds over the
messages after the first 10%.  Brokers are measured in turns, in one run,
each a fresh subprocess on a free loopback port:

    python bench/broker_hop.py                      # `fastbus broker` and the floor
    python bench/broker_hop.py --broker old="/path/to/old/venv/bin/python -m fastbus broker" \\
        --broker new="python -m fastbus broker" --broker floor --rates 1000,20000 --rounds 2

``floor`` is a minimal pyzmq ROUTER that forwards every PUB as DATA to every
subscriber, with no routing, batching or bookkeeping: what the machine,
pyzmq and the three processes cost by themselves.  Run it from outside the
repository (or with fastbus installed) so the compiled package is imported.
Every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from array import array

STAMP = struct.Struct("<qq")                 # sent time (ns), sequence number
PAD = b"." * 4                               # 20-byte messages
CHANNEL = b"lat"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hello(sock, pub: bool, name: str) -> None:
    sock.send_multipart([b"H", json.dumps({"v": 1, "role": "client", "pub": pub, "name": name}).encode()])


def run_sub(endpoint: str, n: int, seconds: float, out: str) -> None:
    import zmq

    import fastbus
    from fastbus import protocol as P
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.connect(endpoint)
    _hello(s, False, "hop-sub")
    s.send_multipart([P.SUB, P.pack_u64(1), P.encode_ops([(fastbus.SUBSCRIBE, CHANNEL, False)])])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if s.poll(1000) and s.recv_multipart()[0] == P.CONFIRM:
            break
    else:
        raise SystemExit("no CONFIRM")
    print("ready", flush=True)
    lat = array("q")
    end = time.monotonic() + seconds + 10
    now_ns = time.monotonic_ns
    while len(lat) < n and time.monotonic() < end:
        if not s.poll(200):
            continue
        frames = s.recv_multipart()
        t = now_ns()
        if frames[0] != P.DATA:
            continue
        for _topic, payload in fastbus.decode(frames[2]):
            lat.append(t - STAMP.unpack_from(payload)[0])
    with open(out, "wb") as f:
        lat.tofile(f)


def run_pub(endpoint: str, rate: float, n: int) -> None:
    import zmq

    import fastbus
    from fastbus import protocol as P
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 1000
    s.connect(endpoint)
    _hello(s, True, "hop-pub")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:       # until the broker's WANT names the channel
        if s.poll(1000):
            f = s.recv_multipart()
            if f[0] == P.WANT and any(k == CHANNEL for _op, k, _p in P.decode_ops(f[2])):
                break
    else:
        raise SystemExit("no WANT")
    print("ready", flush=True)
    encode, send, now_ns = fastbus.encode, s.send_multipart, time.monotonic_ns
    start = now_ns()
    interval = 1e9 / rate
    for i in range(n):
        delay = start + int(i * interval) - now_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
        send([P.PUB, encode([(CHANNEL, STAMP.pack(now_ns(), i) + PAD)])])
        while s.poll(0):                      # PINGs and such
            s.recv_multipart()
    time.sleep(0.5)


def run_floor(endpoint: str, lifetime: float = 600.0) -> None:
    """The floor broker: until SIGTERM, or `lifetime` seconds."""
    import zmq

    import fastbus
    from fastbus import protocol as P
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.bind(endpoint)
    subs: list[bytes] = []
    want = P.encode_ops([(fastbus.SUBSCRIBE, CHANNEL, False)])
    seq = P.pack_u64(1)
    end = time.monotonic() + lifetime
    while not stop and time.monotonic() < end:
        if not r.poll(100):
            continue
        f = r.recv_multipart()
        if f[1] == P.PUB:
            for s in subs:
                r.send_multipart([s, P.DATA, seq, f[2]])
        elif f[1] == P.SUB:
            subs.append(f[0])
            r.send_multipart([f[0], P.CONFIRM, f[2]])
        elif f[1] == P.HELLO and json.loads(f[2]).get("pub"):
            r.send_multipart([f[0], P.WANT, bytes([P.WANT_RESET]), want])


def _child(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *args], cwd=tempfile.gettempdir(),
                            stdout=subprocess.PIPE, text=True)


def _stop(p: subprocess.Popen | None, term: bool = False) -> None:
    if p is None or p.poll() is not None:
        return
    p.terminate() if term else p.kill()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def measure(broker_cmd: str | None, rate: float, seconds: float) -> dict:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    tmp = tempfile.mkdtemp()
    if broker_cmd is None:
        cmd = [sys.executable, os.path.abspath(__file__), "floor", endpoint]
    else:
        cmd = [*shlex.split(broker_cmd), "--bind", endpoint, "--log-level", "WARNING", "--stats-interval", "0"]
    broker = subprocess.Popen(cmd, cwd=tmp)
    out = os.path.join(tmp, "latencies")
    n = int(rate * seconds)
    sub = pub = None
    try:
        time.sleep(0.5)
        sub = _child(["sub", endpoint, str(n), str(seconds), out])
        assert sub.stdout.readline().strip() == "ready", "subscriber did not start"
        pub = _child(["pub", endpoint, str(rate), str(n)])
        assert pub.stdout.readline().strip() == "ready", "publisher did not start"
        pub.wait(seconds + 30)
        sub.wait(seconds + 30)
    finally:
        _stop(pub)
        _stop(sub)
        _stop(broker, term=True)
    lat = array("q")
    with open(out, "rb") as f:
        lat.frombytes(f.read())
    got = len(lat)
    lat = sorted(lat[len(lat) // 10:])

    def pick(q: float) -> float:
        return lat[min(len(lat) - 1, int(q / 100 * len(lat)))] / 1000

    return {"sent": n, "got": got, "p50": pick(50), "p90": pick(90), "p99": pick(99), "p99.9": pick(99.9),
            "max": lat[-1] / 1000}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("sub", "pub", "floor"):
        role, args = sys.argv[1], sys.argv[2:]
        if role == "sub":
            run_sub(args[0], int(args[1]), float(args[2]), args[3])
        elif role == "pub":
            run_pub(args[0], float(args[1]), int(args[2]))
        else:
            run_floor(args[0])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", action="append", metavar="NAME=COMMAND",
                    help="a broker command taking --bind/--log-level/--stats-interval; 'floor' for the floor "
                         "(default: fastbus and floor)")
    ap.add_argument("--rates", default="1000,20000", help="messages per second, comma-separated")
    ap.add_argument("--seconds", type=float, default=5.0, help="per case")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    brokers = []
    for spec in a.broker or [f"fastbus={sys.executable} -m fastbus broker", "floor"]:
        name, _, cmd = spec.partition("=")
        brokers.append((name, None if name == "floor" and not cmd else cmd))
    print(f"{'broker':<10}{'rate':>8}{'got/sent':>14}{'p50':>9}{'p90':>9}{'p99':>9}{'p99.9':>9}{'max':>9}  (us)")
    for _ in range(a.rounds):
        for rate in (float(x) for x in a.rates.split(",")):
            for name, cmd in brokers:
                m = measure(cmd, rate, a.seconds)
                print(f"{name:<10}{rate:>8.0f}{m['got']:>7}/{m['sent']:<6}{m['p50']:>9.0f}{m['p90']:>9.0f}"
                      f"{m['p99']:>9.0f}{m['p99.9']:>9.0f}{m['max']:>9.0f}", flush=True)


if __name__ == "__main__":
    main()
