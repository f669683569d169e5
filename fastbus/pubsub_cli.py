"""``fastbus pub``, ``fastbus sub``, ``fastbus psub``, ``fastbus request`` and
``fastbus reply``: a broker's channels from the shell, as ``redis-cli
PUBLISH``/``SUBSCRIBE``/``PSUBSCRIBE`` and ``nats pub``/``sub``/``request``/
``reply`` do.

    fastbus pub news "hello" "world"          # or lines from stdin (no message, or -)
    fastbus pub orders '{"id": 7}' -H content-type=application/json   # with headers
    fastbus sub news [--pattern "market.*"] [--json] [--count N] [--seconds S]
    fastbus psub "user.*.events" "room.?"     # Redis glob patterns
    fastbus reply time.now "12:00" [--echo] [--count N]   # answer requests
    fastbus request time.now "" [--timeout 1] [--json]    # ask, print the reply

A pattern is taken only when asked for (``--pattern`` or ``psub``): a
channel argument with a glob character (``*``, ``?``, ``[``, ``\\``) is a
usage error, never silently a channel nobody publishes to (``--literal``
takes such a name as the channel it is).  An argument is the bytes typed:
a channel, message or header value that is not UTF-8 (``$'\\xff'``) is
sent as those bytes, and printed with ``\\x`` escapes.

``sub`` prints ``channel: data`` a line, with ``[name=value ...]`` before
the data for a message with headers (``--json``: one object a line, the
data as text or, for bytes that are not UTF-8, base64, tagged by
``encoding``; ``headers`` an object, each value as text or base64 as the
data is), says on stderr when its subscriptions are confirmed and any
notice (gap, reconnect, refused), and runs until Ctrl-C, ``--count`` messages
or ``--seconds``.  Exit status: 0 done, 1 failed (no broker, not confirmed),
2 the command line is wrong.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from typing import TextIO

from fastbus import protocol as P


def _text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


def _arg(text: str) -> bytes:
    """A command-line argument as the bytes typed: a name or message that
    is not UTF-8 (``$'\\xff'``) is those bytes, as a channel may be."""
    return os.fsencode(text)


def _name(text: str) -> str | bytes:
    """A channel, pattern or group name argument: as typed where it is
    text (so errors quote it as typed), its bytes where it is not."""
    return text if _shown(text) == text else _arg(text)


def _shown(text: str) -> str:
    """An argument as these commands print it (bytes that are not UTF-8
    as \\x escapes)."""
    return _text(_arg(text))


def _json_line(m: dict) -> str:
    data = m["data"]
    try:
        body = {"data": data.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        body = {"data": base64.b64encode(data).decode("ascii"), "encoding": "base64"}
    pattern = m.get("pattern")
    line = {"channel": _text(m["channel"]), **body, "pattern": None if pattern is None else _text(pattern)}
    headers = m.get("headers")
    if headers:
        line["headers"] = {k: _header_json(v) for k, v in headers.items()}
    return json.dumps(line)


def _header_json(value: bytes) -> dict:
    try:
        return {"value": value.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"value": base64.b64encode(value).decode("ascii"), "encoding": "base64"}


def _headers_arg(items: list[str]) -> dict[str, str | bytes] | None:
    """-H NAME=VALUE options as a headers dict (None for none); a value is
    the bytes typed, a name must be UTF-8."""
    from fastbus.cliargs import name_values
    from fastbus.errors import UsageError
    out: dict[str, str | bytes] = {}
    for name, value in name_values(items, "=", "a header is NAME=VALUE").items():
        if _shown(name) != name:
            raise UsageError(f"a header name is UTF-8 text, not {_shown(name)}")
        out[name] = _arg(value)
    return out or None


def _client(args: argparse.Namespace, **options):
    """A client for --connect/--host/--port and the CURVE options (and
    ``options`` for fastbus.Client); usage errors as UsageError."""
    import fastbus
    import fastbus.curve
    from fastbus.errors import UsageError
    from fastbus.errors import InvalidEndpoint, InvalidKey
    endpoint = args.connect or f"tcp://{args.host}:{args.port}"
    keys = {}
    if args.curve_server_key or args.curve_cert:
        if not (args.curve_server_key and args.curve_cert):
            raise UsageError("CURVE needs both --curve-server-key and --curve-cert")
        try:
            keys = fastbus.curve.client_keys(args.curve_server_key, args.curve_cert)
        except InvalidKey as exc:
            raise UsageError(str(exc)) from None
    try:
        return fastbus.Client(endpoint=endpoint, name=f"fastbus-{args.command}", **keys, **options)
    except InvalidEndpoint as exc:
        raise UsageError(str(exc)) from None


def cmd_pub(args: argparse.Namespace) -> int:
    if args.messages and args.messages != ["-"]:
        messages = [_arg(m) for m in args.messages]
        source = None
    else:
        messages = None
        source = sys.stdin.buffer
    headers = _headers_arg(args.header)
    channel = _name(args.channel)
    client = _client(args)
    sent = dropped = 0
    try:
        if messages is not None:
            for m in messages:
                if client.publish(channel, m, headers):
                    sent += 1
                else:
                    dropped += 1
        else:
            for line in source:                    # a line a message, as it comes (a pipe may stay open)
                if client.publish(channel, line.rstrip(b"\n"), headers):
                    sent += 1
                else:
                    dropped += 1
        client.flush(timeout=args.timeout)
    finally:
        client.shutdown(1.0)                      # flushed above (or failing: nothing more to wait for)
    note = f", {dropped} not sent (no subscriber wants {_shown(args.channel)})" if dropped else ""
    print(f"published {sent} message(s) to {_shown(args.channel)} at {client.endpoint}{note}", file=args.out)
    return 0


def cmd_sub(args: argparse.Namespace) -> int:
    from fastbus._messages import GLOB_SPECIALS
    from fastbus.errors import CommandFailed, UsageError
    channels: list[str] = args.channels
    patterns: list[str] = args.pattern
    if not channels and not patterns:
        raise UsageError("nothing to subscribe to: give channels, or patterns with --pattern (or fastbus psub)")
    if not args.literal:
        for c in channels:
            if GLOB_SPECIALS & set(c):
                raise UsageError(f"{_shown(c)!r} is a glob pattern: subscribe to it with --pattern {_shown(c)!r} "
                                 f"(or fastbus psub), or to the channel of that name with --literal")
    names = channels + patterns
    out: TextIO = args.out
    # subscribe() returns once in effect; no broker (or none confirming in
    # time) is BrokerUnavailable (BrokerTimeout), said by main().
    client = _client(args, socket_connect_timeout=min(5.0, args.timeout), subscribe_timeout=args.timeout)
    try:
        p = client.pubsub()
        queue = None if args.queue is None else _name(args.queue)
        if channels:
            p.subscribe(*map(_name, channels), queue=queue)
        if patterns:
            p.psubscribe(*map(_name, patterns), queue=queue)
        confirmed = 0
        while confirmed < len(names):
            m = p.get_message(timeout=0)         # the confirmations arrived before subscribe() returned
            if m is None:
                raise CommandFailed(f"the broker at {client.endpoint} confirmed {confirmed} of "
                                    f"{len(names)} subscriptions")
            if m["type"] in ("subscribe", "psubscribe"):
                confirmed += 1
            elif m["type"] == "refused":
                raise CommandFailed(f"the broker at {client.endpoint} refused a subscription: {m['data']}")
        print(f"fastbus sub: subscribed to {', '.join(map(_shown, names))} at {client.endpoint}", file=sys.stderr,
              flush=True)
        n = 0
        for m in _arrivals(p, args.seconds):
            if m["type"] in ("message", "pmessage"):
                n += 1
                _print_message(m, args.json, out)
                if n == args.count:
                    break
            elif m["type"] in ("gap", "disconnected", "reconnect", "refused"):
                print(f"fastbus sub: {m['type']}: {m['data']}", file=sys.stderr, flush=True)
    finally:
        client.shutdown(1.0)
    return 0


def _arrivals(p, seconds: float | None):
    """What a PubSub receives, as it comes, for ``seconds`` (None: for
    ever; the caller stops at its count)."""
    end = None if seconds is None else time.monotonic() + seconds
    while True:
        wait = None if end is None else end - time.monotonic()
        if wait is not None and wait <= 0:
            return
        m = p.get_message(timeout=wait if wait is not None else 1.0)
        if m is not None:
            yield m


def _print_message(m: dict, as_json: bool, out: TextIO) -> None:
    """A message as ``sub`` prints it: ``channel: [headers] data``, or JSON."""
    if as_json:
        print(_json_line(m), file=out, flush=True)
        return
    h = m.get("headers")
    shown = "[" + " ".join(f"{k}={_text(v)}" for k, v in h.items()) + "] " if h else ""
    print(f"{_text(m['channel'])}: {shown}{_text(m['data'])}", file=out, flush=True)


def cmd_request(args: argparse.Namespace) -> int:
    """Ask once and print the reply; no responders or no reply in time is
    exit 1, said on stderr (main())."""
    headers = _headers_arg(args.header)
    client = _client(args, socket_connect_timeout=min(5.0, max(args.timeout, 1.0)))
    try:
        reply = client.request(_name(args.channel), _arg(args.data), timeout=args.timeout, headers=headers)
        _print_message(reply, args.json, args.out)
    finally:
        client.shutdown(1.0)
    return 0


def cmd_reply(args: argparse.Namespace) -> int:
    """Answer every request on a channel with DATA (or, with --echo, its
    own data), printing each request, until Ctrl-C, --count or --seconds."""
    from fastbus.errors import UsageError
    if args.data is None and not args.echo:
        raise UsageError("what to answer: give DATA, or --echo to answer each request with its own data")
    answer = None if args.data is None else _arg(args.data)
    headers = _headers_arg(args.header)
    client = _client(args, socket_connect_timeout=min(5.0, args.timeout), subscribe_timeout=args.timeout)
    try:
        p = client.pubsub(ignore_subscribe_messages=True)
        p.subscribe(_name(args.channel), queue=None if args.queue is None else _name(args.queue))
        group = f" in queue group {_shown(args.queue)}" if args.queue else ""
        print(f"fastbus reply: answering requests on {_shown(args.channel)}{group} at {client.endpoint}",
              file=sys.stderr, flush=True)
        n = 0
        for m in _arrivals(p, args.seconds):
            if m["type"] != "message":
                continue
            _print_message(m, args.json, args.out)
            if "reply_to" not in m:
                print(f"fastbus reply: a message on {_shown(args.channel)} that is not a request: not answered",
                      file=sys.stderr, flush=True)
                continue
            m.respond(m["data"] if answer is None else answer, headers)
            n += 1
            if n == args.count:
                break
        client.flush(timeout=args.timeout)
    finally:
        client.shutdown(1.0)
    return 0


def _connection_options(p: argparse.ArgumentParser) -> None:
    from fastbus.cliargs import port_number
    p.add_argument("--connect", metavar="ENDPOINT", help="broker endpoint (default from --host/--port)")
    p.add_argument("--host", default="127.0.0.1", help="broker host, without --connect (default: %(default)s)")
    p.add_argument("--port", type=port_number, default=P.DEFAULT_PORT,
                   help="broker port, without --connect (default: %(default)s)")
    p.add_argument("--curve-server-key", metavar="KEY",
                   help="the broker's public key (40 Z85 characters, or its .key file), for a CURVE broker")
    p.add_argument("--curve-cert", metavar="FILE", help="this client's secret certificate, for a CURVE broker")


def add_parsers(sub) -> None:
    """Add ``pub``, ``sub``, ``psub``, ``request`` and ``reply`` to the
    ``fastbus`` command's subparsers."""
    from fastbus.cliargs import positive, seconds
    p = sub.add_parser("pub", help="publish messages to a channel (arguments, or lines from stdin)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("channel", help="the channel")
    p.add_argument("messages", nargs="*", help="the messages (none, or -: one a line from stdin)")
    p.add_argument("--header", "-H", action="append", default=[], metavar="NAME=VALUE",
                   help="a header every message carries (repeatable)")
    p.add_argument("--timeout", type=seconds, default=10.0,
                   help="seconds to wait for the broker to confirm them (default: %(default)s)")
    _connection_options(p)
    p.set_defaults(func=cmd_pub)

    s = sub.add_parser("sub", help="print what arrives on channels (and glob patterns with --pattern)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("channels", nargs="*", metavar="CHANNEL",
                   help="channels (one with glob characters needs --literal, or is meant as --pattern)")
    s.add_argument("--pattern", "-p", action="append", default=[], metavar="PATTERN",
                   help="also a Redis glob pattern (*, ?, [a-z], \\ escapes), as PSUBSCRIBE; repeatable")
    s.add_argument("--literal", action="store_true",
                   help="take a CHANNEL with glob characters as the channel of that name")
    _sub_options(s)

    ps = sub.add_parser("psub", help="print what arrives on Redis glob patterns (fastbus sub --pattern)",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ps.add_argument("pattern", nargs="+", metavar="PATTERN",
                    help="Redis glob patterns: * any bytes, ? one, [abc] [^a] [a-z] classes, \\ escapes")
    ps.set_defaults(channels=[], literal=False)
    _sub_options(ps)

    rq = sub.add_parser("request", help="send a request to a channel and print the first reply",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rq.add_argument("channel", help="the channel its responders subscribe to")
    rq.add_argument("data", help="the request's data")
    rq.add_argument("--header", "-H", action="append", default=[], metavar="NAME=VALUE",
                    help="a header the request carries (repeatable)")
    rq.add_argument("--timeout", type=seconds, default=1.0,
                    help="seconds to wait for the reply (default: %(default)s)")
    rq.add_argument("--json", action="store_true", help="the reply as a JSON object (as sub --json)")
    _connection_options(rq)
    rq.set_defaults(func=cmd_request)

    rp = sub.add_parser("reply", help="answer the requests sent to a channel (fastbus request, Client.request)",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("channel", help="the channel to answer on")
    rp.add_argument("data", nargs="?", default=None, help="the answer (or --echo)")
    rp.add_argument("--echo", action="store_true", help="answer each request with its own data")
    rp.add_argument("--header", "-H", action="append", default=[], metavar="NAME=VALUE",
                    help="a header every answer carries (repeatable)")
    rp.add_argument("--json", action="store_true", help="print each request as a JSON object (as sub --json)")
    _until_options(rp, "answering this many", "subscription",
                   "each request to one responder of the group (the others are not asked)")
    _connection_options(rp)
    rp.set_defaults(func=cmd_reply)


def _sub_options(s: argparse.ArgumentParser) -> None:
    """What ``sub`` and ``psub`` share."""
    s.add_argument("--json", action="store_true",
                   help='one JSON object a line: "data" is the text, or base64 where "encoding" says so')
    _until_options(s, "this many messages", "subscriptions", "each message to one member of the group, in any process")
    _connection_options(s)
    s.set_defaults(func=cmd_sub)


def _until_options(p: argparse.ArgumentParser, count: str, confirmed: str, group: str) -> None:
    """What the commands that read arrivals share (sub, psub, reply): when
    to stop, how long to wait for the subscription, and its queue group."""
    from fastbus.cliargs import positive, seconds
    p.add_argument("--count", type=positive, default=None, help=f"stop after {count} (default: run on)")
    p.add_argument("--seconds", type=seconds, default=None, help="stop after this long (default: run on)")
    p.add_argument("--timeout", type=seconds, default=10.0,
                   help=f"seconds to wait for the {confirmed} to be confirmed (default: %(default)s)")
    p.add_argument("--queue", "-q", metavar="GROUP", default=None,
                   help=f"subscribe as a member of this queue group: {group}")
