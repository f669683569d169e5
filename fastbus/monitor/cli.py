"""fastbus monitor: the queues of a Redis server (and brokers) for operators.

    fastbus monitor --redis redis://127.0.0.1:6379/0                 # a table every interval
    fastbus monitor --redis URL --once [--json]                      # one sample (rates over --interval)
    fastbus monitor --redis URL --http 127.0.0.1:8223                # serve /metrics, /queuez, /healthz
    fastbus monitor --redis URL --http 127.0.0.1:8223 --broker tcp://127.0.0.1:6464 [--broker EP2 ...]

With --http it serves, on loopback unless --allow-remote:
    /metrics   Prometheus text format: fastbus_queue_*, and with --broker the
               broker's fastbus_broker_* (as `fastbus broker --http` serves them;
               with several --broker, each sample has a broker="ENDPOINT" label)
    /queuez    every queue, topic (per logical consumer) and inbox as JSON
               (?history=SECONDS adds the rates' recent series, ?kind=, ?name= filter)
    /varz      the same without --broker; with it, one section per source:
               {"queues": ..., "broker": ..., "broker-2": ...}
    /connz     with --broker: the (first) broker's peers; /broker-2/connz the second's
    /subsz     with --broker: its subscription counts (the ranking of keys by
               subscribers only from the broker's own --http)
    /healthz   200 while every source is healthy (the Redis samples succeed, each
               broker answered lately: within 3 intervals + a poll's timeout,
               at least 3 s), 503 otherwise, saying which
    /          a live page of all of it

A broker is polled every --interval over its own protocol (a STATS request,
as `fastbus stats --clients`); for a CURVE broker give --curve-cert and
--curve-server-key (once for all brokers, or once per --broker, in order).

The server is --redis, else $FASTBUS_REDIS_URL, else redis://127.0.0.1:6379/0.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any, TextIO

from fastbus.cliargs import URL_HELP, load_curve_keys, redis_url
from fastbus.errors import UsageError

DEFAULT_HTTP = "127.0.0.1:8223"


def start_http(source: Any, address: str, allow_remote: bool = False) -> Any:
    """Serve ``source`` at ``address`` ("HOST:PORT"; port 0: a free one).
    Returns the started MonitorServer (``url``, ``stop()``); ValueError for
    an address refused (not loopback without ``allow_remote``)."""
    from fastbus.monitor.http import MonitorServer
    return MonitorServer(source, address, allow_remote).start()


def broker_sources(endpoints: list[str], *, interval: float = 1.0, curve_server_keys: list[str] | None = None,
                   curve_cert: str | None = None) -> dict[str, Any]:
    """The RemoteBrokerSource of each ``--broker``, by the id it is served
    under (``"broker"``, ``"broker-2"``, ...), not started.  CURVE: the
    client certificate file and the brokers' public keys (one for all, or
    one per endpoint, in order).  UsageError (exit 2) for bad options."""
    from fastbus.monitor.remote import RemoteBrokerSource
    keys = list(curve_server_keys or ())
    curves: list = [None] * len(endpoints)
    if keys or curve_cert:
        if not (keys and curve_cert):
            raise UsageError("CURVE needs both --curve-server-key and --curve-cert")
        if len(keys) not in (1, len(endpoints)):
            raise UsageError(f"{len(keys)} --curve-server-key for {len(endpoints)} --broker: "
                             f"give one for all, or one per --broker in the same order")
        public, secret = load_curve_keys(curve_cert)
        if not secret:
            raise UsageError(f"{curve_cert!r} has no secret key")
        curves = [(keys[0] if len(keys) == 1 else keys[i], public, secret) for i in range(len(endpoints))]
    if len(set(endpoints)) != len(endpoints):
        raise UsageError("the same --broker is given twice")
    out = {}
    for i, (endpoint, curve) in enumerate(zip(endpoints, curves)):
        try:
            out["broker" if i == 0 else f"broker-{i + 1}"] = RemoteBrokerSource(endpoint, interval=interval,
                                                                                curve=curve)
        except ValueError as e:
            raise UsageError(f"--broker {endpoint}: {e}") from None
    return out


def served_source(queues: Any, brokers: dict[str, Any]) -> Any:
    """What --http serves: the queue source alone, or with brokers a
    CompositeSource of the queues and each broker."""
    if not brokers:
        return queues
    from fastbus.monitor.http import CompositeSource
    return CompositeSource({"queues": queues, **brokers}, title=f"fastbus monitor: {queues.server}")


# -- the terminal side


def _rate_text(rates: dict) -> str:
    shown = [f"{k} {v:,.1f}/s" for k, v in rates.items() if v]
    return ", ".join(shown) or "idle"


def _brokers_json(brokers: dict[str, Any]) -> dict:
    """Each broker's /varz by id (or its endpoint and why it has none)."""
    return {sid: (b.varz({}) if b.snapshots.latest else {"endpoint": b.endpoint, "error": b.last_error})
            for sid, b in brokers.items()}


