"""Where a Redis server's time goes per queue operation, one message at a
time: fastbus's WorkQueue (put, get, ack, get(ack=prev)) against Redis
Streams (XADD, XREADGROUP, XACK), against the same server in the same run.

For each operation alone: CONFIG RESETSTAT, N calls, then INFO commandstats:
the server's time in commands per operation (a script's time includes the
commands it calls), the script or command itself, and which commands ran
inside it (each counted per operation).  With --perf, ``perf record`` of the
server's process during the fastbus get/ack phase (needs Debian's
linux-perf), and its top symbols.  With --script-cost, what a script call
costs the server by itself: EVALSHA of ``return 1``, of five
``redis.call``s, and (Redis 7+ / Valkey) FCALL of the same as a function,
and fastbus's PUT as EVALSHA and as a function of a library that defines
its helpers once.

    cd /tmp && python /work/main/bench/queue_server_cost.py --messages 5000
    cd /tmp && python /work/main/bench/queue_server_cost.py --messages 5000 --script-cost
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


FIVE_CALLS = """local P = ARGV[1]
redis.call('INCRBY', P .. 'seq', 1)
local t = redis.call('TIME')
redis.call('RPUSH', P .. 'ready', 'x')
redis.call('HINCRBY', P .. 'stats', 'put', 1)
redis.call('HINCRBY', P .. 'rate:' .. t[1], 'put', 1)
return 1"""


def script_cost(r, n: int) -> list[dict]:
    """The fixed costs of a script call, against plain commands."""
    from fastbus.queue._lua import SCRIPTS, load

    put_body = load("put")
    put_libs = SCRIPTS["PUT"][: -len(put_body)]
    # A function library: the helpers defined once, at load; each call runs
    # only the script's own text (NOW, the per-call TIME memo, reset first).
    library = ("#!lua name=fastbus_cost\n"
               "redis.register_function('cost_triv', function(KEYS, ARGV) return 1 end)\n"
               f"redis.register_function('cost_five', function(KEYS, ARGV)\n{FIVE_CALLS}\nend)\n"
               f"{put_libs}\n"
               f"redis.register_function('cost_put', function(KEYS, ARGV) NOW = nil\n{put_body}\nend)\n")
    functions = True
    try:
        r.execute_command("FUNCTION", "LOAD", "REPLACE", library)
    except Exception as e:  # noqa: BLE001 - a server without functions: EVALSHA rows only
        print(f"(no FCALL rows: FUNCTION LOAD refused: {e})")
        functions = False
    triv, five, put = r.script_load("return 1"), r.script_load(FIVE_CALLS), r.script_load(SCRIPTS["PUT"])
    rows = [measure(r, "RPUSH", n, lambda: [r.rpush("cost:l", "x") for _ in range(n)]),
            measure(r, "XADD", n, lambda: [r.xadd("cost:s", {"d": "x"}) for _ in range(n)]),
            measure(r, 'EVALSHA "return 1"', n, lambda: [r.evalsha(triv, 1, "k") for _ in range(n)]),
            measure(r, "EVALSHA, five redis.calls", n, lambda: [r.evalsha(five, 1, "c:ready", "c:") for _ in range(n)]),
            measure(r, "EVALSHA fastbus PUT", n,
                    lambda: [r.evalsha(put, 1, "p:ready", "p:", "", "x" * 20) for _ in range(n)])]
    if functions:
        fcall = r.execute_command
        rows += [measure(r, 'FCALL "return 1"', n, lambda: [fcall("FCALL", "cost_triv", 1, "k") for _ in range(n)]),
                 measure(r, "FCALL, five redis.calls", n,
                         lambda: [fcall("FCALL", "cost_five", 1, "c:ready", "c:") for _ in range(n)]),
                 measure(r, "FCALL fastbus PUT", n,
                         lambda: [fcall("FCALL", "cost_put", 1, "p:ready", "p:", "", "x" * 20) for _ in range(n)])]
        r.execute_command("FUNCTION", "DELETE", "fastbus_cost")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=5000, help="operations of each kind (default 5000)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--perf", action="store_true", help="perf record the server during fastbus's get + ack")
    ap.add_argument("--script-cost", action="store_true",
                    help="also: what a script call costs by itself (EVALSHA and FCALL against plain commands)")
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
        if a.script_cost:
            rows += script_cost(r, n)
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
