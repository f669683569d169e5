"""What a subscriber pays for a channel it has not met: which of its
subscriptions the channel's messages are for (exact, or which pattern).

A PubSub with no broker (``psubscribe("user.*", "user.1*")``,
``subscribe("user.7")``) is handed batches of 1,000 records straight into
its inbox, as its connection's reader hands them, and ``get_message()``
takes every message.  ``--channels new``: every record on a channel not met
before (a fan-in of per-user channels), so each one is classified;
``--channels met``: the same 1,000 channels in every batch (the cached
answer).  ns a message, the best of three rounds.  Runs on builds from
before the typed inbox too (their inbox takes ``("data", acked, batch)``).

    cd /tmp && python /work/main/bench/classify_bench.py --channels new
"""

from __future__ import annotations

import argparse
import time

import fastbus

try:
    from fastbus.client._items import Batch

    def _item(batch: bytes) -> object:
        return Batch(0, batch)
except ImportError:                               # (a build from before the typed inbox)
    def _item(batch: bytes) -> object:
        return ("data", 0, batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--channels", choices=("new", "met"), default="new", help="see above (default new)")
    ap.add_argument("--batches", type=int, default=200, help="batches of 1,000 records (default 200)")
    args = ap.parse_args()
    c = fastbus.Client(endpoint="tcp://127.0.0.1:9")      # (never connects: nothing is sent)
    p = c.pubsub()
    p.psubscribe_nowait("user.*")
    p.psubscribe_nowait("user.1*")
    p.subscribe_nowait("user.7")
    spread = 1000 if args.channels == "new" else 0
    batches = [bytes(fastbus.encode([(b"user.%d" % (k * spread + i), b"x") for i in range(1000)]))
               for k in range(args.batches)]
    best = float("inf")
    for _ in range(3):
        p._classes.clear()
        n = 0
        start = time.perf_counter()
        for b in batches:
            p._deliver(_item(b))
            while p.get_message(True, timeout=0) is not None:
                n += 1
        best = min(best, time.perf_counter() - start)
    print(f"{n:,} messages on channels {args.channels}: {best / n * 1e9:.0f} ns a message")
    c.close(timeout=0.1)


if __name__ == "__main__":
    main()
