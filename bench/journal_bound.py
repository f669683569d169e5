"""How close a broker's journal comes to its bound (``--journal-bytes``)
under a steady stream: a broker with a journal, one publisher and one
subscriber that keeps up, the journal directory's size sampled every 5 ms;
the peak against the bound.

    cd /tmp && python /work/main/bench/journal_bound.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import free_port  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bound-mib", type=int, default=16, help="--journal-bytes, MiB (at least 16)")
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=4000, help="payload bytes")
    ap.add_argument("--seconds", type=float, default=120.0, help="bound of the run")
    args = ap.parse_args()

    import fastbus

    bound = args.bound_mib * 1024 * 1024
    with tempfile.TemporaryDirectory() as d:
        journal = os.path.join(d, "journal")
        port = free_port()
        broker = subprocess.Popen([sys.executable, "-m", "fastbus", "broker", "--bind", f"tcp://127.0.0.1:{port}",
                                   "--journal", journal, "--journal-bytes", str(bound)], cwd=d,
                                  stderr=subprocess.DEVNULL)
        peak, samples, stop = [0], [0], threading.Event()

        def sample() -> None:
            while not stop.is_set():
                try:
                    size = sum(os.path.getsize(os.path.join(journal, f)) for f in os.listdir(journal))
                    peak[0] = max(peak[0], size)
                    samples[0] += 1
                except OSError:
                    pass                      # (a segment deleted while listed)
                time.sleep(0.005)

        try:
            endpoint = f"tcp://127.0.0.1:{port}"
            with fastbus.Client(endpoint, socket_connect_timeout=10) as pub, fastbus.Client(endpoint) as sub:
                ps = sub.pubsub()
                ps.subscribe("big")
                ps.get_message(timeout=10)
                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                payload, got, t0 = b"x" * args.size, 0, time.monotonic()
                for i in range(args.messages):
                    pub.publish("big", payload)
                    if i % 500 == 499:
                        pub.flush()
                        while got < i + 1 and time.monotonic() - t0 < args.seconds:
                            got += len(ps.get_batch(timeout=5))
                    if time.monotonic() - t0 > args.seconds:
                        break
                stop.set()
                sampler.join(5)
        finally:
            broker.terminate()
            broker.wait(30)
        mb = args.messages * args.size / 1e6
        print(f"{mb:,.0f} MB through a {args.bound_mib} MiB journal, {got:,} delivered, {samples[0]:,} samples: "
              f"peak {peak[0] / 1e6:.1f} MB = {peak[0] / bound:.2f}x the bound")


if __name__ == "__main__":
    main()