def print_broker(source: Any, out: TextIO) -> None:
    """A broker's line (and one per failure) for the table."""
    latest = source.snapshots.latest
    if latest is None or source.last_error:
        print(f"broker {source.endpoint}: no answer ({source.last_error or 'not polled yet'})", file=out)
        if latest is None:
            return
    stats = latest[3][0]
    rates, _span = source.snapshots.rates(5.0)
    shown = {k: rates[k] for k in ("messages_in", "messages_out", "bytes_in", "bytes_out", "dropped")
             if k in rates}
    print(f"broker {stats['name']} at {source.endpoint}: {stats['peers']} sessions, "
          f"{stats['subscriptions']:,} subscriptions, messages in {stats['messages_in']:,}, "
          f"out {stats['messages_out']:,}, dropped {sum(stats['drops'].values()):,}, "
          f"queued {stats['queued_bytes']:,} bytes; {_rate_text(shown)}", file=out)


def print_table(snap: dict, out: TextIO) -> None:
    """One sample as text: a line per queue, topic consumer and inbox."""
    head = f"{snap['server']} ({snap['prefix']}): {snap['counts']['queues']} queues, " \
           f"{snap['counts']['topics']} topics, {snap['counts']['inboxes']} inboxes"
    if not snap["ok"]:
        head += f"  [sample failed: {snap['error']}]"
    print(head, file=out)

    def space(label: str, s: dict) -> None:
        print(f"  {label}: ready {s['ready']:,}, unacked {s['unacked']:,}, failed {s['failed']:,}; "
              f"consumers {s['live']} live, {s['dead']} dead; {_rate_text(s['rates'])}", file=out)

    for q in snap["queues"]:
        if "error" in q:
            print(f"  queue {q['name']}: {q['error']}", file=out)
        else:
            space(f"queue {q['name']}", q)
    for t in snap["topics"]:
        if "error" in t:
            print(f"  topic {t['name']}: {t['error']}", file=out)
            continue
        print(f"  topic {t['name']}: last id {t['last_id']:,}, {len(t['consumers'])} consumers; "
              f"{_rate_text(t['rates'])}", file=out)
        for c in t["consumers"]:
            space(f"  consumer {c['name']}", c)
    for b in snap["inboxes"]:
        if "error" in b:
            print(f"  inbox {b['name']}: {b['error']}", file=out)
            continue
        behind = sum(p["pending"] for p in b["pending"])
        print(f"  inbox {b['name']}: {b['members']} members, {b['stored']:,} stored, {behind:,} pending; "
              f"{_rate_text(b['rates'])}", file=out)


