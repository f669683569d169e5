"""1,000 Redis glob patterns held: what a published message costs, fastbus
beside Redis in the same run (issue 23).

Redis matches every PUBLISH against every pattern any client holds (a scan
of its pattern list), in its one server thread.  A fastbus broker holds a
glob under its literal prefix in its trie (``dev.0042.`` for
``dev.0042.*.temp``); the subscriber's client matches the glob exactly and
drops what only the prefix matched.  So the broker's cost does not grow
with the number of patterns, and the subscriber pays for what the prefix
lets through.  Two shapes of pattern show both sides:

* ``prefixed``: ``dev.NNNN.*.temp`` (1,000 distinct literal prefixes); a
  message goes to ``dev.RRRR.D.temp`` or ``dev.RRRR.D.hum`` with RRRR
  random in twice the patterns' range: half the messages pass a prefix,
  a quarter match a glob;
* ``bare``: ``*.NNNN.?.temp``, no literal prefix: the broker sends a fastbus
  subscriber every message, and its client matches each.

The patterns are spread over ``--subscribers`` processes (fastbus:
``get_batch()``; Redis: redis-py's ``get_message()``).  One publisher
(this process) publishes ``--messages`` flat out (fastbus ``publish()``;
Redis a pipeline of 100 PUBLISH), and the run ends when every subscriber
has what it should get (checked: the count each one's patterns match).
Reported: messages that reached the server (a fastbus publisher's filter
drops what no prefix wants) and that it sent to subscribers (what a glob
then dropped is the difference to "delivered"), the publish rate, the
delivered rate (messages / time until the last is delivered), server CPU
per published message (from /proc: 10 ms ticks, so use enough messages),
subscriber CPU per delivered message, and Redis with no pattern held as a
reference.

    python bench/glob_bench.py                               # both shapes, both systems
    python bench/glob_bench.py --patterns 1000 --messages 200000 --shapes prefixed
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import Server  # noqa: E402

SUBSCRIBER = r"""
import json, os, sys, time
system, where, patterns_file, expected, timeout = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
patterns = json.load(open(patterns_file))
got = 0
if system == "fastbus":
    import fastbus
    c = fastbus.Client(where)
    p = c.pubsub(ignore_subscribe_messages=True)
    p.psubscribe(*patterns)                     # returns once in effect
    print("ready", flush=True)
    cpu0 = time.process_time()
    deadline = time.monotonic() + timeout
    while got < expected and time.monotonic() < deadline:
        got += len(p.get_batch(timeout=0.5))
    end_ns = time.monotonic_ns()
    cpu = time.process_time() - cpu0
    extra = len(p.get_batch(timeout=0.3))
    c.close()
else:
    import redis
    r = redis.Redis(port=int(where))
    p = r.pubsub(ignore_subscribe_messages=True)
    p.psubscribe(*patterns)
    confirmed = 0
    while confirmed < len(patterns):
        m = p.parse_response(block=True)
        confirmed += m[0] in (b"psubscribe", "psubscribe")
    print("ready", flush=True)
    cpu0 = time.process_time()
    deadline = time.monotonic() + timeout
    while got < expected and time.monotonic() < deadline:
        m = p.get_message(timeout=0.5)
        if m is not None:
            got += 1
    end_ns = time.monotonic_ns()
    cpu = time.process_time() - cpu0
    extra = 0
    while p.get_message(timeout=0.3) is not None:
        extra += 1
    r.close()
