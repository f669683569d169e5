"""Where a message's CPU goes, thread by thread, and its latency: one
publisher process -> the broker -> one subscriber process, at a fixed rate.

A message that crosses a thread inside a process costs a wake-up (tens of
µs on a loaded or virtual machine) and waits for it; this shows, per
process and per thread, what each message cost in CPU (from each thread's
/proc/<pid>/task/<tid>/schedstat, over the measured messages only), next
to the latency the subscriber saw (p50, p99, p99.9).  The cases, alternated
``--rounds`` times in one run:

  fastbus         fastbus as it is: no I/O thread anywhere (a client's Stream,
                  csrc/fb_zmtp.h, and the broker's Listener, fb_zmtp_server.h:
                  the calling thread writes and reads the kernel's socket)
  fastbus-router  the same, the broker on libzmq's ROUTER, with its I/O
                  thread (FASTBUS_BROKER_TRANSPORT=libzmq)
  fastbus-libzmq  libzmq everywhere: also the clients on pyzmq sockets, with
                  libzmq's I/O thread in each (FASTBUS_CLIENT_TRANSPORT=libzmq)
  zmq             the peer: pyzmq PUB and SUB through a libzmq XSUB/XPUB
                  proxy (zmq.proxy), each message a dict as seed 000 builds

The publisher sends each message when due (sleeping only while early);
the subscriber blocks for each (``get_message(timeout=5)``, ``recv()``) and
keeps its latency in a list.  Linux only (schedstat).  Every loop is
bounded in count and time; everything runs on loopback.

    cd /tmp && python /work/main/bench/threads_bench.py --rate 1000 --seconds 3 --rounds 3
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

FASTBUS_SUB = r"""
import sys, time, fastbus
c = fastbus.Client(endpoint=sys.argv[1])
p = c.pubsub(ignore_subscribe_messages=True)
p.subscribe("a")
print("ready", flush=True)
want, lat = int(sys.argv[2]), []
while len(lat) < want:
    m = p.get_message(timeout=5)
    if m is None:
        break
    lat.append(time.monotonic_ns() - int(m["data"]))
print(" ".join(map(str, lat)), flush=True)
sys.stdin.readline()
"""

# Both publishers' loop, once: wait for the go, send each message when due
# (sleeping only while early: one that falls behind sends back to back),
# each carrying time.monotonic_ns().  ``send(stamp)`` is the system's.
PACED = r"""
def paced(rate, n, send):
    print("ready", flush=True)
    sys.stdin.readline()
    nxt, step = time.monotonic(), 1.0 / rate
    for _ in range(n):
        d = nxt - time.monotonic()
        if d > 0:
            time.sleep(d)
        send(b"%d" % time.monotonic_ns())
        nxt += step