def cmd_monitor(args: argparse.Namespace) -> int:
    from fastbus.monitor.http import parse_address
    from fastbus.monitor.queues import QueueSource
    out = getattr(args, "out", sys.stdout)
    url = redis_url(args.redis, "--redis")
    address = None
    if args.http:
        try:
            address = parse_address(args.http, args.allow_remote)
        except ValueError as e:
            print(f"fastbus monitor: {e}", file=sys.stderr)
            return 2
    try:
        source = QueueSource(url, prefix=args.prefix, interval=args.interval, window=args.window)
    except (ValueError, TypeError) as e:
        print(f"fastbus monitor: {e}", file=sys.stderr)
        return 2
    sources: list = [source]
    try:
        brokers = broker_sources(args.broker or [], interval=args.interval,
                                 curve_server_keys=args.curve_server_key, curve_cert=args.curve_cert)
        sources.extend(brokers.values())
        if args.once:
            for b in brokers.values():
                b.poll()
            source.sample()
            time.sleep(args.interval)           # a second sample: the rates are over the interval
            for b in brokers.values():
                b.poll()
            snap = source.sample()
            if not snap["ok"]:
                print(f"fastbus monitor: cannot read {url}: {snap['error']}", file=sys.stderr)
                return 1
            failed = [b for b in brokers.values() if b.last_error]
            for b in failed:
                print(f"fastbus monitor: broker {b.endpoint}: {b.last_error}", file=sys.stderr)
            if args.json:
                if brokers:
                    snap = {**snap, "brokers": _brokers_json(brokers)}
                print(json.dumps(snap, indent=1), file=out)
            else:
                print_table(snap, out)
                for b in brokers.values():
                    print_broker(b, out)
            return 1 if failed else 0
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                signal.signal(sig, lambda *_: stop.set())
            except ValueError:                  # not the main thread (embedded use): Ctrl-C is the caller's
                pass
        for s in sources:
            start = getattr(s, "start", None)
            if start is not None:
                start()
        server = None
        if address is not None:
            server = start_http(served_source(source, brokers), args.http, args.allow_remote)
            watched = source.server + "".join(f" and broker {b.endpoint}" for b in brokers.values())
            paths = "/metrics /varz /queuez /healthz" + (" /connz /subsz" if brokers else "")
            print(f"fastbus monitor: serving {server.url}/ ({paths}) for {watched}", file=out, flush=True)
        deadline = time.monotonic() + args.for_seconds if args.for_seconds else None
        while not stop.wait(args.interval):
            if server is None:
                snap = source.snapshot()
                if args.json:
                    if brokers:
                        snap = {**snap, "brokers": _brokers_json(brokers)}
                    print(json.dumps(snap), file=out, flush=True)
                else:
                    print_table(snap, out)
                    for b in brokers.values():
                        print_broker(b, out)
                    out.flush()
            if deadline is not None and time.monotonic() >= deadline:
                break
        if server is not None:
            server.stop()
        return 0
    finally:
        for s in sources:
            close = getattr(s, "close", None)
            if close is not None:
                close()


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, not {text}")
    return value


def add_parser(sub) -> None:
    """Add ``monitor`` to the ``fastbus`` command's subparsers."""
    from fastbus.queue.names import DEFAULT_PREFIX
    m = sub.add_parser("monitor", help="watch the Redis queues (and a broker): table, JSON, or HTTP /metrics",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("--redis", metavar="URL", help=URL_HELP)
    m.add_argument("--prefix", default=DEFAULT_PREFIX, help="the queues' key prefix (default %(default)s)")
    m.add_argument("--http", metavar="HOST:PORT", nargs="?", const=DEFAULT_HTTP,
                   help=f"serve /metrics, /queuez, /varz and /healthz here (default {DEFAULT_HTTP}; port 0: "
                        "any free port, printed)")
    m.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --http address")
    m.add_argument("--broker", metavar="ENDPOINT", action="append",
                   help="also monitor this broker (e.g. tcp://127.0.0.1:6464), polled every --interval: its "
                        "fastbus_broker_* metrics, /connz, /subsz and a section of the page; repeatable")
    m.add_argument("--curve-server-key", metavar="KEY", action="append",
                   help="a CURVE broker's public key (Z85): once for every --broker, or once per --broker in order")
    m.add_argument("--curve-cert", metavar="FILE", help="this client's secret certificate, for CURVE brokers")
    m.add_argument("--interval", type=_seconds, default=1.0, help="seconds between samples (default %(default)s)")
    m.add_argument("--window", type=_seconds, default=10.0,
                   help="seconds the rates average over (default %(default)s)")
    m.add_argument("--once", action="store_true", help="two samples an interval apart, printed, then exit")
    m.add_argument("--json", action="store_true", help="JSON instead of the table")
    m.add_argument("--for", dest="for_seconds", type=_seconds, metavar="SECONDS", help="stop after SECONDS")
    m.set_defaults(func=cmd_monitor)
