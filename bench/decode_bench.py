"""What decoding a batch costs a record, with and without headers.

Encodes 1,000 records of 20-byte payloads on 50 channels three ways (no
headers; the same two headers on every record, a traceparent and a content
type; a traceparent that differs on every record) and times
``fastbus.decode`` (tuples) and the subscriber's ``decode_messages``
(redis-py message dicts) on each: ns a record, the minimum of --rounds.

    cd /tmp && python /work/main/bench/decode_bench.py
"""

from __future__ import annotations

import argparse
import timeit

import fastbus
from fastbus._decoders import decode_messages

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-{:016x}-01"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1000, help="records a batch (default 1000)")
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds; the minimum is reported (default 5)")
    ap.add_argument("--repeats", choices=("on", "off"), default="on",
                    help="encode with header repeats (flag bit 2), as a broker sends them (default on)")
    args = ap.parse_args()
    n = args.records
    same = {"traceparent": TRACEPARENT.format(0xF067AA0BA902B7), "content-type": "application/json"}
    kinds = {
        "none": [(b"%d" % (i % 50), b"x" * 20) for i in range(n)],
        "same headers": [(b"%d" % (i % 50), b"x" * 20, same) for i in range(n)],
        "distinct traceparent": [(b"%d" % (i % 50), b"x" * 20, dict(same, traceparent=TRACEPARENT.format(i)))
                                 for i in range(n)],
    }
    classes = {b"%d" % i: (b"message", None) for i in range(50)}
    number = max(1, 200_000 // n)
    print("| records | batch bytes | fastbus.decode ns/record | decode_messages ns/record |")
    print("|---|---|---|---|")
    for name, records in kinds.items():
        # (off: no keyword, so a build from before repeats runs it too)
        batch = bytes(fastbus.encode(records, header_repeats=True) if args.repeats == "on" else fastbus.encode(records))
        t1 = min(timeit.repeat(lambda: fastbus.decode(batch), number=number, repeat=args.rounds)) / number / n
        t2 = min(timeit.repeat(lambda: decode_messages(batch, classes, lambda t: None), number=number,
                               repeat=args.rounds)) / number / n
        print(f"| {name} | {len(batch):,} | {t1 * 1e9:.1f} | {t2 * 1e9:.1f} |")


if __name__ == "__main__":
    main()
