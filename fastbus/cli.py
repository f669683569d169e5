"""The ``fastbus`` command line.

``fastbus demo`` runs the core on embedded defaults (no server needed): it
fills a subscription trie, routes random topics through it in batches, and
shows the forwarder and the batch format at work, printing rates and memory.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence

import fastbus

EXCHANGES = ("NYSE", "NASDAQ", "LSE", "TSE", "HKEX", "SSE", "EURONEXT", "TSX")
KINDS = ("trades", "quotes", "book", "ohlc", "news")


def topic_keys(n: int) -> list[bytes]:
    """n topic-like keys, e.g. b"market.NYSE.00042.trades"."""
    per_symbol = len(EXCHANGES) * len(KINDS)
    symbols = max(1, -(-n // per_symbol))
    keys = [f"market.{ex}.{s:05d}.{k}".encode() for s in range(symbols) for ex in EXCHANGES for k in KINDS]
    return keys[:n]


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0 and 3600 seconds, not {text}")
    return value


def cmd_demo(args: argparse.Namespace) -> int:
    out = args.out
    rng = random.Random(args.seed)
    keys = topic_keys(args.subscriptions)
    trie = fastbus.Trie()
    t0 = time.perf_counter()
    for i, key in enumerate(keys):
        trie.add(key, i % args.subscribers)
    # A few prefix subscriptions: one subscriber wants all of one exchange.
    trie.add(b"market.LSE.", args.subscribers, prefix=True)
    build = time.perf_counter() - t0
    stats = trie.stats()
    print(f"trie: {stats['subscriptions']:,} subscriptions from {stats['subscribers']:,} subscribers "
          f"in {build:.2f} s ({build / len(keys) * 1e9:.0f} ns per add), "
          f"{stats['bytes_reserved'] / stats['subscriptions']:.1f} bytes per subscription", file=out)

    # Route random topics in batches for a while; cycle through many batches
    # so that the trie is not measured warm from one batch repeated.
    batches = [[rng.choice(keys) for _ in range(args.batch)] for _ in range(64)]
    batch = batches[0]
    routed = delivered = 0
    deadline = time.perf_counter() + args.seconds
    t0 = time.perf_counter()
    i = 0
    while time.perf_counter() < deadline:
        offsets, ids = trie.match_flat(batches[i % len(batches)])
        i += 1
        routed += args.batch
        delivered += len(ids)
    elapsed = time.perf_counter() - t0
    print(f"routing: {routed / elapsed:,.0f} topics/s in batches of {args.batch} "
          f"({elapsed / routed * 1e9:.0f} ns per topic), {delivered / routed:.2f} subscribers per topic",
          file=out)

    # Diff-only forwarding: what a broker sends upstream.
    fwd = fastbus.Forwarder(mode="subsume")
    steps = [
        ("peer 1 subscribes prefix market.NYSE.", fwd.subscribe(1, b"market.NYSE.", prefix=True)),
        ("peer 2 subscribes market.NYSE.00001.trades", fwd.subscribe(2, b"market.NYSE.00001.trades")),
        ("peer 1 disconnects", fwd.remove_peer(1)),
    ]
    print("forwarder (subsume mode), upstream diffs:", file=out)
    for what, diff in steps:
        ops = ", ".join(f"{'+' if op == fastbus.SUBSCRIBE else '-'}{key.decode()}{'*' if prefix else ''}"
                        for op, key, prefix in diff) or "(nothing)"
        print(f"  {what}: {ops}", file=out)

    # Batching: one outbox per destination, handed over without a copy.
    box = fastbus.Outbox(max_messages=1000)
    payload = b"x" * 20
    t0 = time.perf_counter()
    box.extend((key, payload) for key in batch[:1000])
    batch_obj = box.take()
    records = fastbus.decode(batch_obj)
    elapsed = time.perf_counter() - t0
    print(f"outbox: {len(records)} records of 20 bytes -> one {len(batch_obj):,}-byte batch "
          f"(format v{fastbus.BATCH_VERSION}), encoded and decoded in {elapsed * 1e3:.2f} ms", file=out)
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    print(f"fastbus {fastbus.__version__} (core {'.'.join(map(str, fastbus.CORE_VERSION))}, "
          f"batch format v{fastbus.BATCH_VERSION})", file=args.out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastbus", description="fastbus: fast pub/sub and reliable messaging with a C core.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="run the core on embedded defaults and print its rates",
                          description="Fill a subscription trie, route random topics through it in "
                                      "batches, and show the forwarder and batch format. No server needed.")
    demo.add_argument("--subscriptions", type=_positive, default=200_000,
                      help="topic-like subscriptions to create (default: %(default)s)")
    demo.add_argument("--subscribers", type=_positive, default=2_000,
                      help="distinct subscribers holding them (default: %(default)s)")
    demo.add_argument("--batch", type=_positive, default=1_000,
                      help="topics per routing batch (default: %(default)s)")
    demo.add_argument("--seconds", type=_seconds, default=2.0,
                      help="how long to route for (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=1, help="random seed (default: %(default)s)")
    demo.set_defaults(func=cmd_demo)
    ver = sub.add_parser("version", help="print the version")
    ver.set_defaults(func=cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.out = sys.stdout
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
