"""fastbus queue ACTION NAME: a work queue on Redis, from the shell.

    fastbus queue put jobs "resize a.png" "resize b.png"     # or lines from stdin
    fastbus queue peek jobs -n 5 [--failed]
    fastbus queue stats jobs [--json] [--watch 2]
    fastbus queue return-failed jobs [--count N]
    fastbus queue purge jobs --failed --yes
    fastbus queue clean jobs

The server is --url, else $FASTBUS_REDIS_URL, else redis://127.0.0.1:6379/0
(a shell command has no embedded server to share: the queue must outlive it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from typing import TextIO

import redis

from fastbus.queue._common import DEFAULT_PREFIX, QueueError, check_name
from fastbus.queue.workqueue import QueueStats, WorkQueue

DEFAULT_URL = "redis://127.0.0.1:6379/0"
ENV_URL = "FASTBUS_REDIS_URL"


def _name(text: str) -> str:
    try:
        return check_name("queue name", text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _count(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _show(payload: bytes, limit: int) -> str:
    text = repr(payload[:limit])[2:-1]
    return text + (f"... ({len(payload)} bytes)" if len(payload) > limit else "")


def _put(q: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    if args.payloads:
        payloads = [p.encode() for p in args.payloads]
    else:
        data = sys.stdin.buffer.read()
        payloads = data.split(b"\n")
        if payloads and payloads[-1] == b"":
            payloads.pop()
    if not payloads:
        print("fastbus queue put: nothing to put (give payloads, or lines on stdin)", file=sys.stderr)
        return 1
    ids = []
    for i in range(0, len(payloads), args.batch):
        ids += q.put_many(payloads[i:i + args.batch])
    print(f"put {len(ids)} message(s) on {q.name}: ids {ids[0]}..{ids[-1]}", file=out)
    return 0


def _peek(q: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    messages = q.peek(args.n, failed=args.failed)
    if args.json:
        print(json.dumps([{"id": m.id, "created_at": m.created_at, "deliveries": m.deliveries,
                           "payload": m.payload.decode("utf-8", "backslashreplace")} for m in messages],
                         indent=2), file=out)
        return 0
    which = "failed" if args.failed else "ready"
    print(f"{q.name} ({which}): {len(messages)} shown", file=out)
    for m in messages:
        when = datetime.fromtimestamp(m.created_at, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        print(f"  {m.id:>10}  {when}Z  deliveries {m.deliveries}  {_show(m.payload, args.width)}", file=out)
    return 0


def _print_stats(st: QueueStats, out: TextIO) -> None:
    live = sum(st.alive.values())
    print(f"queue {st.name}: ready {st.ready:,}, unacked {sum(st.unacked.values()):,}, failed {st.failed:,}; "
          f"consumers {live} live, {len(st.alive) - live} dead", file=out)
    rates = ", ".join(f"{k} {v:,.1f}" for k, v in st.rates.items() if v) or "idle"
    print(f"  per second (last {st.window} s): {rates}", file=out)
    totals = ", ".join(f"{k} {v:,}" for k, v in st.totals.items() if v) or "nothing yet"
    print(f"  totals: {totals}", file=out)
    for tag in sorted(st.unacked):
        print(f"  consumer {tag}: {st.unacked[tag]:,} unacked, {'alive' if st.alive[tag] else 'DEAD'}",
              file=out)


def _stats(q: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    deadline = time.monotonic() + args.for_seconds if args.for_seconds else None
    while True:
        st = q.stats(window=args.window)
        if args.json:
            print(json.dumps(st.to_dict()), file=out, flush=True)
        else:
            _print_stats(st, out)
        if not args.watch or (deadline is not None and time.monotonic() >= deadline):
            return 0
        time.sleep(args.watch)


def _return_failed(q: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    n = q.return_failed(args.count)
    print(f"{n} failed message(s) of {q.name} back to ready", file=out)
    return 0


def _purge(q: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    which = "failed" if args.failed else "ready"
    if not args.yes:
        st = q.stats()
        n = st.failed if args.failed else st.ready
        print(f"fastbus queue purge: this deletes the {n:,} {which} message(s) of {q.name}; "
              "add --yes to do it", file=sys.stderr)
        return 1
    print(f"deleted {q.purge(which):,} {which} message(s) of {q.name}", file=out)
    return 0


def _clean(q: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    r = q.clean()
    print(f"{q.name}: {r.consumers} dead consumer(s) removed, {r.returned} message(s) back to ready, "
          f"{r.dead} to failed (max deliveries)", file=out)
    return 0


def cmd_queue(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get(ENV_URL) or DEFAULT_URL
    try:
        q = WorkQueue(args.name, url, prefix=args.prefix, max_deliveries=args.max_deliveries)
    except (ValueError, TypeError) as e:
        print(f"fastbus queue: {e}", file=sys.stderr)
        return 2
    try:
        return args.queue_func(q, args, args.out)
    except redis.ConnectionError as e:
        print(f"fastbus queue: cannot reach the server at {url}: {e}", file=sys.stderr)
        return 2
    except (QueueError, redis.RedisError) as e:
        print(f"fastbus queue: {e}", file=sys.stderr)
        return 1
    finally:
        q.close()


def add_parser(sub) -> None:
    """Add ``queue`` to the ``fastbus`` command's subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("name", type=_name, help="the queue's name")
    common.add_argument("--url", help=f"the Redis server (default ${ENV_URL}, else {DEFAULT_URL})")
    common.add_argument("--prefix", default=DEFAULT_PREFIX, help="the queue's key prefix (default %(default)s)")
    common.add_argument("--max-deliveries", type=_count, default=10,
                        help="for clean: deliveries after which a message goes to failed (default %(default)s)")

    q = sub.add_parser("queue", help="work queues on Redis: put, peek, stats, return-failed, purge, clean",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    qs = q.add_subparsers(dest="queue_command", metavar="ACTION", required=True)

    p = qs.add_parser("put", parents=[common], help="put messages (arguments, or one per line from stdin)")
    p.add_argument("payloads", nargs="*", help="the messages (none: read lines from stdin)")
    p.add_argument("--batch", type=_count, default=1000, help="messages per round trip (default %(default)s)")
    p.set_defaults(queue_func=_put)

    p = qs.add_parser("peek", parents=[common], help="show the first messages, leaving them in place")
    p.add_argument("-n", type=_count, default=10, help="how many (default %(default)s)")
    p.add_argument("--failed", action="store_true", help="the failed (dead-letter) list instead of ready")
    p.add_argument("--width", type=_count, default=80, help="payload bytes shown (default %(default)s)")
    p.add_argument("--json", action="store_true", help="JSON output (payloads as UTF-8, bad bytes escaped)")
    p.set_defaults(queue_func=_peek)

    p = qs.add_parser("stats", parents=[common], help="counts, consumers and per-second rates")
    p.add_argument("--window", type=_count, default=5, help="seconds the rates average over (default %(default)s)")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="print again every SECONDS")
    p.add_argument("--for", dest="for_seconds", type=float, metavar="SECONDS",
                   help="with --watch: stop after SECONDS")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(queue_func=_stats)

    p = qs.add_parser("return-failed", parents=[common], help="failed messages back to ready")
    p.add_argument("--count", type=_count, help="the oldest COUNT only (default: all)")
    p.set_defaults(queue_func=_return_failed)

    p = qs.add_parser("purge", parents=[common], help="delete the ready (or failed) messages")
    p.add_argument("--failed", action="store_true", help="purge the failed list instead of ready")
    p.add_argument("--yes", action="store_true", help="really delete (without it, say what would go)")
    p.set_defaults(queue_func=_purge)

    p = qs.add_parser("clean", parents=[common],
                      help="return the messages of consumers whose heartbeat expired")
    p.set_defaults(queue_func=_clean)

    q.set_defaults(func=cmd_queue)
