"""The ``fastbus`` command line.

(This file is over 700 lines because it is the command line's table of
contents: one short function per command and one parser builder per command,
side by side so that every command's options read alike.)

    fastbus broker [options]     run a broker (default tcp://127.0.0.1:6464)
    fastbus stats [--connect EP] a broker's counters (--clients: per peer; --watch: rates each second)
    fastbus demo                 a broker with live publisher and subscribers, printing rates
    fastbus core-demo            the C core alone: trie, forwarder, batches
    fastbus keygen               a CURVE key pair for --curve-* options
    fastbus queue ACTION NAME    a work queue on Redis: put, peek, stats, return-failed, purge, clean
    fastbus queue list           the queues, topics and inboxes on a Redis server
    fastbus monitor --redis URL  watch the queues: a table, JSON, or HTTP (/metrics, /queuez) with --http
    fastbus topic|inbox ACTION NAME   a topic (publish, read, stats, register) or inbox (create, send, fetch)
    fastbus pub CHANNEL MSG...   publish (or lines from stdin); fastbus sub CHANNEL... prints what arrives
    fastbus psub PATTERN...      print what arrives on Redis glob patterns (or sub --pattern PATTERN)
    fastbus request CHANNEL DATA ask and print the first reply; fastbus reply CHANNEL DATA answers requests
    fastbus redis-server         the embedded Redis server in the foreground, to share between processes
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
from fastbus.cliargs import load_curve_keys, name_values, nonnegative, port_number, positive, seconds
from fastbus.errors import CommandFailed, InvalidEndpoint, UsageError

EXCHANGES = ("NYSE", "NASDAQ", "LSE", "TSE", "HKEX", "SSE", "EURONEXT", "TSX")
KINDS = ("trades", "quotes", "book", "ohlc", "news")


def topic_keys(n: int) -> list[bytes]:
    """n topic-like keys, e.g. b"market.NYSE.00042.trades"."""
    per_symbol = len(EXCHANGES) * len(KINDS)
    symbols = max(1, -(-n // per_symbol))
    keys = [f"market.{ex}.{s:05d}.{k}".encode() for s in range(symbols) for ex in EXCHANGES for k in KINDS]
    return keys[:n]


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


def _server_key(text: str, flag: str = "--curve-server-key") -> str:
    """--curve-server-key: the broker's public key, as 40 Z85 characters or
    as the certificate file that holds it."""
    from fastbus.curve import public_key
    from fastbus.errors import InvalidKey
    try:
        return public_key(text)
    except InvalidKey as exc:
        raise UsageError(f"{flag} {exc}") from None


def _allowed_keys(paths: list[str]) -> list[str]:
    keys = []
    for path in paths:
        files = [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".key")] \
            if os.path.isdir(path) else [path]
        for f in files:
            keys.append(load_curve_keys(f)[0])
    if not keys:
        raise UsageError("--curve-allow found no public keys (*.key files)")
    return keys


def _flag_message(exc: InvalidEndpoint) -> str:
    """An endpoint error of a BrokerConfig field ("upstream: ...") in terms of
    the command line's option ("--upstream: ...")."""
    text = str(exc)
    if exc.setting and text.startswith(f"{exc.setting}:"):
        text = f"--{exc.setting.replace('_', '-')}" + text[len(exc.setting):]
    return text



