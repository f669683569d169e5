"""Where a Redis server's time goes per queue operation, one message at a
time: fastbus's WorkQueue (put, get, ack, get(ack=prev)) against Redis
Streams (XADD, XREADGROUP, XACK), against the same server in the same run.

For each operation alone: CONFIG RESETSTAT, N calls, then INFO commandstats:
the server's time in commands per operation (a script's time includes the
commands it calls), the script or command itself, and which commands ran
inside it (each counted per operation).  With --perf, ``perf record`` of the
server's process during the fastbus get/ack phase (needs Debian's
linux-perf), and its top symbols.

    cd /tmp && python /work/main/bench/queue_server_cost.py --messages 5000
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def commandstats(r) -> dict[str, tuple[int, int]]:
    """{command: (calls, usec)} from INFO commandstats."""
    out = {}
    for key, v in r.info("commandstats").items():
        name = key.removeprefix("cmdstat_")
        out[name] = (int(v["calls"]), int(v["usec"]))
    return out


def measure(r, label: str, n: int, fn) -> dict:
    r.config_resetstat()
    t0 = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - t0
    st = commandstats(r)
    st.pop("config|resetstat", None)
    st.pop("config", None)
    scripts = {k: v for k, v in st.items() if k in ("evalsha", "eval", "fcall")}
    outer = scripts or st
    total_us = sum(us for _c, us in outer.values())
    inner = {k: c for k, (c, _us) in st.items() if k not in scripts and k != "info"} if scripts else {}
    return {"op": label, "n": n, "server_us": total_us / n, "client_us": elapsed * 1e6 / n,
            "inner": {k: c / n for k, c in sorted(inner.items(), key=lambda kv: -kv[1])},
            "outer": {k: c / n for k, (c, _us) in outer.items() if k != "info"}}


def perf_top(pid: int, seconds: float, out_dir: str) -> str:
    """perf record -p PID for ``seconds``; the top symbols, as text."""
    data = os.path.join(out_dir, "perf.data")
    rec = subprocess.Popen(["perf", "record", "-q", "-g", "-o", data, "-p", str(pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    rec.send_signal(signal.SIGINT)
    rec.wait(30)
    rep = subprocess.run(["perf", "report", "-q", "-i", data, "--no-children", "--percent-limit", "2",
                          "--stdio", "-g", "none"], capture_output=True, text=True, timeout=120)
    return rep.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=5000, help="operations of each kind (default 5000)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--perf", action="store_true", help="perf record the server during fastbus's get + ack")
    a = ap.parse_args()
    if not 0 < a.messages <= 1_000_000:
        raise SystemExit("--messages: 1 to 1,000,000")

    from fastbus.queue import WorkQueue
    from fastbus.redis import EmbeddedServer

    n, payload = a.messages, b"x" * a.size
    with EmbeddedServer() as server:
        r = server.client()
        rows = []
        with WorkQueue("cost", server.url) as q:
            rows.append(measure(r, "fastbus put", n, lambda: [q.put(payload) for _ in range(n)]))
            with q.consumer("w", clean_interval=None) as c:
                got: list = []
                rows.append(measure(r, "fastbus get", n, lambda: [got.append(c.get(timeout=0)) for _ in range(n)]))
                rows.append(measure(r, "fastbus ack", n, lambda: [c.ack(m) for m in got]))
                for _ in range(n):
                    q.put(payload)
                m = c.get(timeout=0)

                def ackget():
                    nonlocal m
                    for _ in range(n - 1):
                        m = c.get(timeout=0, ack=m)
                rows.append(measure(r, "fastbus get(ack=prev)", n - 1, ackget))
                c.ack(m)
                prof = None
                if a.perf and shutil.which("perf"):
                    perf_dir = tempfile.mkdtemp()
                    for _ in range(4 * n):
                        q.put(payload)
                    import threading
                    done = threading.Event()

                    def work():
                        mm = c.get(timeout=0)
                        while mm is not None and not done.is_set():
                            mm = c.get(timeout=0, ack=mm)
                        if mm is not None:
                            c.ack(mm)
                    t = threading.Thread(target=work)
                    t.start()
                    prof = perf_top(server.pid, 3.0, perf_dir)
                    done.set()
                    t.join()
                    shutil.rmtree(perf_dir, ignore_errors=True)
        stream, group = "cost:stream", "g"
        r.xgroup_create(stream, group, id="0", mkstream=True)
        rows.append(measure(r, "streams XADD", n, lambda: [r.xadd(stream, {"p": payload}) for _ in range(n)]))
        ids: list = []
        rows.append(measure(r, "streams XREADGROUP", n, lambda: [
            ids.append(r.xreadgroup(group, "c", {stream: ">"}, count=1)[0][1][0][0]) for _ in range(n)]))
        rows.append(measure(r, "streams XACK", n, lambda: [r.xack(stream, group, i) for i in ids]))
        print(f"server: {server.server_name} {server.version}; {n:,} operations of each kind, {a.size}-byte payloads\n")
        print("| operation | server µs in commands / op | round trip, client µs / op | called | inside the script, per op |")
        print("|---|---|---|---|---|")
        for row in rows:
            outer = ", ".join(f"{k} {v:g}" for k, v in row["outer"].items())
            inner = ", ".join(f"{k} {v:.2g}" for k, v in row["inner"].items()) or "-"
            print(f"| {row['op']} | {row['server_us']:.2f} | {row['client_us']:.1f} | {outer} | {inner} |")
        if prof:
            print("\nperf, the server during get(ack=prev) loops (symbols over 2%):\n")
            print(prof)


if __name__ == "__main__":
    sys.exit(main())
