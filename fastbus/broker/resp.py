"""What the broker answers a Redis client (``--resp``) besides pub/sub.

A Redis client's connection is a session of the broker like any other
(csrc/fb_resp_session.h): its SUBSCRIBE, PUBLISH and PING are answered in C,
in the data plane.  The rest of what a client sends at connect or now and
then (HELLO, AUTH, CLIENT, INFO, COMMAND, PUBSUB, SELECT, CONFIG, and
FLUSHDB, FLUSHALL and DBSIZE of a keyspace that is always empty) comes
here as one ``[r, state, request]`` message, where ``request`` is the
command as a RESP array, and is answered with ``[r, reply, state]``: the
reply's bytes, and the connection's state after it (RESP3 or not,
authenticated or not, to be closed).  This is never on a message's path.
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import struct
import time

import fastbus
from fastbus import protocol as P

log = logging.getLogger("fastbus.broker")

#: What Redis version the broker says it speaks (clients that probe
#: redis_version for pub/sub features see a Redis 7's).
REDIS_VERSION = "7.2.0"

# State bits (csrc/fb_resp_session.h FB_RESP_STATE_*).
RESP3 = 0x01
AUTHED = 0x02
NEED_AUTH = 0x04
SUBSCRIBED = 0x08
CLOSE = 0x80          # (an answer's) close the connection once the reply is written

#: What INFO says of the broker's process (clients' and tests' probes).
_ARCH_BITS = struct.calcsize("P") * 8

#: The Redis configuration the broker has: CONFIG GET shows it, CONFIG SET
#: may set it to what it is.
_CONFIG = {b"notify-keyspace-events": b""}

#: The connection's C side answers these itself; anything here that is
#: neither one of them nor below is an unknown command, as Redis says it.
_KNOWN = ("HELLO", "AUTH", "SELECT", "CLIENT", "INFO", "COMMAND", "PUBSUB", "CONFIG", "FLUSHDB", "FLUSHALL",
          "DBSIZE")


def parse_request(data: bytes) -> list[bytes]:
    """The RESP array of bulk strings the C side wrote (trusted: it built it)."""
    if not data.startswith(b"*"):
        raise P.ProtocolError("a RESP request is an array")
    end = data.index(b"\r\n")
    n = int(data[1:end])
    pos = end + 2
    out = []
    for _ in range(n):
        end = data.index(b"\r\n", pos)
        size = int(data[pos + 1:end])
        start = end + 2
        out.append(data[start:start + size])
        pos = start + size + 2
    return out


class Writer:
    """RESP2 or RESP3 replies."""

    def __init__(self, resp3: bool) -> None:
        self.resp3 = resp3

    @staticmethod
    def ok() -> bytes:
        return b"+OK\r\n"

    @staticmethod
    def error(text: str) -> bytes:
        return b"-" + text.replace("\r", " ").replace("\n", " ").encode() + b"\r\n"

    @staticmethod
    def integer(n: int) -> bytes:
        return b":%d\r\n" % n

    @staticmethod
    def bulk(v: bytes | str) -> bytes:
        b = v.encode() if isinstance(v, str) else v
        return b"$%d\r\n%s\r\n" % (len(b), b)

    def null(self) -> bytes:
        return b"_\r\n" if self.resp3 else b"$-1\r\n"

    @staticmethod
    def array(items: list[bytes]) -> bytes:
        return b"*%d\r\n" % len(items) + b"".join(items)

    def map(self, pairs: list[tuple[bytes, bytes]]) -> bytes:
        if self.resp3:
            return b"%%%d\r\n" % len(pairs) + b"".join(k + v for k, v in pairs)
        return b"*%d\r\n" % (2 * len(pairs)) + b"".join(k + v for k, v in pairs)

    def value(self, v) -> bytes:
        """A Python value as RESP: int, str/bytes, None, list, dict."""
        if isinstance(v, bool):
            return self.integer(int(v))
        if isinstance(v, int):
            return self.integer(v)
        if v is None:
            return self.null()
        if isinstance(v, (str, bytes)):
            return self.bulk(v)
        if isinstance(v, dict):
            return self.map([(self.bulk(k), self.value(x)) for k, x in v.items()])
        return self.array([self.value(x) for x in v])


class RespCommands:
    """The Python side of the broker's Redis-protocol sessions."""

    def __init__(self, broker) -> None:
        self.b = broker
        cfg = broker.config
        self.users: dict[str, str] = dict(cfg.resp_users)
        if cfg.resp_password is not None:
            self.users["default"] = cfg.resp_password

    def handle(self, link, rest: list) -> None:
        """``[r, state, request]`` from ``link``: the answer goes back to it."""
        if len(rest) != 2 or len(rest[0]) != 1:
            raise P.ProtocolError("a RESP request takes a state and a request frame")
        state = rest[0][0]
        args = parse_request(rest[1])
        w = Writer(bool(state & RESP3))
        try:
            reply, state = self._dispatch(link, args, state, w)
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            reply = w.error(f"ERR {exc}")
        self.b.sender.send(link, [P.RESP_REQUEST, reply, bytes([state & (RESP3 | AUTHED | CLOSE)])])

    def _dispatch(self, link, args: list[bytes], state: int, w: Writer) -> tuple[bytes, int]:
        name = args[0].upper().decode("latin-1")
        if name not in _KNOWN:
            shown = " ".join(f"'{a.decode('utf-8', 'replace')[:128]}'" for a in args[1:6])
            return w.error(f"ERR unknown command '{args[0].decode('utf-8', 'replace')[:128]}', "
                           f"with args beginning with: {shown}"), state
        if name == "HELLO":
            return self._hello(link, args, state, w)
        if name == "AUTH":
            return self._auth(args, state, w)
        if name == "SELECT":
            if len(args) != 2:
                return _wrong(w, "select"), state
            return (w.ok() if args[1] == b"0" else w.error("ERR DB index is out of range")), state
        if name == "CLIENT":
            if len(args) > 1 and args[1].upper() == b"KILL":
                return self._kill(link, args[2:], state, w)
            return self._client(link, args, w), state
        if name == "INFO":
            return w.bulk(self._info(args[1:])), state
        if name == "COMMAND":
            return self._command(args, w), state
        if name == "PUBSUB":
            return self._pubsub(args, w), state
        if name in ("FLUSHDB", "FLUSHALL", "DBSIZE"):
            return self._keyspace(name, args, w), state
        return self._config(args, w), state

    # -- connecting

    def _check(self, user: str, password: bytes) -> bool:
        want = self.users.get(user)
        return want is not None and hmac.compare_digest(want.encode(), password)

    def _auth(self, args: list[bytes], state: int, w: Writer) -> tuple[bytes, int]:
        if len(args) not in (2, 3):
            return _wrong(w, "auth"), state
        user, password = ("default", args[1]) if len(args) == 2 else (args[1].decode("utf-8", "replace"), args[2])
        if not self.users:
            return w.error("ERR AUTH <password> called without any password configured for the default user. "
                           "Are you sure your configuration is correct?"), state
        if self._check(user, password):
            return w.ok(), state | AUTHED
        self.b.drops["resp_auth"] += 1
        return w.error("WRONGPASS invalid username-password pair or user is disabled."), state & ~AUTHED

    def _hello(self, link, args: list[bytes], state: int, w: Writer) -> tuple[bytes, int]:
        i = 1
        resp3 = bool(state & RESP3)
        if len(args) > 1:
            try:
                version = int(args[1])
            except ValueError:
                return w.error("ERR Protocol version is not an integer or out of range"), state
            if version not in (2, 3):
                return w.error("NOPROTO unsupported protocol version"), state
            resp3 = version == 3
            i = 2
        authed = bool(state & AUTHED)
        name = None
        while i < len(args):
            opt = args[i].upper()
            if opt == b"AUTH" and i + 2 < len(args):
                if not self.users or not self._check(args[i + 1].decode("utf-8", "replace"), args[i + 2]):
                    self.b.drops["resp_auth"] += 1
                    return w.error("WRONGPASS invalid username-password pair or user is disabled."), state
                authed = True
                i += 3
            elif opt == b"SETNAME" and i + 1 < len(args):
                name = args[i + 1]
                i += 2
            else:
                return w.error(f"ERR Syntax error in HELLO option '{opt.decode('utf-8', 'replace')}'"), state
        if not authed:
            return w.error("NOAUTH HELLO must be called with the client already authenticated, otherwise the "
                           "HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and "
                           "select the RESP protocol version at the same time"), state
        if name is not None:
            link.name = name.decode("utf-8", "replace")[:100]
        state = (state & ~RESP3) | (RESP3 if resp3 else 0) | AUTHED
        out = Writer(resp3)
        reply = out.value({"server": "redis", "version": REDIS_VERSION, "proto": 3 if resp3 else 2,
                           "id": link.link, "mode": "standalone", "role": "master", "modules": []})
        return reply, state

    def _client(self, link, args: list[bytes], w: Writer) -> bytes:
        sub = args[1].upper() if len(args) > 1 else b""
        if sub == b"SETNAME" and len(args) == 3:
            if any(c <= 32 or c > 126 for c in args[2]):
                return w.error("ERR Client names cannot contain spaces, newlines or special characters.")
            link.name = args[2].decode()[:100] or link.ident.hex()
            link.client_name = args[2].decode()
            return w.ok()
        if sub == b"GETNAME":
            return w.bulk(link.client_name) if link.client_name else w.null()
        if sub == b"ID":
            return w.integer(link.link)
        if sub == b"SETINFO" and len(args) == 4:
            if args[2].upper() not in (b"LIB-NAME", b"LIB-VER"):
                return w.error(f"ERR Unrecognized option '{args[2].decode('utf-8', 'replace')}'")
            link.lib[args[2].lower().decode()] = args[3].decode("utf-8", "replace")[:100]
            return w.ok()
        if sub in (b"NO-EVICT", b"NO-TOUCH") and len(args) == 3:
            return w.ok()
        if sub == b"TRACKING" and len(args) >= 3:
            if args[2].upper() == b"OFF":
                return w.ok()
            return w.error("ERR fastbus's broker keeps no keys: client-side caching (CLIENT TRACKING) has "
                           "nothing to track")
        if sub == b"INFO":
            return w.bulk(self._client_line(link))
        if sub == b"LIST":
            return w.bulk("".join(self._client_line(l) for l in self.b.links.snapshot()
                                  if getattr(l, "role", "") == "redis"))
        return w.error(f"ERR unknown subcommand '{sub.decode('utf-8', 'replace')}'. Try CLIENT HELP.")

    def _kill(self, me, filters: list[bytes], state: int, w: Writer) -> tuple[bytes, int]:
        """CLIENT KILL of this broker's Redis clients, by Redis's filters
        ID, TYPE (normal, pubsub; master, replica and slave match none),
        MAXAGE and SKIPME: how many were closed.  The broker knows a
        client's address without its port, so neither ADDR nor the old
        form (``CLIENT KILL ip:port``) can name one."""
        if len(filters) == 1:
            return w.error("ERR fastbus's broker knows a Redis client's address without its port: "
                           "use CLIENT KILL ID <id>"), state
        if not filters or len(filters) % 2:
            return w.error("ERR syntax error"), state
        client_id = kind = max_age = None
        skip_me = True
        for opt, value in zip(filters[::2], filters[1::2]):
            opt = opt.upper()
            if opt == b"ID":
                client_id = _integer(value)
                if client_id is None or client_id <= 0:
                    return w.error("ERR client-id should be greater than 0"), state
            elif opt == b"TYPE":
                kind = value.lower()
                if kind not in (b"normal", b"pubsub", b"master", b"replica", b"slave"):
                    return w.error(f"ERR Unknown client type '{value.decode('utf-8', 'replace')}'"), state
            elif opt == b"MAXAGE":
                max_age = _integer(value)
                if max_age is None:
                    return w.error("ERR value is not an integer or out of range"), state
            elif opt == b"SKIPME" and value.lower() in (b"yes", b"no"):
                skip_me = value.lower() == b"yes"
            elif opt in (b"ADDR", b"LADDR", b"USER"):
                return w.error(f"ERR fastbus's broker cannot kill Redis clients by {opt.decode()}: "
                               f"use CLIENT KILL ID <id>"), state
            else:
                return w.error("ERR syntax error"), state
        now = time.time()
        killed = 0
        for link in self.b.links.snapshot():
            if (getattr(link, "role", "") != "redis" or (client_id is not None and link.link != client_id)
                    or (kind is not None and kind != (b"pubsub" if link.subs else b"normal"))
                    or (max_age is not None and now - link.since <= max_age) or (skip_me and link is me)):
                continue
            killed += 1
            if link is me:
                state |= CLOSE                  # once the reply is written, as Redis does
            else:
                self.b.remove_link(link, f"CLIENT KILL from link {me.link}")
        return w.integer(killed), state

    @staticmethod
    def _client_line(link) -> str:
        return (f"id={link.link} addr={link.address or 'unix'} name={link.client_name or ''} "
                f"age={int(time.time() - link.since)} sub={link.subs} "
                f"lib-name={link.lib.get('lib-name', '')} lib-ver={link.lib.get('lib-ver', '')}\n")

    def _info(self, sections: list[bytes]) -> str:
        want = {s.lower().decode("utf-8", "replace") for s in sections} or {"default"}
        everything = bool(want & {"all", "everything", "default"})
        b = self.b
        out = []
        if everything or "server" in want:
            out += ["# Server", f"redis_version:{REDIS_VERSION}", f"fastbus_version:{fastbus.__version__}",
                    "redis_mode:standalone", f"os:{os.uname().sysname}", f"arch_bits:{_ARCH_BITS}",
                    f"process_id:{os.getpid()}",
                    f"tcp_port:{_port(b.resp_endpoints)}", f"uptime_in_seconds:{int(time.monotonic() - b._started)}",
                    f"executable:fastbus broker", f"hostname:{socket.gethostname()}", ""]
        if everything or "clients" in want:
            links = b.links.snapshot()
            redis = [l for l in links if getattr(l, "role", "") == "redis"]
            out += ["# Clients", f"connected_clients:{len(links)}", f"redis_clients:{len(redis)}",
                    f"pubsub_clients:{sum(1 for l in redis if l.subs)}", "blocked_clients:0", ""]
        if everything or "stats" in want:
            st = b.relay
            out += ["# Stats", f"total_net_input_bytes:{st.bytes_in}", f"total_net_output_bytes:{st.bytes_out}",
                    f"pubsub_channels:{len(self._channels(None))}", f"pubsub_patterns:{self._numpat()}", ""]
        if everything or "replication" in want:
            out += ["# Replication", "role:master", "connected_slaves:0", ""]
        if everything or "cluster" in want:
            out += ["# Cluster", "cluster_enabled:0", ""]
        if everything or "keyspace" in want:
            out += ["# Keyspace", ""]
        return "\r\n".join(out)

    def _command(self, args: list[bytes], w: Writer) -> bytes:
        sub = args[1].upper() if len(args) > 1 else b""
        if sub == b"COUNT":
            return w.integer(0)
        if sub == b"DOCS":
            return w.map([]) if w.resp3 else w.array([])
        return w.array([])

    # -- CONFIG

    @staticmethod
    def _config(args: list[bytes], w: Writer) -> bytes:
        """CONFIG: the broker has no Redis configuration but what a pub/sub
        client may ask about (clients probe): notify-keyspace-events is
        empty, as the broker keeps no keys to notify of, and can be set to
        nothing else.  Any other change is refused."""
        from fastbus._core import glob_match
        sub = args[1].upper() if len(args) > 1 else b""
        if sub == b"GET":
            shown = [(w.bulk(k), w.bulk(v)) for k, v in _CONFIG.items()
                     if any(glob_match(p.lower(), k) for p in args[2:])]
            return w.map(shown) if w.resp3 else w.array([x for pair in shown for x in pair])
        if sub == b"SET" and len(args) >= 4 and len(args) % 2 == 0:
            pairs = dict(zip((k.lower() for k in args[2::2]), args[3::2]))
            if all(k in _CONFIG and v == _CONFIG[k] for k, v in pairs.items()):
                return w.ok()
            if b"notify-keyspace-events" in pairs:
                return w.error("ERR fastbus's broker keeps no keys: it sends no keyspace notifications "
                               "(notify-keyspace-events)")
        return w.error("ERR fastbus's broker has no Redis configuration to change")

    # -- the keyspace (there is none)

    @staticmethod
    def _keyspace(name: str, args: list[bytes], w: Writer) -> bytes:
        """A broker holds no keys: FLUSHDB and FLUSHALL (which clients and
        test teardowns send) have nothing to remove, DBSIZE is 0."""
        if name == "DBSIZE":
            return w.integer(0) if len(args) == 1 else _wrong(w, "dbsize")
        if len(args) > 2 or (len(args) == 2 and args[1].upper() not in (b"ASYNC", b"SYNC")):
            return w.error("ERR syntax error")
        return w.ok()

    # -- PUBSUB

    def _channels(self, pattern: bytes | None) -> list[bytes]:
        from fastbus._core import glob_match
        keys = self.b.trie.keys()
        return [k for k, prefix, n in keys if not prefix and n > 0 and (pattern is None or glob_match(pattern, k))]

    def _numpat(self) -> int:
        seen = set()
        for link in self.b.links.snapshot():
            seen.update(link.globs)
        return len(seen)

    def _pubsub(self, args: list[bytes], w: Writer) -> bytes:
        sub = args[1].upper() if len(args) > 1 else b""
        if sub in (b"CHANNELS", b"SHARDCHANNELS"):
            return w.array([w.bulk(k) for k in self._channels(args[2] if len(args) > 2 else None)])
        if sub in (b"NUMSUB", b"SHARDNUMSUB"):
            counts = {k: n for k, prefix, n in self.b.trie.keys() if not prefix}
            items = []
            for ch in args[2:]:
                items += [w.bulk(ch), w.integer(counts.get(ch, 0))]
            return w.array(items)               # (a flat array in RESP3 too, as Redis)
        if sub == b"NUMPAT":
            return w.integer(self._numpat())
        return w.error(f"ERR unknown subcommand '{sub.decode('utf-8', 'replace')}'. Try PUBSUB HELP.")


def _wrong(w: Writer, name: str) -> bytes:
    return w.error(f"ERR wrong number of arguments for '{name}' command")


def _integer(v: bytes) -> int | None:
    try:
        return int(v)
    except ValueError:
        return None


def _port(endpoints: list[str]) -> int:
    for ep in endpoints:
        if ep.startswith("tcp://"):
            try:
                return int(ep.rsplit(":", 1)[1])
            except ValueError:
                pass
    return 0
