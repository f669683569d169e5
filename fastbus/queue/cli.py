"""fastbus queue ACTION NAME: a work queue on Redis, from the shell.

    fastbus queue put jobs "resize a.png" "resize b.png"     # or lines from stdin (no payload, or -)
    fastbus queue peek jobs -n 5 [--failed] [--json]
    fastbus queue stats jobs [--json] [--watch 2]
    fastbus queue return-failed jobs [--count N]
    fastbus queue purge jobs --failed --yes
    fastbus queue clean jobs
    fastbus queue list [--kind queue|topic|inbox] [--json] [--scan] [--prune]

The server is --url, else $FASTBUS_REDIS_URL, else redis://127.0.0.1:6379/0
(a shell command has no embedded server to share: the queue must outlive it).

Exit status: 0 done, 1 the work failed (the server unreachable, a queue
error), 2 the command line is wrong (or purge without --yes).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO

from fastbus.cliargs import URL_HELP, positive, redis_url
from fastbus.errors import QueueError
from fastbus.queue.names import DEFAULT_PREFIX, check_name

# redis-py and the queue classes are imported by the commands that use
# them, not when the parser is built (fastbus._lazy says why).
if TYPE_CHECKING:
    from fastbus.queue.workqueue import QueueStats, WorkQueue



def _name(text: str) -> str:
    try:
        return check_name("queue name", text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _show(payload: bytes, limit: int) -> str:
    text = repr(payload[:limit])[2:-1]
    return text + (f"... ({len(payload)} bytes)" if len(payload) > limit else "")


def _put(q: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    if args.payloads and args.payloads != ["-"]:
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
                           **_json_payload(m.payload)} for m in messages], indent=2), file=out)
        return 0
    which = "failed" if args.failed else "ready"
    print(f"{q.name} ({which}): {len(messages)} shown", file=out)
    for m in messages:
        when = datetime.fromtimestamp(m.created_at, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        print(f"  {m.id:>10}  {when}Z  deliveries {m.deliveries}  {_show(m.payload, args.width)}", file=out)
    return 0


def _json_payload(payload: bytes) -> dict:
    """A payload in JSON, exactly: UTF-8 text as itself, other bytes in
    base64, tagged by ``encoding`` (bytes ff fe and the text "\\xff\\xfe"
    stay apart)."""
    try:
        return {"payload": payload.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"payload": base64.b64encode(payload).decode("ascii"), "encoding": "base64"}


def _never_used(st: QueueStats) -> bool:
    return not (st.ready or st.failed or st.alive or st.unacked or any(st.totals.values()))


def _known_queues(url: str, prefix: str, limit: int = 20) -> list[str]:
    """Names of queues on the server that have had messages (a bounded scan)."""
    import redis
    r = redis.Redis.from_url(url, socket_timeout=5)
    try:
        names = set()
        pattern = f"{prefix}:q:{{*}}:seq"
        for n, key in enumerate(r.scan_iter(match=pattern, count=1000)):
            name = key.decode("utf-8", "replace")[len(prefix) + 4:-5]
            names.add(name)
            if len(names) >= limit or n > 100_000:
                break
        return sorted(names)
    finally:
        r.close()


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
        if not args.watch and _never_used(st):
            known = _known_queues(args.resolved_url, args.prefix)
            print(f"fastbus queue stats: nothing was ever put on a queue named {st.name!r} at {args.resolved_url} "
                  f"(a misspelled name?); queues there: {', '.join(known) if known else 'none'}", file=sys.stderr)
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
        return 2
    print(f"deleted {q.purge(which):,} {which} message(s) of {q.name}", file=out)
    return 0


def _clean(q: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    r = q.clean()
    print(f"{q.name}: {r.consumers} dead consumer(s) removed, {r.returned} message(s) back to ready, "
          f"{r.dead} to failed (max deliveries)", file=out)
    return 0


def cmd_queue(args: argparse.Namespace) -> int:
    from fastbus.queue.workqueue import WorkQueue
    args.handle_func = args.queue_func
    return _run_handle(lambda url: WorkQueue(args.name, url, prefix=args.prefix, max_deliveries=args.max_deliveries),
                       args, "queue")


def cmd_list(args: argparse.Namespace) -> int:
    """fastbus queue list: the registered names (fastbus.queue.registry)."""
    import redis

    from fastbus.queue.registry import list_queues, prune_queues
    url = redis_url(args.url, "--url")
    out = args.out
    try:
        pruned = prune_queues(url, prefix=args.prefix) if args.prune else []
        names = list_queues(url, prefix=args.prefix, kind=args.kind, scan=args.scan)
    except ValueError as e:
        print(f"fastbus queue list: {e}", file=sys.stderr)
        return 2
    except redis.ConnectionError as e:
        print(f"fastbus queue list: cannot reach the server at {url}: {e}", file=sys.stderr)
        return 1
    except (QueueError, redis.RedisError) as e:
        print(f"fastbus queue list: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{"kind": n.kind, "name": n.name} for n in names]), file=out)
        return 0
    for n in pruned:
        print(f"pruned {n.kind} {n.name} (none of its keys are left)", file=sys.stderr)
    for n in names:
        print(f"{n.kind:<6} {n.name}", file=out)
    if not names:
        print(f"no queues, topics or inboxes registered under prefix {args.prefix!r}"
              + ("" if args.scan else " (--scan looks in the keyspace too)"), file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    """Add ``queue`` to the ``fastbus`` command's subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("name", type=_name, help="the queue's name")
    common.add_argument("--url", help=URL_HELP)
    common.add_argument("--prefix", default=DEFAULT_PREFIX, help="the queue's key prefix (default %(default)s)")
    common.add_argument("--max-deliveries", type=positive, default=10,
                        help="for clean: deliveries after which a message goes to failed (default %(default)s)")

    q = sub.add_parser("queue", help="work queues on Redis: put, peek, stats, return-failed, purge, clean, list",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    qs = q.add_subparsers(dest="queue_command", metavar="ACTION", required=True)

    p = qs.add_parser("put", parents=[common], help="put messages (arguments, or one per line from stdin)")
    p.add_argument("payloads", nargs="*", help="the messages (none, or -: read lines from stdin)")
    p.add_argument("--batch", type=positive, default=1000, help="messages per round trip (default %(default)s)")
    p.set_defaults(queue_func=_put)

    p = qs.add_parser("peek", parents=[common], help="show the first messages, leaving them in place")
    p.add_argument("-n", type=positive, default=10, help="how many (default %(default)s)")
    p.add_argument("--failed", action="store_true", help="the failed (dead-letter) list instead of ready")
    p.add_argument("--width", type=positive, default=80, help="payload bytes shown (default %(default)s)")
    p.add_argument("--json", action="store_true",
                   help='JSON output: "payload" is the text, or base64 where "encoding" says so')
    p.set_defaults(queue_func=_peek)

    p = qs.add_parser("stats", parents=[common], help="counts, consumers and per-second rates")
    p.add_argument("--window", type=positive, default=5, help="seconds the rates average over (default %(default)s)")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="print again every SECONDS")
    p.add_argument("--for", dest="for_seconds", type=float, metavar="SECONDS",
                   help="with --watch: stop after SECONDS")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(queue_func=_stats)

    p = qs.add_parser("return-failed", parents=[common], help="failed messages back to ready")
    p.add_argument("--count", type=positive, help="the oldest COUNT only (default: all)")
    p.set_defaults(queue_func=_return_failed)

    p = qs.add_parser("purge", parents=[common], help="delete the ready (or failed) messages")
    p.add_argument("--failed", action="store_true", help="purge the failed list instead of ready")
    p.add_argument("--yes", action="store_true", help="really delete (without it, say what would go)")
    p.set_defaults(queue_func=_purge)

    p = qs.add_parser("list", help="the queues, topics and inboxes registered on the server",
                      description="The registered names (fastbus.queue.list_queues), one per line: KIND NAME.")
    p.add_argument("--url", help=URL_HELP)
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="the key prefix (default %(default)s)")
    p.add_argument("--kind", choices=["queue", "topic", "inbox"], help="one kind only")
    p.add_argument("--json", action="store_true", help='a JSON list of {"kind": ..., "name": ...}')
    p.add_argument("--scan", action="store_true",
                   help="also look in the keyspace (SCAN: every key) for names made by an older fastbus, "
                        "and register them")
    p.add_argument("--prune", action="store_true", help="first remove names none of whose keys are left")
    p.set_defaults(func=cmd_list)

    p = qs.add_parser("clean", parents=[common],
                      help="return the messages of consumers whose heartbeat expired")
    p.set_defaults(queue_func=_clean)

    q.set_defaults(func=cmd_queue)


