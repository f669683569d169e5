"""Queue groups against plain fan-out, same run, same broker build: one
publisher sending ``--messages`` messages of ``--size`` bytes back to back
to a channel, received by

- ``plain``: one plain subscriber (``subscribe("jobs")``);
- ``group``: ``--members`` members of one queue group
  (``subscribe("jobs", queue="workers")``), each in a process of its own.

Each case runs on a fresh ``fastbus broker``.  Throughput is messages
delivered per second, from the first publish to the last message received
by any subscriber; every message must be delivered exactly once (each
member reports how many it got and the sum of their sequence numbers,
checked against what was sent).  The ratio group / plain is the issue's
target (at least 0.8x).  ``--rounds`` alternates the cases; the median is
reported.

    cd /tmp && python /work/main/bench/queue_group_bench.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import Server  # noqa: E402

SUBSCRIBER = """
import sys, time, fastbus
endpoint, queue, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = fastbus.Client(endpoint=endpoint)
ps = c.pubsub(ignore_subscribe_messages=True)
ps.subscribe("jobs", queue=queue or None)
print("ready", flush=True)
n = total = 0
last = 0.0
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    batch = ps.get_batch(timeout=2.0)
    if not batch:
        if n:
            break
        continue
    for m in batch:
        total += int(m[1][:12])
    n += len(batch)
    last = time.time()
print(n, total, last, flush=True)
"""


def run_case(members: int, queue: str, messages: int, size: int) -> tuple[float, int]:
    srv = Server("fastbus")
    procs = []
    try:
        for _ in range(members):
            p = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, srv.endpoint, queue, str(size)],
                                 stdout=subprocess.PIPE, text=True)
            procs.append(p)
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("a subscriber did not start")
        import fastbus
        pub = fastbus.Client(endpoint=srv.endpoint)
        deadline = time.monotonic() + 10
        while not pub.is_wanted("jobs") and time.monotonic() < deadline:
            time.sleep(0.01)
        pad = b"x" * max(0, size - 12)
        start = time.time()
        for i in range(messages):
            pub.publish("jobs", b"%012d" % i + pad)
        pub.flush(timeout=60)
        results = [p.communicate(timeout=180)[0].split() for p in procs]
        pub.close()
        got = sum(int(r[0]) for r in results)
        total = sum(int(r[1]) for r in results)
        if got != messages or total != messages * (messages - 1) // 2:
            raise SystemExit(f"not exactly once: {got} of {messages} delivered, sum {total}")
        end = max(float(r[2]) for r in results)
        return messages / (end - start), min(int(r[0]) for r in results)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=400_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    plain, group, least = [], [], []
    for _ in range(a.rounds):
        plain.append(run_case(1, "", a.messages, a.size)[0])
        rate, fewest = run_case(a.members, "workers", a.messages, a.size)
        group.append(rate)
        least.append(fewest)
    p, g = statistics.median(plain), statistics.median(group)
    print(f"{a.messages:,} messages of {a.size} B, {a.rounds} rounds (median), exactly once in every round")
    print(f"plain, 1 subscriber:        {p:12,.0f} msg/s   (rounds: {', '.join(f'{x:,.0f}' for x in plain)})")
    print(f"queue group, {a.members} members:   {g:12,.0f} msg/s   (rounds: {', '.join(f'{x:,.0f}' for x in group)})")
    print(f"ratio group / plain: {g / p:.2f}x; the fewest one member got: {min(least):,}")


if __name__ == "__main__":
    main()