"""

FASTBUS_PUB = r"""
import sys, time, fastbus
c = fastbus.Client(endpoint=sys.argv[1])
rate, n = float(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + 20
while not c.is_wanted("a") and time.monotonic() < deadline:
    c.publish("warm", b"w")
    time.sleep(0.01)
""" + PACED + r"""
paced(rate, n, lambda stamp: c.publish("a", stamp))
c.flush()
print("done", flush=True)
sys.stdin.readline()
"""

ZMQ_PROXY = r"""
import sys, zmq
ctx = zmq.Context()
x = ctx.socket(zmq.XSUB); x.bind(sys.argv[1])
y = ctx.socket(zmq.XPUB); y.bind(sys.argv[2])
zmq.proxy(x, y)
"""

ZMQ_SUB = r"""
import sys, time, zmq
s = zmq.Context().socket(zmq.SUB)
s.connect(sys.argv[1])
s.setsockopt(zmq.SUBSCRIBE, b"a ")
print("ready", flush=True)
want, lat = int(sys.argv[2]), []
while len(lat) < want:
    if not s.poll(5000):
        break
    channel, data = s.recv().split(b" ", 1)
    m = {"type": "message", "pattern": None, "channel": channel, "data": data}
    lat.append(time.monotonic_ns() - int(m["data"]))
print(" ".join(map(str, lat)), flush=True)
sys.stdin.readline()
"""

ZMQ_PUB = r"""
import sys, time, zmq
s = zmq.Context().socket(zmq.PUB)
s.connect(sys.argv[1])
rate, n = float(sys.argv[2]), int(sys.argv[3])
time.sleep(1.0)                        # (the SUB's subscription reaches the proxy)
""" + PACED + r"""
paced(rate, n, lambda stamp: s.send(b"a " + stamp))
print("done", flush=True)
sys.stdin.readline()
"""


def thread_cpu(pid: int) -> dict:
    """{tid: (name, CPU ns)} of a process's threads."""
    out = {}
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(t + "/comm") as f:
                name = f.read().strip()
            with open(t + "/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:
            continue
        out[t.rsplit("/", 1)[1]] = (name, ns)
    return out


def _expect(proc: subprocess.Popen, word: str) -> None:
    line = proc.stdout.readline().strip()       # (bounded: each child gives up on its own deadline)
    if line != word:
        raise SystemExit(f"a benchmark process said {line!r}, not {word!r}")


def run_case(case: str, rate: float, n: int) -> dict:
    from brokers import BrokerProcess, free_port
    py = sys.executable
    env = dict(os.environ)
    env.pop("FASTBUS_CLIENT_TRANSPORT", None)
    if case == "fastbus-libzmq":
        env["FASTBUS_CLIENT_TRANSPORT"] = "libzmq"
    broker_transport = "fastbus" if case == "fastbus" else "libzmq"
    server = broker = None
    procs = []
    try:
        if case == "zmq":
            front, back = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
            server = subprocess.Popen([py, "-c", ZMQ_PROXY, front, back])
            time.sleep(0.5)
            sub_argv, pub_argv = [py, "-c", ZMQ_SUB, back, str(n)], [py, "-c", ZMQ_PUB, front, str(rate), str(n)]
            server_pid = server.pid
        else:
            broker = BrokerProcess(env={**os.environ, "FASTBUS_BROKER_TRANSPORT": broker_transport})
            sub_argv = [py, "-c", FASTBUS_SUB, broker.endpoint, str(n)]
            pub_argv = [py, "-c", FASTBUS_PUB, broker.endpoint, str(rate), str(n)]
            server_pid = broker.proc.pid
        sub = subprocess.Popen(sub_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        procs.append(sub)
        _expect(sub, "ready")
        pub = subprocess.Popen(pub_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        procs.append(pub)
        _expect(pub, "ready")
        time.sleep(0.3)
        pids = {"publisher": pub.pid, "server": server_pid, "subscriber": sub.pid}
        before = {k: thread_cpu(p) for k, p in pids.items()}
        pub.stdin.write("\n")
        pub.stdin.flush()
        _expect(pub, "done")
        lat = sorted(int(x) for x in sub.stdout.readline().split())
        after = {k: thread_cpu(p) for k, p in pids.items()}
        cpu = {}
        for k in pids:
            threads = {}
            for tid, (name, ns) in after[k].items():
                d = ns - before[k].get(tid, (name, 0))[1]
                if d:
                    threads[f"{name}:{tid}"] = d / max(1, len(lat)) / 1000
            cpu[k] = threads
        pct = {q: lat[min(len(lat) - 1, int(len(lat) * f))] / 1000
               for q, f in (("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999))} if lat else {}
        return {"case": case, "received": len(lat), "sent": n, "cpu": cpu, **pct}
    finally:
        for p in procs:
            try:
                p.stdin.write("\n")
                p.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if server is not None:
            server.kill()
            server.wait()
        if broker is not None:
            broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0, help="messages per second (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds of messages per case (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="times each case runs, alternated (default: %(default)s)")
    ap.add_argument("--cases", default="fastbus,fastbus-router,fastbus-libzmq,zmq",
                    help="comma-separated (default: %(default)s)")
    args = ap.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("threads_bench reads /proc/<pid>/task/*/schedstat: Linux only")
    if not 0 < args.rate <= 200_000 or not 0 < args.seconds <= 60 or not 1 <= args.rounds <= 20:
        raise SystemExit("--rate in (0, 200000], --seconds in (0, 60], --rounds in [1, 20]")
    cases = [c for c in args.cases.split(",") if c]
    if any(c not in ("fastbus", "fastbus-router", "fastbus-libzmq", "zmq") for c in cases):
        raise SystemExit("--cases: fastbus, fastbus-router, fastbus-libzmq, zmq")
    n = int(args.rate * args.seconds)
    rows = []
    for r in range(args.rounds):
        for case in cases:
            res = run_case(case, args.rate, n)
            rows.append(res)
            per = "; ".join(f"{k} {sum(v.values()):.1f} (" + ", ".join(
                f"{t.split(':')[0]} {x:.1f}" for t, x in v.items() if x >= 0.5) + ")" for k, v in res["cpu"].items())
            print(f"round {r + 1} {case:15s} received {res['received']:,}/{n:,}  p50 {res.get('p50', 0):,.0f}  "
                  f"p99 {res.get('p99', 0):,.0f}  p99.9 {res.get('p99.9', 0):,.0f} µs;  CPU µs/msg: {per}", flush=True)
    print()
    print("| case | p50 µs | p99 µs | p99.9 µs | publisher µs/msg | server µs/msg | subscriber µs/msg |")
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        mine = [x for x in rows if x["case"] == case]

        def col(key: str) -> str:
            return ", ".join(f"{x.get(key, 0):,.0f}" for x in mine)

        def cpu(proc: str) -> str:
            return ", ".join(f"{sum(x['cpu'][proc].values()):.1f}" for x in mine)

        print(f"| {case} | {col('p50')} | {col('p99')} | {col('p99.9')} | {cpu('publisher')} | {cpu('server')} | "
              f"{cpu('subscriber')} |")


if __name__ == "__main__":
    main()
