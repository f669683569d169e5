"""After a pause, how long a publisher's backlog takes to arrive once the
broker resumes it (flow control), with the publisher busy in Python or idle.

A round: a broker with a small queue bound; a healthy subscriber and a
stuck one (it never reads) on one channel; a publisher process publishes
200-byte messages until the broker pauses it (FLOW), queues ``--tail``
more in its buffer, then either spins in pure Python (``busy``: an
application at work, holding its interpreter, at the default switch
interval) or sleeps (``idle``) for ``--spin`` seconds.  The stuck
subscriber leaves; the broker resumes; the figure is the time from its
leaving to the last message's arrival at the healthy subscriber (every
message checked, in order).  What a publisher's resume waits for shows
here: a Python thread that must get the interpreter lock from the busy
one, or nothing.

    python bench/flow_bench.py                       # 5 rounds of each mode
    python bench/flow_bench.py --rounds 10 --modes busy
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import free_port  # noqa: E402

PUBLISHER = r"""
import json, sys, time
import fastbus
endpoint, tail, spin, mode = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
with fastbus.Client(endpoint=endpoint, max_buffer_bytes=50_000_000) as c:
    deadline = time.monotonic() + 20
    while not (c.stats()["filter_active"] and c.is_wanted("flow")) and time.monotonic() < deadline:
        time.sleep(0.01)
    n = 0
    while not c.stats()["flow_paused"] and time.monotonic() < deadline:
        for _ in range(100):
            c.publish("flow", b"%d " % n + b"w" * 200)
            n += 1
    for _ in range(tail):
        c.publish("flow", b"%d " % n + b"w" * 200)
        n += 1
    print(json.dumps({"total": n, "paused": c.stats()["flow_paused"]}), flush=True)
    until = time.monotonic() + spin
    if mode == "busy":
        x = 0
        while time.monotonic() < until:     # pure Python: holds the interpreter
            x += 1
    else:
        time.sleep(spin)
"""


def one_round(mode: str, tail: int, spin: float) -> dict:
    import fastbus
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    workdir = tempfile.mkdtemp(prefix="bench-flow-")
    broker = subprocess.Popen([sys.executable, "-m", "fastbus", "broker", "--bind", endpoint, "--log-level", "WARNING",
                               "--stats-interval", "0", "--max-queue-bytes", "2000000", "--flow-max-pause", "60"],
                              cwd=workdir)
    pub = None
    try:
        with fastbus.Client(endpoint=endpoint) as good, \
                fastbus.Client(endpoint=endpoint, max_inbox_bytes=100_000) as stuck_client:
            p = good.pubsub(ignore_subscribe_messages=True)
            p.subscribe("flow")
            stuck = stuck_client.pubsub(ignore_subscribe_messages=True)
            stuck.subscribe("flow")
            pub = subprocess.Popen([sys.executable, "-c", PUBLISHER, endpoint, str(tail), str(spin), mode],
                                   cwd=workdir, stdout=subprocess.PIPE, text=True)
            got: list[int] = []

            def take(timeout: float) -> None:
                for _c, d in p.get_batch(timeout=timeout):
                    got.append(int(d.split()[0]))

            line: list[str] = []
            reader = threading.Thread(target=lambda: line.append(pub.stdout.readline()), daemon=True)
            reader.start()
            deadline = time.monotonic() + 30
            while reader.is_alive() and time.monotonic() < deadline:
                take(0.05)
            said = json.loads(line[0])
            total = said["total"]
            stuck.close()
            resumed = time.monotonic()
            last = resumed
            deadline = resumed + spin + 10
            while len(got) < total and time.monotonic() < deadline:
                before = len(got)
                take(0.2)
                if len(got) > before:
                    last = time.monotonic()
            pub.communicate(timeout=60)
            return {"ms": (last - resumed) * 1e3, "paused": said["paused"], "in_order": got == list(range(total)),
                    "messages": total}
    finally:
        for proc in (pub, broker):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds per mode (default 5)")
    ap.add_argument("--modes", default="busy,idle", help="publisher modes: busy, idle (default both)")
    ap.add_argument("--tail", type=int, default=1000, help="messages queued after the pause (default 1000)")
    ap.add_argument("--spin", type=float, default=3.0, help="seconds the publisher spins or sleeps (default 3)")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 100:
        ap.error("--rounds must be 1..100")
    print("| publisher | rounds | resume -> last message, ms: min | median | max | messages a round (median) | all in order |")
    print("|---|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        if mode not in ("busy", "idle"):
            ap.error(f"unknown mode {mode!r}")
        results = [one_round(mode, args.tail, args.spin) for _ in range(args.rounds)]
        ms = [r["ms"] for r in results]
        in_order = all(r["in_order"] for r in results)
        ok = "yes" if in_order and all(r["paused"] for r in results) else \
            "NO: a message lost or out of order" if not in_order else "NO: a publisher not paused when it printed"
        msgs = statistics.median(r["messages"] for r in results)
        print(f"| {mode} | {len(ms)} | {min(ms):,.1f} | {statistics.median(ms):,.1f} | {max(ms):,.1f} | "
              f"{msgs:,.0f} | {ok} |", flush=True)


if __name__ == "__main__":
    main()
