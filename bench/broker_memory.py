"""What subscriptions cost a broker in memory, against what its budget counts.

A broker bounds each session's subscriptions by ``--max-subscription-bytes``
(64 MiB), counting each key's length + 48 bytes.  This measures the broker's
real RSS (from /proc) against that count, while the subscriptions are held,
at its peak (sampled every 5 ms, from the first SUB until the client has
left), and after the client left, in three cases, each with a publishing
client connected (so the publishers' filter is kept and sent):

  long     one client takes its whole budget in keys of 65,535 bytes (the
           longest there are), then leaves
  short    one client takes 300,000 short keys ("market.NYSE.0000001.trades"),
           then leaves
  diff     one client holds half a budget of long keys and stays; another
           takes a quarter budget and leaves (the publishers get a diff
           naming each key that went, not what is left)

    python bench/broker_memory.py                  # all three
    python bench/broker_memory.py --cases long

Linux only (/proc).  Loopback only; every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import Server  # noqa: E402

from fastbus import protocol as P  # noqa: E402
from fastbus._core import SUBSCRIBE  # noqa: E402
from fastbus.client import query_stats  # noqa: E402

MB = 1 << 20
BUDGET = 64 << 20
OVERHEAD = 48
LONG = 65535


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class Peak(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, rss(pid), threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.wait(0.005):
            self.peak = max(self.peak, rss(self.pid))

    def stop(self) -> int:
        self.done.set()
        self.join(5)
        return self.peak


def session(ctx: zmq.Context, endpoint: str, name: str, pub: bool = False) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.connect(endpoint)
    s.send_multipart([P.HELLO, P.dump_json({"v": 1, "role": "client", "pub": pub, "name": name})])
    return s


def drain(s: zmq.Socket) -> list:
    got = []
    while s.poll(0):
        got.append(s.recv_multipart())
    return got


def wait(cond, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def subscribe(sock: zmq.Socket, keys: list, publisher: zmq.Socket, per_frame: int) -> None:
    """SUB frames of per_frame keys; returns once each is confirmed."""
    frames = 0
    for i in range(0, len(keys), per_frame):
        frames += 1
        sock.send_multipart([P.SUB, P.pack_u64(frames), P.encode_ops((SUBSCRIBE, k, False)
                                                                    for k in keys[i:i + per_frame])])
    confirmed = 0

    def done() -> bool:
        nonlocal confirmed
        drain(publisher)
        confirmed += sum(1 for f in drain(sock) if f[0] == P.CONFIRM)
        return confirmed >= frames
    wait(done, "the confirmations")


def long_keys(tag: bytes, budget: int) -> list:
    return [tag + b"%06d." % i + b"k" * (LONG - len(tag) - 7) for i in range(budget // (LONG + OVERHEAD))]


def run_case(case: str) -> dict:
    srv = Server("fastbus", lossless=False)
    ctx = zmq.Context()
    try:
        pid = srv.proc.pid
        publisher = session(ctx, srv.endpoint, "publisher", pub=True)
        wait(lambda: publisher.poll(50), "the publisher's welcome")
        drain(publisher)
        if case == "diff":
            stays = session(ctx, srv.endpoint, "stays")
            subscribe(stays, long_keys(b"s", BUDGET // 2), publisher, 16)
        time.sleep(0.5)
        before = rss(pid)
        peak = Peak(pid)
        leaves = session(ctx, srv.endpoint, "leaves")
        if case == "short":
            keys = [b"market.%s.%07d.trades" % (b"NYSE" if i % 2 else b"LSE", i) for i in range(300_000)]
            per_frame = 4096
        else:
            keys = long_keys(b"l", BUDGET if case == "long" else BUDGET // 4)
            per_frame = 16
        subscribe(leaves, keys, publisher, per_frame)
        counted = sum(len(k) + OVERHEAD for k in keys)
        held = rss(pid)
        held_subs = query_stats(srv.endpoint)["subscriptions"]
        leaves.send_multipart([P.BYE])
        leaves.close()
        expect = held_subs - len(keys)
        wait(lambda: query_stats(srv.endpoint)["subscriptions"] == expect, "the client to leave")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:          # the heap trims come 1-6 s after a fall
            drain(publisher)
            if rss(pid) - before < before / 20:
                break
            time.sleep(0.2)
        after = rss(pid)
        top = peak.stop()
        return {"case": case, "keys": len(keys), "counted": counted, "before": before,
                "held": held - before, "peak": top - before, "after": after - before}
    finally:
        ctx.destroy(linger=0)
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="long,short,diff", help="long, short, diff (default: %(default)s)")
    args = ap.parse_args()
    rows = []
    for case in args.cases.split(","):
        r = run_case(case.strip())
        rows.append(r)
        print(f"{r['case']}: {r['keys']:,} keys, budget counted {r['counted'] / MB:.1f} MB; RSS "
              f"+{r['held'] / MB:.1f} MB held, +{r['peak'] / MB:.1f} MB peak, +{r['after'] / MB:.1f} MB after "
              f"(was {r['before'] / MB:.0f} MB)", flush=True)
    print()
    print("| case | keys | budget counted, MB | RSS held, MB | peak, MB | after leaving, MB | held / counted | "
          "peak / counted |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['keys']:,} | {r['counted'] / MB:.1f} | +{r['held'] / MB:.1f} | +{r['peak'] / MB:.1f} | "
              f"+{r['after'] / MB:.1f} | {r['held'] / r['counted']:.2f}x | {r['peak'] / r['counted']:.2f}x |")


if __name__ == "__main__":
    main()