# --------------------------------------------------------------------------- topic and inbox

TOPIC_DOC = """fastbus topic ACTION NAME: a topic with logical consumers on Redis, from the shell.

    fastbus topic publish events '{"user": 1}' ...     # or lines from stdin (no message, or -)
    fastbus topic read events [--from ID] [-n 10] [--json]
    fastbus topic stats events [--json]
    fastbus topic register events billing               # gets what is published from now on
    fastbus topic unregister events billing

Server and exit status as for ``fastbus queue``.
"""

INBOX_DOC = """fastbus inbox ACTION NAME: a group inbox on Redis, from the shell.

    fastbus inbox create chat-827 jason jeff
    fastbus inbox send chat-827 jason "hi" ...          # or lines from stdin (no message, or -)
    fastbus inbox fetch chat-827 jeff [-n 100] [--ack] [--json]
    fastbus inbox members chat-827
    fastbus inbox join chat-827 alice; fastbus inbox leave chat-827 jason

Server and exit status as for ``fastbus queue``.
"""


def _payloads(given: list[str]) -> list[bytes]:
    """Payloads from the arguments, or (none, or -) a line each from stdin."""
    if given and given != ["-"]:
        return [p.encode() for p in given]
    data = sys.stdin.buffer.read().split(b"\n")
    if data and data[-1] == b"":
        data.pop()
    return data