def cmd_broker(args: argparse.Namespace) -> int:
    from fastbus.broker import Broker, BrokerConfig
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = BrokerConfig(
        bind=args.bind or [P.DEFAULT_ENDPOINT], allow_remote=args.allow_remote, upstream=args.upstream,
        resp=args.resp, resp_password=args.resp_password or os.environ.get("FASTBUS_RESP_PASSWORD"),
        resp_users=name_values(args.resp_user, ":", "--resp-user takes USER:PASSWORD"),
        zmq_pub=args.zmq_pub, zmq_sub=args.zmq_sub, zmq_pull=args.zmq_pull,
        max_messages=args.max_messages, max_bytes=args.max_bytes, max_delay=args.max_delay,
        max_queue_bytes=args.max_queue_bytes, slow_policy=args.slow_policy, max_topic=args.max_topic,
        flow_pause_bytes=None if args.flow_pause_bytes is None else int(args.flow_pause_bytes),
        flow_max_pause=args.flow_max_pause, stuck_timeout=args.stuck_timeout, session_linger=args.session_linger,
        durable_linger=args.durable_linger, journal=args.journal, fsync=args.fsync,
        journal_bytes=args.journal_bytes, filter_lease=args.filter_lease,
        upstream_confirm_timeout=args.upstream_confirm_timeout,
        max_payload=args.max_payload, max_subscriptions=args.max_subscriptions,
        max_subscription_bytes=args.max_subscription_bytes,
        max_total_subscription_bytes=args.max_total_subscription_bytes, max_sub_ops=args.max_sub_ops,
        max_held_groups=args.max_held_groups, max_held_bytes=args.max_held_bytes, allow_brokers=args.allow_broker, name=args.name, stats_interval=args.stats_interval,
        http=args.http, http_max_age=args.http_max_age)
    if args.curve_cert:
        cfg.curve_public_key, cfg.curve_secret_key = load_curve_keys(args.curve_cert)
        if not cfg.curve_secret_key:
            raise UsageError(f"--curve-cert {args.curve_cert!r} has no secret key (use the .key_secret file)")
        if args.curve_allow:
            cfg.curve_allowed = _allowed_keys(args.curve_allow)
        if args.curve_allow_broker:
            cfg.curve_allowed_brokers = _allowed_keys(args.curve_allow_broker)
    elif args.curve_allow or args.curve_allow_broker:
        raise UsageError("--curve-allow and --curve-allow-broker need --curve-cert")
    if args.upstream_curve_server_key or args.upstream_curve_cert:
        if not (args.upstream and args.upstream_curve_server_key):
            raise UsageError("--upstream-curve-server-key and --upstream-curve-cert need --upstream, "
                             "and --upstream-curve-cert needs --upstream-curve-server-key")
        cfg.upstream_curve_server_key = _server_key(args.upstream_curve_server_key, "--upstream-curve-server-key")
        if args.upstream_curve_cert:
            public, secret = load_curve_keys(args.upstream_curve_cert)
            if not secret:
                raise UsageError(f"--upstream-curve-cert {args.upstream_curve_cert!r} has no secret key "
                                 "(use the .key_secret file)")
            cfg.upstream_curve_public_key, cfg.upstream_curve_secret_key = public, secret
        elif not args.curve_cert:
            raise UsageError("--upstream-curve-server-key needs this broker's keys: --upstream-curve-cert "
                             "(or --curve-cert)")
    try:
        broker = Broker(cfg)
    except InvalidEndpoint as exc:
        raise UsageError(_flag_message(exc)) from None
    except ValueError as exc:
        print(f"fastbus broker: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: broker.request_stop())
    signal.signal(signal.SIGINT, lambda *_: broker.request_stop())
    # This process is the broker's: what importing made lives for ever, so
    # keep the cyclic collector from walking it (a full collection of it
    # paused the loop 8-21 ms, which a subscriber saw as a stall).
    import gc
    gc.collect()
    gc.freeze()
    try:
        broker.run()
    except InvalidEndpoint as exc:
        raise UsageError(_flag_message(exc)) from None
    except Exception as exc:
        import zmq

        from fastbus.errors import MonitorBindError
        if isinstance(exc, zmq.ZMQError):
            print(f"fastbus broker: cannot listen: {exc}", file=sys.stderr)
            return 1
        if isinstance(exc, MonitorBindError):
            print(f"fastbus broker: --http: {exc}", file=sys.stderr)
            return 1
        raise
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from fastbus.endpoints import check_connect
    from fastbus.errors import InvalidEndpoint
    endpoint = args.connect or f"tcp://{args.host}:{args.port}"
    try:
        check_connect(endpoint)
    except InvalidEndpoint as exc:
        raise UsageError(str(exc)) from None
    curve = None
    if args.curve_server_key or args.curve_cert:
        if not (args.curve_server_key and args.curve_cert):
            raise UsageError("CURVE needs both --curve-server-key and --curve-cert")
        server = _server_key(args.curve_server_key)
        public, secret = load_curve_keys(args.curve_cert)
        if not secret:
            raise UsageError(f"--curve-cert {args.curve_cert!r} has no secret key (use the .key_secret file)")
        curve = (server, public, secret)
    from fastbus.client import query_stats
    if args.watch:
        return _watch_stats(args, endpoint, curve)
    try:
        st = query_stats(endpoint, args.timeout, curve, clients=args.clients)
    except (TimeoutError, RuntimeError, ConnectionError) as exc:
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
    if args.clients:
        if "connz" not in st:
            print("  (this broker does not list its clients: it is older than `fastbus stats --clients`)",
                  file=out)
        else:
            _print_clients(st["connz"], out)
    return 0


def _size(n: float) -> str:
    """Bytes, short: 512B, 1.5K, 20.3M, 1.2G (as redis-cli --stat)."""
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}B"


