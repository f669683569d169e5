"""The ``fastbus`` command line.

    fastbus broker [options]     run a broker (default tcp://127.0.0.1:6464)
    fastbus stats [--connect EP] a broker's counters
    fastbus demo                 a broker with live publisher and subscribers, printing rates
    fastbus core-demo            the C core alone: trie, forwarder, batches
    fastbus keygen               a CURVE key pair for --curve-* options
    fastbus queue ACTION NAME    a work queue on Redis: put, peek, stats, return-failed, purge, clean
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import time
from collections.abc import Sequence

import fastbus
from fastbus import protocol as P

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


def cmd_core_demo(args: argparse.Namespace) -> int:
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
        _offsets, ids = trie.match_flat(batches[i % len(batches)])
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


def _load_curve_keys(path: str) -> tuple[str, str | None]:
    """(public, secret) Z85 keys from a zmq certificate file (keygen)."""
    import zmq.auth
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"fastbus: cannot read CURVE certificate {path!r}: {exc}") from None
    return public.decode(), secret.decode() if secret else None


def _allowed_keys(paths: list[str]) -> list[str]:
    keys = []
    for path in paths:
        files = [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".key")] \
            if os.path.isdir(path) else [path]
        for f in files:
            keys.append(_load_curve_keys(f)[0])
    if not keys:
        raise SystemExit("fastbus: --curve-allow found no public keys (*.key files)")
    return keys


def cmd_broker(args: argparse.Namespace) -> int:
    from fastbus.broker import Broker, BrokerConfig
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = BrokerConfig(
        bind=args.bind or [P.DEFAULT_ENDPOINT], allow_remote=args.allow_remote, upstream=args.upstream,
        zmq_pub=args.zmq_pub, zmq_sub=args.zmq_sub, zmq_pull=args.zmq_pull,
        max_messages=args.max_messages, max_bytes=args.max_bytes, max_delay=args.max_delay,
        max_queue_bytes=args.max_queue_bytes, slow_policy=args.slow_policy, max_topic=args.max_topic,
        flow_pause_bytes=None if args.flow_pause_bytes is None else int(args.flow_pause_bytes),
        flow_max_pause=args.flow_max_pause,
        max_payload=args.max_payload, max_subscriptions=args.max_subscriptions, name=args.name,
        stats_interval=args.stats_interval)
    if args.curve_cert:
        cfg.curve_public_key, cfg.curve_secret_key = _load_curve_keys(args.curve_cert)
        if not cfg.curve_secret_key:
            raise SystemExit(f"fastbus: {args.curve_cert!r} has no secret key (use the .key_secret file)")
        if args.curve_allow:
            cfg.curve_allowed = _allowed_keys(args.curve_allow)
    elif args.curve_allow:
        raise SystemExit("fastbus: --curve-allow needs --curve-cert")
    try:
        broker = Broker(cfg)
    except ValueError as exc:
        print(f"fastbus broker: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: broker.request_stop())
    signal.signal(signal.SIGINT, lambda *_: broker.request_stop())
    try:
        broker.run()
    except Exception as exc:
        import zmq
        if isinstance(exc, zmq.ZMQError):
            print(f"fastbus broker: cannot listen: {exc}", file=sys.stderr)
            return 1
        raise
    return 0


def query_stats(endpoint: str, timeout: float = 5.0, curve: tuple[str, str, str] | None = None) -> dict:
    """A broker's counters, over a short-lived connection.  ``curve``:
    (broker public key, client public key, client secret key), Z85."""
    import zmq
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    try:
        if curve:
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = (k.encode() for k in curve)
        s.connect(endpoint)
        s.send(P.STATS)
        if not s.poll(int(timeout * 1000)):
            raise TimeoutError(f"no broker answered at {endpoint} within {timeout:g} s")
        frames = s.recv_multipart()
        if frames[0] != P.STATS_REPLY or len(frames) != 2:
            raise RuntimeError(f"unexpected answer from {endpoint}")
        return P.load_json(frames[1], limit=16 << 20)
    finally:
        s.close()


def cmd_stats(args: argparse.Namespace) -> int:
    endpoint = args.connect or f"tcp://{args.host}:{args.port}"
    curve = None
    if args.curve_server_key or args.curve_cert:
        if not (args.curve_server_key and args.curve_cert):
            raise SystemExit("fastbus stats: CURVE needs both --curve-server-key and --curve-cert")
        public, secret = _load_curve_keys(args.curve_cert)
        if not secret:
            raise SystemExit(f"fastbus stats: {args.curve_cert!r} has no secret key")
        curve = (args.curve_server_key, public, secret)
    try:
        st = query_stats(endpoint, args.timeout, curve)
    except (TimeoutError, RuntimeError) as exc:
        print(f"fastbus stats: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(st, indent=2), file=args.out)
        return 0
    out = args.out
    print(f"broker {st['name']} ({st['instance']}), up {st['uptime_s']:.0f} s, on {', '.join(st['endpoints'])}",
          file=out)
    links = ", ".join(f"{v} {k}" for k, v in sorted(st["links"].items())) or "none"
    print(f"  links: {links}; publishers {st['publishers']}", file=out)
    print(f"  subscriptions {st['subscriptions']:,} ({st['keys']:,} keys)", file=out)
    print(f"  in:  {st['messages_in']:,} messages in {st['batches_in']:,} batches, {st['bytes_in']:,} bytes",
          file=out)
    print(f"  out: {st['messages_out']:,} messages in {st['batches_out']:,} batches, {st['bytes_out']:,} bytes",
          file=out)
    drops = {k: v for k, v in st["drops"].items() if v}
    print(f"  dropped: {', '.join(f'{k} {v:,}' for k, v in drops.items()) or 'nothing'}", file=out)
    if st.get("upstream"):
        up = st["upstream"]
        print(f"  upstream {up['endpoint']}: {'connected' if up['connected'] else 'not connected'}", file=out)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from fastbus.demo import run_demo
    return run_demo(args.seconds, args.publishers, args.subscribers, args.channels, args.size, args.out)


def cmd_keygen(args: argparse.Namespace) -> int:
    import zmq.auth
    os.makedirs(args.dir, exist_ok=True)
    public, secret = zmq.auth.create_certificates(args.dir, args.name)
    print(f"public key file: {public}\nsecret key file: {secret}", file=args.out)
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    print(f"fastbus {fastbus.__version__} (core {'.'.join(map(str, fastbus.CORE_VERSION))}, "
          f"batch format v{fastbus.BATCH_VERSION})", file=args.out)
    return 0


def _nonneg(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastbus", description="fastbus: fast pub/sub and reliable messaging with a C core.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    b = sub.add_parser("broker", help="run a broker",
                       description="Run a fastbus broker until SIGINT or SIGTERM. Listens on loopback "
                                   f"only unless --allow-remote (default {P.DEFAULT_ENDPOINT}).")
    b.add_argument("--bind", action="append", metavar="ENDPOINT",
                   help="endpoint for clients, repeatable: tcp://127.0.0.1:6464, ipc:///tmp/fastbus.sock")
    b.add_argument("--allow-remote", action="store_true", help="allow non-loopback TCP endpoints")
    b.add_argument("--upstream", metavar="ENDPOINT", help="federate: connect to this upstream broker")
    b.add_argument("--zmq-pub", action="append", default=[], metavar="ENDPOINT",
                   help="XPUB endpoint for plain ZeroMQ SUB sockets ([channel, payload] frames)")
    b.add_argument("--zmq-sub", action="append", default=[], metavar="ENDPOINT",
                   help="XSUB endpoint for plain ZeroMQ PUB sockets")
    b.add_argument("--zmq-pull", action="append", default=[], metavar="ENDPOINT",
                   help="PULL endpoint for plain ZeroMQ PUSH sockets")
    b.add_argument("--max-messages", type=_positive, default=4096, help="records per batch to a subscriber")
    b.add_argument("--max-bytes", type=_positive, default=256 * 1024, help="bytes per batch to a subscriber")
    b.add_argument("--max-delay", type=float, default=0.001,
                   help="seconds a message may wait for its batch (default: %(default)s)")
    b.add_argument("--max-queue-bytes", type=_positive, default=32 << 20,
                   help="bytes queued for a slow subscriber before --slow-policy applies")
    b.add_argument("--slow-policy", choices=["drop", "disconnect"], default="drop",
                   help="slow subscriber: drop its oldest batches (with a gap notice) or disconnect it")
    b.add_argument("--flow-pause-bytes", type=_nonneg, default=None,
                   help="ask publishers to pause while this many bytes are queued for a subscriber; "
                        "0: no flow control (default: 4 MiB or a quarter of --max-queue-bytes)")
    b.add_argument("--flow-max-pause", type=float, default=5.0,
                   help="seconds one subscriber may keep publishers paused (default: %(default)s)")
    b.add_argument("--max-topic", type=_positive, default=65535, help="longest channel name accepted")
    b.add_argument("--max-payload", type=_positive, default=16 << 20, help="largest payload accepted")
    b.add_argument("--max-subscriptions", type=_positive, default=1_000_000, help="per client")
    b.add_argument("--curve-cert", metavar="FILE", help="enable CURVE with this secret certificate (keygen)")
    b.add_argument("--curve-allow", action="append", default=[], metavar="PATH",
                   help="public certificate file or directory of clients to accept (with --curve-cert)")
    b.add_argument("--name", default="fastbus", help="broker name in logs and stats")
    b.add_argument("--stats-interval", type=_nonneg, default=10.0,
                   help="seconds between counter log lines, 0 for none (default: %(default)s)")
    b.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    b.set_defaults(func=cmd_broker)

    st = sub.add_parser("stats", help="print a broker's counters")
    st.add_argument("--connect", metavar="ENDPOINT", help="broker endpoint (default from --host/--port)")
    st.add_argument("--host", default="127.0.0.1")
    st.add_argument("--port", type=int, default=P.DEFAULT_PORT)
    st.add_argument("--timeout", type=float, default=5.0)
    st.add_argument("--json", action="store_true", help="all counters as JSON")
    st.add_argument("--curve-server-key", metavar="KEY", help="the broker's public key (Z85), for a CURVE broker")
    st.add_argument("--curve-cert", metavar="FILE", help="this client's secret certificate, for a CURVE broker")
    st.set_defaults(func=cmd_stats)

    demo = sub.add_parser("demo", help="a broker with live publishers and subscribers printing their rates",
                          description="Start a broker and client processes on this machine (seed 000's "
                                      "workload: 50 channels, 20-byte messages) and print rates each second.")
    demo.add_argument("--seconds", type=_seconds, default=5.0, help="how long (default: %(default)s)")
    demo.add_argument("--publishers", type=_positive, default=1)
    demo.add_argument("--subscribers", type=_positive, default=2)
    demo.add_argument("--channels", type=_positive, default=50)
    demo.add_argument("--size", type=_positive, default=20, help="payload bytes")
    demo.set_defaults(func=cmd_demo)

    core = sub.add_parser("core-demo", help="the C core alone: trie, forwarder, batches",
                          description="Fill a subscription trie, route random topics through it in "
                                      "batches, and show the forwarder and batch format. No server.")
    core.add_argument("--subscriptions", type=_positive, default=200_000,
                      help="topic-like subscriptions to create (default: %(default)s)")
    core.add_argument("--subscribers", type=_positive, default=2_000,
                      help="distinct subscribers holding them (default: %(default)s)")
    core.add_argument("--batch", type=_positive, default=1_000,
                      help="topics per routing batch (default: %(default)s)")
    core.add_argument("--seconds", type=_seconds, default=2.0,
                      help="how long to route for (default: %(default)s)")
    core.add_argument("--seed", type=int, default=1, help="random seed (default: %(default)s)")
    core.set_defaults(func=cmd_core_demo)

    kg = sub.add_parser("keygen", help="create a CURVE key pair (NAME.key, NAME.key_secret)")
    kg.add_argument("--dir", default=".", help="where to write them")
    kg.add_argument("--name", default="fastbus")
    kg.set_defaults(func=cmd_keygen)

    from fastbus.queue.cli import add_parser as add_queue_parser
    add_queue_parser(sub)

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