print(json.dumps({"got": got, "extra": extra, "cpu_s": cpu, "end_ns": end_ns}), flush=True)
"""


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def workload(shape: str, n_patterns: int, n_messages: int, seed: int = 23) -> tuple[list[str], list[bytes]]:
    rng = random.Random(seed)
    if shape == "prefixed":
        patterns = [f"dev.{i:04d}.*.temp" for i in range(n_patterns)]
    else:
        patterns = [f"*.{i:04d}.?.temp" for i in range(n_patterns)]
    span = max(1, 2 * n_patterns)
    pool = [f"dev.{rng.randrange(span):04d}.{rng.randrange(10)}.{rng.choice(('temp', 'hum'))}".encode()
            for _ in range(4096)]
    channels = [pool[rng.randrange(len(pool))] for _ in range(n_messages)]
    return patterns, channels


def expected_counts(groups: list[list[str]], channels: list[bytes]) -> list[int]:
    """How many messages each subscriber's patterns match (each channel
    matches at most one pattern in both shapes: one message a match)."""
    from fastbus._core import glob_match
    counts = []
    by_channel: dict[bytes, int] = {}
    for ch in channels:
        by_channel[ch] = by_channel.get(ch, 0) + 1
    for g in groups:
        counts.append(sum(n for ch, n in by_channel.items() if any(glob_match(p, ch) for p in g)))
    return counts


def run(system: str, shape: str, n_patterns: int, n_messages: int, n_subs: int, timeout: float) -> dict:
    patterns, channels = workload(shape, n_patterns, n_messages)
    groups = [patterns[i::n_subs] for i in range(n_subs)] if n_patterns else [[] for _ in range(n_subs)]
    expected = expected_counts(groups, channels) if n_patterns else [0] * n_subs
    srv = Server(system, lossless=True)
    tmp = tempfile.mkdtemp(prefix="glob-bench-")
    subs = []
    try:
        where = srv.endpoint if system == "fastbus" else str(srv.port)
        for i, g in enumerate(groups):
            if not g:
                continue
            path = os.path.join(tmp, f"patterns{i}.json")
            with open(path, "w") as f:
                json.dump(g, f)
            subs.append(subprocess.Popen([sys.executable, "-c", SUBSCRIBER, system, where, path, str(expected[i]),
                                          str(timeout)], stdout=subprocess.PIPE, cwd=tmp, text=True))
        for s in subs:
            line = s.stdout.readline()
            if line.strip() != "ready":
                raise SystemExit(f"{system} subscriber did not start: {line!r}")
        server_cpu0 = _cpu_s(srv.proc.pid)
        pub_cpu0 = time.process_time()
        t0 = time.monotonic_ns()
        if system == "fastbus":
            import fastbus
            with fastbus.Client(srv.endpoint, max_buffer_bytes=256 << 20) as c:
                publish = c.publish
                for ch in channels:
                    publish(ch, b"x" * 20)
                c.flush(timeout=timeout)
        else:
            import redis
            r = redis.Redis(port=srv.port)
            pipe = r.pipeline(transaction=False)
            for i, ch in enumerate(channels, 1):
                pipe.publish(ch, b"x" * 20)
                if i % 100 == 0:
                    pipe.execute()
            pipe.execute()
            r.close()
        published_ns = time.monotonic_ns() - t0
        pub_cpu = time.process_time() - pub_cpu0
        results = [json.loads(s.communicate(timeout=timeout + 30)[0].strip().splitlines()[-1]) for s in subs]
        server_cpu = _cpu_s(srv.proc.pid) - server_cpu0
        if system == "fastbus":
            import fastbus
            with fastbus.Client(srv.endpoint) as c:
                st = c.broker_stats()
            server_in, sent_to_subs = st["messages_in"], st["messages_out"]
        else:
            server_in = n_messages
            sent_to_subs = sum(r["got"] + r["extra"] for r in results)
        end_ns = max([r["end_ns"] for r in results], default=t0 + published_ns)
        got = sum(r["got"] for r in results)
        delivered_ns = max(end_ns - t0, published_ns)
        lost = sum(expected) - got
        return {
            "system": system, "shape": shape, "patterns": n_patterns, "messages": n_messages,
            "subscribers": len(subs), "delivered": got, "server_in": server_in, "sent_to_subscribers": sent_to_subs, "lost": lost, "duplicates": sum(r["extra"] for r in results),
            "publish_rate": n_messages / (published_ns / 1e9),
            "delivered_rate": n_messages / (delivered_ns / 1e9),
            "server_us_per_msg": server_cpu / n_messages * 1e6,
            "publisher_us_per_msg": pub_cpu / n_messages * 1e6,
            "subscriber_us_per_delivered": (sum(r["cpu_s"] for r in results) / got * 1e6) if got else None,
        }
    finally:
        for s in subs:
            if s.poll() is None:
                s.kill()
                s.wait()
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="fastbus,redis")
    ap.add_argument("--shapes", default="prefixed,bare")
    ap.add_argument("--patterns", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--subscribers", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take (default: %(default)s)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        for system in args.systems.split(","):
            rows.append(run(system, shape, args.patterns, args.messages, args.subscribers, args.timeout))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if "redis" in args.systems.split(","):
        rows.append(run("redis", "prefixed", 0, args.messages, 1, args.timeout))   # PUBLISH with no pattern
    print(f"{'system':8} {'shape':9} {'patterns':>8} {'server in':>9} {'sent subs':>9} {'delivered':>9} {'lost':>5} "
          f"{'publish/s':>10} {'delivered/s':>11} {'server us/msg':>13} {'sub us/dlv':>10}")
    for r in rows:
        sub = "-" if r["subscriber_us_per_delivered"] is None else f"{r['subscriber_us_per_delivered']:.2f}"
        print(f"{r['system']:8} {r['shape']:9} {r['patterns']:>8} {r['server_in']:>9} {r['sent_to_subscribers']:>9} "
              f"{r['delivered']:>9} {r['lost']:>5} "
              f"{r['publish_rate']:>10,.0f} {r['delivered_rate']:>11,.0f} {r['server_us_per_msg']:>13.2f} {sub:>10}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