def _print_clients(peers: list[dict], out) -> None:
    """One row per peer, as /connz."""
    cols = ("name", "role", "address", "subs", "msgs in", "msgs out", "bytes in", "bytes out", "queued",
            "state", "since")
    rows = []
    for p in sorted(peers, key=lambda p: p["link"]):
        state = "slow" if p["slow"] else "ok"
        if p["holding_publishers"]:
            state = "slow, holding publishers"
        rows.append((str(p["name"]), p["role"], p["address"] or "-", f"{p['subscriptions']:,}",
                     f"{p['messages_in']:,}", f"{p['messages_out']:,}", _size(p["bytes_in"]),
                     _size(p["bytes_out"]), _size(p["queued_bytes"]), state,
                     time.strftime("%H:%M:%S", time.localtime(p["connected_since"]))))
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    left = {0, 1, 2, 9}
    def line(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print(f"\n{len(rows)} peer{'s' if len(rows) != 1 else ''}:", file=out)
    print(line(cols).rstrip(), file=out)
    for r in rows:
        print(line(r).rstrip(), file=out)


_WATCH_HEADER = (f"{'time':8s} {'peers':>6s} {'subs':>9s} {'msg in/s':>11s} {'msg out/s':>11s} "
                 f"{'in/s':>8s} {'out/s':>8s} {'queued':>8s} {'drops/s':>8s} flow")


def _watch_stats(args: argparse.Namespace, endpoint: str, curve) -> int:
    """A line per interval with rates (as redis-cli --stat), until Ctrl-C
    or --count lines."""
    from fastbus.client import query_stats
    out = args.out
    prev = None
    lines = 0
    print(_WATCH_HEADER, file=out, flush=True)
    next_at = time.monotonic()
    while args.count is None or lines < args.count:
        try:
            st = query_stats(endpoint, args.timeout, curve)
        except (TimeoutError, RuntimeError) as exc:
            print(f"{time.strftime('%H:%M:%S')} {exc}", file=out, flush=True)
            lines += 1
            prev = None
        else:
            if prev is not None and prev["instance"] != st["instance"]:
                print(f"{time.strftime('%H:%M:%S')} the broker restarted (instance {st['instance']})", file=out)
                prev = None
            if prev is not None:
                dt = max(1e-6, st["uptime_s"] - prev["uptime_s"])
                def rate(key, st=st, prev=prev, dt=dt):
                    return (st[key] - prev[key]) / dt
                drops = (sum(st["drops"].values()) - sum(prev["drops"].values())) / dt
                print(f"{time.strftime('%H:%M:%S')} {st['peers']:>6,} {st['subscriptions']:>9,} "
                      f"{rate('messages_in'):>11,.0f} {rate('messages_out'):>11,.0f} "
                      f"{_size(rate('bytes_in')):>8s} {_size(rate('bytes_out')):>8s} "
                      f"{_size(st['queued_bytes']):>8s} {drops:>8,.0f} "
                      f"{'paused' if st.get('flow_paused') else '-'}", file=out, flush=True)
                lines += 1
                if lines % 20 == 0 and (args.count is None or lines < args.count):
                    print(_WATCH_HEADER, file=out, flush=True)
            prev = st
        next_at += args.interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from fastbus.demo import run_demo
    return run_demo(args.seconds, args.publishers, args.subscribers, args.channels, args.size, args.out)


def cmd_keygen(args: argparse.Namespace) -> int:
    import zmq.auth
    os.makedirs(args.dir, exist_ok=True)
    paths = [os.path.join(args.dir, f"{args.name}.key{suffix}") for suffix in ("", "_secret")]
    existing = [p for p in paths if os.path.exists(p)]
    if existing and not args.force:
        raise UsageError(f"{' and '.join(existing)} already exist(s): --force to replace (clients and brokers "
                         "holding the old keys then no longer match)")
    for p in existing:
        os.remove(p)
    old_umask = os.umask(0o077)              # the secret file is never readable by others, not even briefly
    try:
        public, secret = zmq.auth.create_certificates(args.dir, args.name)
    finally:
        os.umask(old_umask)
    os.chmod(secret, 0o600)
    os.chmod(public, 0o644)
    print(f"public key file: {public}\nsecret key file: {secret} (mode 0600)", file=args.out)
    return 0


def cmd_redis_server(args: argparse.Namespace) -> int:
    """The embedded server in the foreground: print its URL, run until
    SIGINT/SIGTERM/SIGHUP (or until the server dies), then stop it and
    remove its temporary dir."""
    import threading
    from pathlib import Path

    from fastbus.redis import shared
    from fastbus.redis.server import ENV_URL, EmbeddedServer, EmbeddedServerError
    server_args = list(args.server_args or ())
    if server_args[:1] == ["--"]:
        server_args = server_args[1:]
    if args.stop:
        reg = shared.stop_shared()
        print(f"fastbus redis-server: stopped the shared server at {reg['url']} (pid {reg['pid']}); its data "
              f"stays in {reg['data_dir']}" if reg else "fastbus redis-server: no shared server runs",
              file=sys.stderr)
        return 0
    data_dir, idle_s = args.data_dir, 0.0
    if args.shared:
        running = shared.registered()
        if running is not None:
            print(f"fastbus redis-server: the shared server runs already at {running['url']} (pid {running['pid']})",
                  file=sys.stderr)
            return 1
        idle_s = shared.idle_seconds()
        data_dir = data_dir or str(shared.data_dir())
        os.makedirs(data_dir, mode=0o700, exist_ok=True)
        # What a program put is there for the next one, after a stop too.
        server_args = ["--appendonly", "yes", "--appendfsync", "everysec", *server_args]
    stop = threading.Event()
    got: list[int] = []

    def on_signal(signum, _frame):
        got.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        server = EmbeddedServer(args.binary, port=args.port, data_dir=data_dir, args=server_args,
                                startup_timeout=args.startup_timeout)
        server.start()
    except (EmbeddedServerError, ValueError, TypeError) as exc:
        print(f"fastbus redis-server: {exc}", file=sys.stderr)
        return 1
    watch = None
    try:
        url = server.url
        print(f"fastbus redis-server: {server.server_name} {server.version} (pid {server.pid}) listening "
              f"on {url}; log: {server.log_path}; Ctrl-C or SIGTERM stops it", file=sys.stderr, flush=True)
        print(f"export {ENV_URL}={url}", file=args.out, flush=True)
        if args.shared:
            assert server.pid is not None
            watch = shared.IdleWatch(url, shared.register(url, server.pid, Path(data_dir), idle_s), idle_s)
            print(f"fastbus redis-server: the user's shared server (data in {data_dir}); it stops after "
                  f"{idle_s:g} s with no client", file=sys.stderr, flush=True)
        # Not a message path: a check every half second whether the server
        # died (and, shared, every few seconds whether it is idle).
        looks = 0
        while not stop.wait(0.5):
            if not server.is_running():
                print(f"fastbus redis-server: the server exited; its log:\n{server.log_tail()}",
                      file=sys.stderr, flush=True)
                return 1
            looks += 1
            if watch is not None and looks % max(1, min(10, int(idle_s * 2 / 4))) == 0 and watch.stop_if_idle():
                print(f"fastbus redis-server: stopped: no client for {idle_s:g} s", file=sys.stderr, flush=True)
                return 0
    finally:
        if watch is not None:
            watch.close()
            shared.unregister(shared.runtime_dir())
        server.stop()
    name = signal.Signals(got[0]).name if got else "a signal"
    print(f"fastbus redis-server: stopped ({name})", file=sys.stderr, flush=True)
    return 0


def _version_text() -> str:
    return (f"fastbus {fastbus.__version__} (core {'.'.join(map(str, fastbus.CORE_VERSION))}, "
            f"batch format v{fastbus.BATCH_VERSION})")


class _VersionAction(argparse.Action):
    """``--version``: argparse's own action wants the text when the parser
    is built, which would import importlib.metadata for every command."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(_version_text())
        parser.exit()


def cmd_version(args: argparse.Namespace) -> int:
    print(_version_text(), file=args.out)
    return 0


def _add_broker_parser(sub) -> None:
    """``fastbus broker``: its options in groups, as --help shows them."""
    b = sub.add_parser("broker", help="run a broker",
                       description="Run a fastbus broker until SIGINT or SIGTERM. Listens on loopback "
                                   f"only unless --allow-remote (default {P.DEFAULT_ENDPOINT}).")
    g = b.add_argument_group("Where it listens, and its neighbours")
    g.add_argument("--bind", action="append", metavar="ENDPOINT",
                   help="endpoint for clients, repeatable: tcp://127.0.0.1:6464, ipc:///tmp/fastbus.sock "
                        f"(default: {P.DEFAULT_ENDPOINT})")
    g.add_argument("--resp", action="append", default=[], metavar="ENDPOINT",
                   help="endpoint where Redis clients connect too (the Redis protocol, pub/sub commands), "
                        "repeatable: tcp://127.0.0.1:6379, redis://127.0.0.1:6379, unix:///tmp/redis.sock; "
                        "fastbus clients may use it as well")
    g.add_argument("--resp-password", metavar="PASSWORD",
                   help="Redis clients must AUTH with this password, as Redis's requirepass "
                        "(default: $FASTBUS_RESP_PASSWORD, else no AUTH needed)")
    g.add_argument("--resp-user", action="append", default=[], metavar="USER:PASSWORD",
                   help="a user Redis clients may AUTH as (AUTH USER PASSWORD, HELLO 3 AUTH ...), repeatable")
    g.add_argument("--allow-remote", action="store_true", help="allow non-loopback TCP endpoints")
    g.add_argument("--upstream", metavar="ENDPOINT", help="federate: connect to this upstream broker")
    g.add_argument("--upstream-curve-server-key", metavar="KEY",
                   help="CURVE to the upstream: its public key (40 Z85 characters, or its .key file); "
                        "it must list this broker's key with --curve-allow-broker")
    g.add_argument("--upstream-curve-cert", metavar="FILE",
                   help="this broker's secret certificate for the upstream connection "
                        "(default: --curve-cert's)")
    g.add_argument("--zmq-pub", action="append", default=[], metavar="ENDPOINT",
                   help="XPUB endpoint for plain ZeroMQ SUB sockets ([channel, payload] frames)")
    g.add_argument("--zmq-sub", action="append", default=[], metavar="ENDPOINT",
                   help="XSUB endpoint for plain ZeroMQ PUB sockets")
    g.add_argument("--zmq-pull", action="append", default=[], metavar="ENDPOINT",
                   help="PULL endpoint for plain ZeroMQ PUSH sockets")
    g = b.add_argument_group("Batches, slow subscribers and flow control")
    g.add_argument("--max-messages", type=positive, default=4096, help="records per batch to a subscriber (default: %(default)s)")
    g.add_argument("--max-bytes", type=positive, default=256 * 1024, help="bytes per batch to a subscriber (default: %(default)s)")
    g.add_argument("--max-delay", type=float, default=0.0,
                   help="optional linger in seconds: a busy link gets at most one batch per this "
                        "time (larger batches), while a link idle that long still sends at once; "
                        "0: no linger, each batch leaves as soon as the broker has read what "
                        "arrived (default: %(default)s)")
    g.add_argument("--max-queue-bytes", type=positive, default=32 << 20,
                   help="bytes queued for a slow subscriber before --slow-policy applies (at least twice "
                        "--max-bytes; drop keeps its newest batch) (default: %(default)s)")
    g.add_argument("--slow-policy", choices=["drop", "disconnect"], default="drop",
                   help="slow subscriber: drop its oldest batches (with a gap notice) or disconnect it "
                        "(default: %(default)s)")
    g.add_argument("--flow-pause-bytes", type=nonnegative, default=None,
                   help="ask publishers to pause while this many bytes are queued for a subscriber; "
                        "0: no flow control (default: 4 MiB or a quarter of --max-queue-bytes)")
    g.add_argument("--flow-max-pause", type=float, default=5.0,
                   help="seconds one subscriber may keep publishers paused (default: %(default)s)")
    g.add_argument("--stuck-timeout", type=nonnegative, default=60.0, metavar="SECONDS",
                   help="disconnect, as a slow consumer, a session that takes nothing for this long while "
                        "messages wait for it (a stopped or hung process); 0: never (default: %(default)s)")
    g.add_argument("--session-linger", type=nonnegative, default=30.0, metavar="SECONDS",
                   help="how long a client whose connection was lost keeps its session (subscriptions, and "
                        "what is routed to it, within --max-queue-bytes): back within it, it resumes and "
                        "misses nothing; 0: sessions end with their connection (default: %(default)s)")
    g.add_argument("--journal", metavar="DIR",
                   help="journal what lingering sessions are owed into DIR (created if missing): a broker killed "
                        "and started again with the same DIR loses nothing a client was told it took")
    g.add_argument("--fsync", choices=("always", "everysec", "no"), default="everysec",
                   help="when the journal reaches the disk, as Redis's appendfsync: always (before anything is "
                        "acknowledged), everysec (a kill -9 loses nothing, a power cut up to a second), no "
                        "(default: %(default)s)")
    g.add_argument("--journal-bytes", type=positive, default=1024 * 1024 * 1024, metavar="BYTES",
                   help="the journal's disk bound; what does not fit is told, at a restart, as a GAP with its "
                        "count (default: 1 GiB)")
    g.add_argument("--durable-linger", type=nonnegative, default=3600.0, metavar="SECONDS",
                   help="how long a durable subscriber's session (pubsub(durable=NAME)) is kept once its "
                        "process is gone: a process presenting the name within it resumes where the last one "
                        "stopped taking messages; 0: no durable sessions (default: %(default)s)")
    g.add_argument("--filter-lease", type=seconds, default=0.1, metavar="SECONDS",
                   help="a subscription is confirmed once every publisher's filter has it; a publisher "
                        "that does not acknowledge within this time (stopped, or starved) has stopped "
                        "filtering by then, and is not waited for longer (default: %(default)s)")
    g.add_argument("--upstream-confirm-timeout", type=seconds, default=1.0, metavar="SECONDS",
                   help="with --upstream: how long a confirmation waits for the upstream broker's "
                        "(default: %(default)s)")
    g = b.add_argument_group("What one connection may send or hold")
    g.add_argument("--max-topic", type=positive, default=65535,
                   help="longest channel name accepted, in bytes (default: %(default)s)")
    g.add_argument("--max-payload", type=positive, default=16 << 20,
                   help="largest payload accepted, in bytes (default: %(default)s)")
    g.add_argument("--max-subscriptions", type=positive, default=1_000_000,
                   help="subscriptions one connection (client or downstream broker) may hold; more are "
                        "refused, and the client told (default: %(default)s)")
    g.add_argument("--max-subscription-bytes", type=positive, default=64 << 20,
                   help="bytes of subscription keys one connection may hold, counting 48 more per "
                        "subscription (default: %(default)s)")
    g.add_argument("--max-total-subscription-bytes", type=positive, default=1 << 30,
                   help="the same for all connections together (default: %(default)s)")
    g.add_argument("--max-sub-ops", type=positive, default=4096,
                   help="subscription changes in one SUB frame, at least 1000; clients split larger ones "
                        "(default: %(default)s)")
    g.add_argument("--max-held-groups", type=positive, default=10_000,
                   help="held queue groups (work queues that keep what arrives while no worker is there: "
                        "the Channels layer's named channels) the broker holds; more are refused "
                        "(default: %(default)s)")
    g.add_argument("--max-held-bytes", type=positive, default=64 << 20,
                   help="what the held groups may keep together, in bytes; past it a send is refused as "
                        "full (default: %(default)s)")
    g = b.add_argument_group("Who may connect")
    g.add_argument("--allow-broker", action="append", default=[], metavar="ADDRESS",
                   help="accept downstream brokers (--upstream pointing here) from this IP address, "
                        "network (10.1.0.0/16) or 'local' (loopback, ipc, inproc); repeatable; "
                        "by default none are accepted")
    g.add_argument("--curve-allow-broker", action="append", default=[], metavar="PATH",
                   help="with CURVE: accept downstream brokers with these public keys (certificate "
                        "files or directories); then --allow-broker does not apply")
    g.add_argument("--curve-cert", metavar="FILE", help="enable CURVE with this secret certificate (keygen)")
    g.add_argument("--curve-allow", action="append", default=[], metavar="PATH",
                   help="public certificate file or directory of clients to accept (with --curve-cert)")
    g = b.add_argument_group("Name, monitoring and logs")
    g.add_argument("--name", default="fastbus", help="broker name in logs and stats (default: %(default)s)")
    g.add_argument("--stats-interval", type=nonnegative, default=10.0,
                   help="seconds between counter log lines, 0 for none (default: %(default)s)")
    g.add_argument("--http", metavar="HOST:PORT",
                   help="serve monitoring over HTTP here, e.g. 127.0.0.1:8222: /metrics (Prometheus), "
                        "/varz, /connz, /subsz, /healthz and a live page at /; loopback only unless "
                        "--allow-remote (default: off)")
    g.add_argument("--http-max-age", type=float, default=3.0, metavar="SECONDS",
                   help="/healthz answers 503 when the loop's latest snapshot is older than this "
                        "(default: %(default)s)")
    g.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="what the broker logs to stderr (default: %(default)s)")
    b.set_defaults(func=cmd_broker)


def _add_stats_parser(sub) -> None:
    st = sub.add_parser("stats", help="print a broker's counters",
                        description="Print a broker's counters; --clients adds a row per connected peer, "
                                    "--watch prints a line of rates every second until Ctrl-C.")
    st.add_argument("--connect", metavar="ENDPOINT", help="broker endpoint (default from --host/--port)")
    st.add_argument("--host", default="127.0.0.1", help="broker host, without --connect (default: %(default)s)")
    st.add_argument("--port", type=port_number, default=P.DEFAULT_PORT,
                    help="broker port, without --connect (default: %(default)s)")
    st.add_argument("--timeout", type=float, default=5.0,
                    help="seconds to wait for the broker's answer (default: %(default)s)")
    st.add_argument("--json", action="store_true", help="all counters as JSON")
    st.add_argument("--clients", action="store_true",
                    help="also one row per connected peer (name, role, address, subscriptions, messages "
                         "and bytes in and out, queued bytes, state), as the HTTP endpoint /connz")
    st.add_argument("--watch", action="store_true",
                    help="a line every --interval seconds with rates (messages and bytes in and out per "
                         "second, drops), as redis-cli --stat, until Ctrl-C or --count lines")
    st.add_argument("--interval", type=seconds, default=1.0,
                    help="seconds between --watch lines (default: %(default)s)")
    st.add_argument("--count", type=positive, default=None,
                    help="with --watch: stop after this many lines (default: until Ctrl-C)")
    st.add_argument("--curve-server-key", metavar="KEY",
                    help="the broker's public key (40 Z85 characters, or its .key file), for a CURVE broker")
    st.add_argument("--curve-cert", metavar="FILE", help="this client's secret certificate, for a CURVE broker")
    st.set_defaults(func=cmd_stats)


def _add_demo_parsers(sub) -> None:
    demo = sub.add_parser("demo", help="a broker with live publishers and subscribers printing their rates",
                          description="Start a broker and client processes on this machine (the workload of the "
                                      "article 'A Tale of Two Queues': 50 channels, 20-byte messages) and print "
                                      "rates each second.")
    demo.add_argument("--seconds", type=seconds, default=5.0, help="how long (default: %(default)s)")
    demo.add_argument("--publishers", type=positive, default=1,
                      help="publisher processes (default: %(default)s)")
    demo.add_argument("--subscribers", type=positive, default=2,
                      help="subscriber processes, each on every channel (default: %(default)s)")
    demo.add_argument("--channels", type=positive, default=50, help="channels (default: %(default)s)")
    demo.add_argument("--size", type=positive, default=20, help="payload bytes (default: %(default)s)")
    demo.set_defaults(func=cmd_demo)

    core = sub.add_parser("core-demo", help="the C core alone: trie, forwarder, batches",
                          description="Fill a subscription trie, route random topics through it in "
                                      "batches, and show the forwarder and batch format. No server.")
    core.add_argument("--subscriptions", type=positive, default=200_000,
                      help="topic-like subscriptions to create (default: %(default)s)")
    core.add_argument("--subscribers", type=positive, default=2_000,
                      help="distinct subscribers holding them (default: %(default)s)")
    core.add_argument("--batch", type=positive, default=1_000,
                      help="topics per routing batch (default: %(default)s)")
    core.add_argument("--seconds", type=seconds, default=2.0,
                      help="how long to route for (default: %(default)s)")
    core.add_argument("--seed", type=int, default=1, help="random seed (default: %(default)s)")
    core.set_defaults(func=cmd_core_demo)


def _add_keygen_parser(sub) -> None:
    kg = sub.add_parser("keygen", help="create a CURVE key pair (NAME.key, NAME.key_secret)")
    kg.add_argument("--dir", default=".", help="where to write them (default: %(default)s)")
    kg.add_argument("--name", default="fastbus",
                    help="the files' names: NAME.key (public) and NAME.key_secret (default: %(default)s)")
    kg.add_argument("--force", action="store_true", help="replace key files that exist (default: refuse)")
    kg.set_defaults(func=cmd_keygen)


def _add_redis_server_parser(sub) -> None:
    rs = sub.add_parser(
        "redis-server", help="run the embedded Redis server in the foreground; --stop the user's shared one",
        description="Start fastbus's embedded Redis-compatible server (the bundled valkey-server, else "
                    "$FASTBUS_REDIS_SERVER, valkey-server or redis-server on PATH) on 127.0.0.1, print "
                    "`export FASTBUS_REDIS_URL=redis://127.0.0.1:PORT` on stdout, and run until Ctrl-C, "
                    "SIGTERM or SIGHUP; then stop it and remove its temporary dir (persistence off: the "
                    "data lives as long as the server). Processes that export that variable use this "
                    "server when they pass no URL. Without it, programs and commands given no URL use the "
                    "user's shared server, which the first of them starts (--shared) and the others find; "
                    "--stop stops it.",
        epilog="Example: `fastbus redis-server --port 6390` in one terminal, then "
               "`export FASTBUS_REDIS_URL=redis://127.0.0.1:6390` in the others.")
    rs.add_argument("--port", type=port_number, default=None,
                    help="TCP port on 127.0.0.1 (default: a free one, printed)")
    rs.add_argument("--binary", default=None,
                    help="the server binary (default: $FASTBUS_REDIS_SERVER, else the bundled valkey-server, "
                         "else valkey-server or redis-server on PATH)")
    rs.add_argument("--data-dir", default=None,
                    help="directory for its config and log, kept (default: a temporary one, removed)")
    rs.add_argument("--startup-timeout", type=seconds, default=10.0,
                    help="seconds to wait for the server to answer (default: %(default)s)")
    rs.add_argument("--shared", action="store_true",
                    help="run it as the user's shared server, the one programs and commands given no URL use "
                         "(they start it themselves when none runs): registered for them, its data kept "
                         "(append-only file) in $FASTBUS_STATE_DIR/redis, else ~/.local/state/fastbus/redis, "
                         "stopped after $FASTBUS_REDIS_IDLE seconds (600) with no client")
    rs.add_argument("--stop", action="store_true",
                    help="stop the user's shared server (its data stays for the next one) and exit")
    rs.add_argument("server_args", nargs=argparse.REMAINDER, metavar="-- OPTION ...",
                    help="options passed to the server, after --: e.g. -- --maxmemory 1gb")
    rs.set_defaults(func=cmd_redis_server)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: one function per command (or family) adds
    its parser; the queue, pub/sub and monitor commands live with their
    packages."""
    parser = argparse.ArgumentParser(
        prog="fastbus", description="fastbus: fast pub/sub and reliable messaging with a C core.")
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_broker_parser(sub)
    _add_stats_parser(sub)
    _add_demo_parsers(sub)
    _add_keygen_parser(sub)

    from fastbus.queue.cli import add_parser as add_queue_parser
    from fastbus.queue.cli import add_topic_inbox_parsers
    add_queue_parser(sub)
    add_topic_inbox_parsers(sub)

    from fastbus.pubsub_cli import add_parsers as add_pubsub_parsers
    add_pubsub_parsers(sub)

    from fastbus.monitor.cli import add_parser as add_monitor_parser
    add_monitor_parser(sub)
    _add_redis_server_parser(sub)
    ver = sub.add_parser("version", help="print the version")
    ver.set_defaults(func=cmd_version)
    return parser


#: Options whose value is a Z85 key, which may start with "-" (one key in
#: 85), or a file, where a key given by mistake gets its own error ("is a
#: key, not a certificate file"): argparse would take such a value for an
#: option and say "expected one argument".  Given as ``--opt=value``, it is
#: a value.
KEY_OPTIONS = ("--curve-server-key", "--upstream-curve-server-key", "--curve-cert", "--upstream-curve-cert")


def join_key_values(argv: Sequence[str]) -> list[str]:
    """``--curve-server-key -abc...`` as ``--curve-server-key=-abc...``."""
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg in KEY_OPTIONS:
            value = next(it, None)
            out.append(arg if value is None else f"{arg}={value}")
        else:
            out.append(arg)
    return out


def unrecognized(command: str, extras: list[str]) -> str:
    """What a command says of arguments it does not take: which, and for
    the usual mistakes, what was meant."""
    why = f"unrecognized arguments: {' '.join(extras)}"
    if command == "broker":
        given = dict(zip(extras, extras[1:] + [""]))
        port = next((v.partition("=")[2] for v in extras if v.startswith("--port=")), given.get("--port"))
        host = next((v.partition("=")[2] for v in extras if v.startswith("--host=")), given.get("--host"))
        if port is not None or host is not None:
            why += (f"; the broker listens where --bind says: --bind tcp://{host or '127.0.0.1'}:"
                    f"{port or P.DEFAULT_PORT} (repeatable; --resp for Redis clients)")
    return why


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(join_key_values(sys.argv[1:] if argv is None else argv))
    if not getattr(args, "func", None):
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        parser.print_help()
        return 2
    args.out = sys.stdout
    prog = f"fastbus {args.command}"
    if extras:
        print(f"{prog}: {unrecognized(args.command, extras)} (see {prog} --help)", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except UsageError as exc:                # exit 2: the command line is wrong
        print(f"{prog}: {exc} (see {prog} --help)", file=sys.stderr)
        return 2
    except (CommandFailed, fastbus.FastbusError, OSError) as exc:   # exit 1: the work failed
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        # No traceback for a user: one line, and how to see it.
        if os.environ.get("FASTBUS_TRACEBACK"):
            raise
        print(f"{prog}: {type(exc).__name__}: {exc} (FASTBUS_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