def _member(text: str) -> str:
    try:
        return check_name("member name", text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _print_messages(messages, args: argparse.Namespace, out: TextIO, extra=lambda m: {}) -> None:
    if args.json:
        print(json.dumps([{"id": m.id, "created_at": m.created_at, **extra(m), **_json_payload(m.payload)}
                          for m in messages], indent=2), file=out)
        return
    for m in messages:
        when = datetime.fromtimestamp(m.created_at, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        who = "".join(f"  {k} {v}" for k, v in extra(m).items())
        print(f"  {m.id:>10}  {when}Z{who}  {_show(m.payload, args.width)}", file=out)


def _topic_publish(t, args, out) -> int:
    payloads = _payloads(args.payloads)
    if not payloads:
        print("fastbus topic publish: nothing to publish (give messages, or lines on stdin)", file=sys.stderr)
        return 2
    ids = []
    for i in range(0, len(payloads), 1000):
        ids += t.publish_many(payloads[i:i + 1000])
    print(f"published {len(ids)} message(s) to topic {t.name}: ids {ids[0]}..{ids[-1]}", file=out)
    return 0


def _topic_read(t, args, out) -> int:
    first, last = t.retained()
    start = args.start if args.start is not None else max(first, 1)
    messages = t.read(start, min(last, start + args.n - 1)) if last >= start else []
    if not args.json:
        print(f"topic {t.name}: ids {start}.., {len(messages)} shown (newest id {last})", file=out)
    _print_messages(messages, args, out)
    return 0


def _topic_stats(t, args, out) -> int:
    st = t.stats()
    if args.json:
        print(json.dumps(st.to_dict()), file=out)
        return 0
    print(f"topic {st.name}: newest id {st.last_id:,}, published {st.published:,}; "
          f"{len(st.consumers)} logical consumer(s)", file=out)
    for name, q in sorted(st.consumers.items()):
        print(f"  {name}: ready {q.ready:,}, unacked {sum(q.unacked.values()):,}, failed {q.failed:,}", file=out)
    if not st.published and not st.consumers:
        print(f"fastbus topic stats: nothing was ever published to a topic named {st.name!r} "
              f"at {args.resolved_url} (a misspelled name?)", file=sys.stderr)
    return 0


def _topic_register(t, args, out) -> int:
    new = t.register(args.consumer)
    print(f"{args.consumer} {'registered on' if new else 'was already registered on'} topic {t.name}", file=out)
    return 0


def _topic_unregister(t, args, out) -> int:
    t.unregister(args.consumer)
    print(f"{args.consumer} unregistered from topic {t.name}", file=out)
    return 0


def _inbox_create(box, args, out) -> int:
    box.create(args.members)
    print(f"inbox {box.name}: created with {', '.join(args.members)}", file=out)
    return 0


def _inbox_send(box, args, out) -> int:
    payloads = _payloads(args.payloads)
    if not payloads:
        print("fastbus inbox send: nothing to send (give messages, or lines on stdin)", file=sys.stderr)
        return 2
    ids = [box.send(args.sender, p) for p in payloads]
    print(f"sent {len(ids)} message(s) to inbox {box.name}: ids {ids[0]}..{ids[-1]}", file=out)
    return 0


def _inbox_fetch(box, args, out) -> int:
    messages = box.fetch_pending(args.member, args.n)
    if not args.json:
        print(f"inbox {box.name}, {args.member}: {len(messages)} pending message(s) shown", file=out)
    _print_messages(messages, args, out, lambda m: {"sender": m.sender})
    if args.ack and messages:
        box.ack(args.member, messages[-1].id)
        if not args.json:
            print(f"  acked up to {messages[-1].id}", file=out)
    return 0


def _inbox_members(box, args, out) -> int:
    members = box.members()
    if args.json:
        print(json.dumps(members), file=out)
    else:
        print(f"inbox {box.name}: " + (", ".join(f"{m} (seen {s})" for m, s in sorted(members.items()))
                                       or "no members (it does not exist)"), file=out)
    return 0


def _inbox_join(box, args, out) -> int:
    box.join(args.member)
    print(f"{args.member} joined inbox {box.name}", file=out)
    return 0


def _inbox_leave(box, args, out) -> int:
    box.leave(args.member)
    print(f"{args.member} left inbox {box.name}", file=out)
    return 0


def _run_handle(make, args: argparse.Namespace, what: str) -> int:
    """Open the queue, topic or inbox ``make(url)`` gives, run the action
    (``args.handle_func``) on it, close it: exit 2 for bad arguments, 1 for
    a server that cannot be reached or refuses."""
    import redis
    url = redis_url(args.url, "--url")
    args.resolved_url = url
    try:
        handle = make(url)
    except (ValueError, TypeError) as e:
        print(f"fastbus {what}: {e}", file=sys.stderr)
        return 2
    try:
        return args.handle_func(handle, args, args.out)
    except redis.ConnectionError as e:
        print(f"fastbus {what}: cannot reach the server at {url}: {e}", file=sys.stderr)
        return 1
    except (QueueError, redis.RedisError) as e:
        print(f"fastbus {what}: {e}", file=sys.stderr)
        return 1
    finally:
        handle.close()


def cmd_topic(args: argparse.Namespace) -> int:
    from fastbus.queue.topic import Topic
    return _run_handle(lambda url: Topic(args.name, url, prefix=args.prefix), args, f"topic {args.topic_command}")


def cmd_inbox(args: argparse.Namespace) -> int:
    from fastbus.queue.inbox import Inbox
    return _run_handle(lambda url: Inbox(args.name, url, prefix=args.prefix), args, f"inbox {args.inbox_command}")


def add_topic_inbox_parsers(sub) -> None:
    """Add ``topic`` and ``inbox`` to the ``fastbus`` command's subparsers."""
    def common(kind: str) -> argparse.ArgumentParser:
        c = argparse.ArgumentParser(add_help=False)
        c.add_argument("name", help=f"the {kind}'s name")
        c.add_argument("--url", help=URL_HELP)
        c.add_argument("--prefix", default=DEFAULT_PREFIX, help="the key prefix (default %(default)s)")
        return c

    def output(p: argparse.ArgumentParser) -> None:
        p.add_argument("-n", type=positive, default=10, help="how many (default %(default)s)")
        p.add_argument("--width", type=positive, default=80, help="payload bytes shown (default %(default)s)")
        p.add_argument("--json", action="store_true",
                       help='JSON output: "payload" is the text, or base64 where "encoding" says so')

    c = common("topic")
    t = sub.add_parser("topic", help="topics with logical consumers on Redis: publish, read, stats, register",
                       description=TOPIC_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ts = t.add_subparsers(dest="topic_command", metavar="ACTION", required=True)
    p = ts.add_parser("publish", parents=[c], help="publish messages (arguments, or one per line from stdin)")
    p.add_argument("payloads", nargs="*", help="the messages (none, or -: read lines from stdin)")
    p.set_defaults(handle_func=_topic_publish)
    p = ts.add_parser("read", parents=[c], help="show retained messages by id, without consuming them")
    p.add_argument("--from", dest="start", type=positive, help="the first id (default: the oldest retained)")
    output(p)
    p.set_defaults(handle_func=_topic_read)
    p = ts.add_parser("stats", parents=[c], help="newest id, published, and each logical consumer's counts")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(handle_func=_topic_stats)
    for action, func, text in (("register", _topic_register, "add a logical consumer (from now on)"),
                               ("unregister", _topic_unregister, "remove a logical consumer and its keys")):
        p = ts.add_parser(action, parents=[c], help=text)
        p.add_argument("consumer", type=_member, help="the logical consumer's name")
        p.set_defaults(handle_func=func)
    t.set_defaults(func=cmd_topic)

    c = common("inbox")
    i = sub.add_parser("inbox", help="group inboxes on Redis: create, send, fetch, members, join, leave",
                       description=INBOX_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ins = i.add_subparsers(dest="inbox_command", metavar="ACTION", required=True)
    p = ins.add_parser("create", parents=[c], help="create the inbox with these members")
    p.add_argument("members", nargs="+", type=_member, help="the members")
    p.set_defaults(handle_func=_inbox_create)
    p = ins.add_parser("send", parents=[c], help="send messages (arguments, or one per line from stdin)")
    p.add_argument("sender", type=_member, help="the sending member")
    p.add_argument("payloads", nargs="*", help="the messages (none, or -: read lines from stdin)")
    p.set_defaults(handle_func=_inbox_send)
    p = ins.add_parser("fetch", parents=[c], help="a member's pending messages (at least once: see --ack)")
    p.add_argument("member", type=_member, help="the member")
    p.add_argument("--ack", action="store_true", help="ack what was shown (default: leave it pending)")
    output(p)
    p.set_defaults(handle_func=_inbox_fetch)
    p = ins.add_parser("members", parents=[c], help="the members and the last id each has seen")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(handle_func=_inbox_members)
    for action, func, text in (("join", _inbox_join, "add a member"), ("leave", _inbox_leave, "remove a member")):
        p = ins.add_parser(action, parents=[c], help=text)
        p.add_argument("member", type=_member, help="the member")
        p.set_defaults(handle_func=func)
    i.set_defaults(func=cmd_inbox)
