"""One place where a failure against a Redis server becomes a fastbus error.

redis-py and the socket layer say what went wrong in their own terms:
``TimeoutError: Timeout reading from socket`` (which server?),
``InvalidResponse: Protocol error, got "H" as reply type byte`` (an HTTP
server on the port), ``ConnectionError: Broken pipe`` (a value over the
server's ``proto-max-bulk-len``), ``OutOfMemoryError: ... script: <sha>, on
@user_script:167.``.  :func:`translate` turns each into an error of
:mod:`fastbus.errors` that says in one line what failed, against which
server (``host:port``) and what to do.  The queue drivers, the buffered
publishers (``PublishError.reason``), the subscriber and the embedded
server's resolution all go through it.

Every class keeps the built-in it resembles *and* the redis-py class the
untranslated error had, so ``except ConnectionError``, ``except
redis.ConnectionError`` and ``except redis.ResponseError`` written before
keep working:

=======================  =====================  ===============================
class                    built-in               redis-py
=======================  =====================  ===============================
``RedisServerError``     (base)                 ``RedisError``
``ServerUnavailable``    ``ConnectionError``    ``ConnectionError``
``NotARedisServer``      ``ConnectionError``    ``ConnectionError``, ``InvalidResponse``
``ServerTimeout``        ``TimeoutError``       ``TimeoutError``
``PayloadTooLarge``      ``ValueError``         ``DataError``
``ServerRefused``        (none)                 ``ResponseError``
``ServerOutOfMemory``    (none)                 ``OutOfMemoryError``
=======================  =====================  ===============================

A Redis server out of memory is not a ``MemoryError``: that one means this
process ran out.  The classes are defined here (they need redis-py's) and
importable from :mod:`fastbus.errors` and :mod:`fastbus.redis`.
"""

from __future__ import annotations

import errno as _errno
import os
import re
import weakref
from typing import Any

from redis import exceptions as rx

from fastbus.errors import FastbusError, adopt_redis_bases

adopt_redis_bases()

__all__ = [
    "CONFIG_GET_LIMIT",
    "DEFAULT_MAX_BULK_LEN",
    "MIN_MAX_BULK_LEN",
    "NotARedisServer",
    "PayloadTooLarge",
    "RedisServerError",
    "ServerOutOfMemory",
    "ServerRefused",
    "ServerTimeout",
    "ServerUnavailable",
    "address_of",
    "max_bulk_len",
    "translate",
]

#: Redis's default ``proto-max-bulk-len``: the largest string it accepts (512 MB).
DEFAULT_MAX_BULK_LEN = 512 << 20
#: The smallest ``proto-max-bulk-len`` Redis allows: values up to this size are
#: never refused for their size, so nothing smaller is checked.
MIN_MAX_BULK_LEN = 1 << 20


class RedisServerError(FastbusError, rx.RedisError):
    """A Redis server could not do what was asked.  ``address``: the server
    (``host:port``, ``unix:/path``, or None if unknown); ``operation``: what
    was being done; ``original``: the error as redis-py or the socket raised
    it."""

    _kind = rx.ExceptionType.SERVER

    def __init__(self, message: str, *, address: str | None = None, operation: str | None = None,
                 original: BaseException | None = None) -> None:
        super().__init__(message)
        self.address = address
        self.operation = operation
        self.original = original
        # What redis-py's own errors carry (the MRO runs into a built-in's
        # __init__ before redis-py's, which would set them).
        self.error_type = self._kind
        self.status_code = None

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else type(self).__name__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __reduce__(self):
        return (_rebuild, (type(self), str(self)), dict(self.__dict__, original=None))


def _rebuild(cls: type, message: str) -> RedisServerError:
    return cls(message)


class ServerUnavailable(RedisServerError, ConnectionError, rx.ConnectionError):
    """No connection to the server: refused, reset, closed, unreachable, or
    it refused the credentials.  Usually worth retrying later."""

    _kind = rx.ExceptionType.NETWORK


class NotARedisServer(ServerUnavailable, rx.InvalidResponse):
    """What listens at the address answered something that is not the Redis
    protocol (an HTTP server, say): the URL's port is probably wrong."""


class ServerTimeout(RedisServerError, TimeoutError, rx.TimeoutError):
    """The server did not answer within the socket timeout: overloaded, or
    what listens there is not a Redis server and says nothing."""

    _kind = rx.ExceptionType.NETWORK


class PayloadTooLarge(RedisServerError, ValueError, rx.DataError):
    """A value longer than the server's ``proto-max-bulk-len`` (512 MB by
    default): Redis refuses it, and closes the connection.  ``size``: its
    length in bytes (None if unknown), ``limit``: the server's limit."""

    def __init__(self, message: str, *, size: int | None = None, limit: int | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.size = size
        self.limit = limit


class ServerRefused(RedisServerError, rx.ResponseError):
    """The server answered with an error (``READONLY``, ``NOPERM``, an
    unknown command, a failing script...): the message gives its text."""


class ServerOutOfMemory(ServerRefused, rx.OutOfMemoryError):
    """The server is over ``maxmemory`` and refuses writes: free memory
    (consume, purge) or raise ``maxmemory``."""


# Shown (and pickled) as fastbus.errors.X, where users import them from.
for _cls in (RedisServerError, ServerUnavailable, NotARedisServer, ServerTimeout, PayloadTooLarge, ServerRefused,
             ServerOutOfMemory):
    _cls.__module__ = "fastbus.errors"
del _cls


# --------------------------------------------------------------------------- where


def address_of(target: Any) -> str | None:
    """``host:port`` (or ``unix:/path``) of a redis-py client, asyncio client,
    connection pool or connection; for a cluster client, its nodes."""
    if target is None:
        return None
    nodes = getattr(target, "nodes_manager", None)
    if nodes is not None:                        # RedisCluster, sync or asyncio
        try:
            names = [n.name for n in (getattr(nodes, "startup_nodes", {}) or {}).values()]
        except Exception:  # noqa: BLE001 - only a description
            names = []
        return "cluster " + ",".join(names[:3]) + (",..." if len(names) > 3 else "") if names else "cluster"
    pool = getattr(target, "connection_pool", target)
    kwargs = getattr(pool, "connection_kwargs", None)
    if kwargs is None:                           # a Connection
        kwargs = {k: getattr(target, k) for k in ("host", "port", "path") if hasattr(target, k)}
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    if "host" in kwargs or "port" in kwargs:
        return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    return None


def _embedded_note(address: str | None) -> str:
    """A pointer to the embedded server's log when the address is its own."""
    if not address:
        return ""
    from fastbus.redis import server as srv
    s = srv.started_default()
    if s is None or s.port is None or address != f"{srv.HOST}:{s.port}":
        return ""
    log = s.log_path
    return f" (fastbus's embedded server{f'; its log: {log}' if log else ''})"


# --------------------------------------------------------------------------- translation

_SCRIPT_SUFFIX = re.compile(r"\s*script:\s*\w*,?\s*on @\w+:\d+\.?\s*$")
_REDIS_PY_CONNECT = re.compile(r"^Error (-?\d+) connecting to \S+?\.?\s+(.*?)\.?$", re.DOTALL)


def clean_reply(text: str) -> str:
    """A server's error text without the script reference (sha and line in
    fastbus's Lua) and line breaks."""
    text = _SCRIPT_SUFFIX.sub("", text).strip()
    return " ".join(text.split())


def _reason(exc: BaseException) -> str:
    """The cause in a few words: 'connection refused', 'broken pipe'..."""
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno).lower()
    text = str(exc).strip()
    m = _REDIS_PY_CONNECT.match(text)
    if m:
        code = int(m.group(1))
        if code > 0:
            return os.strerror(code).lower()
        return m.group(2).rstrip(".").lower() or "connection failed"
    return text.rstrip(".") or type(exc).__name__


def _connecting(exc: BaseException) -> bool:
    text = str(exc).lower()
    if "connecting to" in text or "timeout connecting" in text:
        return True
    return isinstance(exc, OSError) and exc.errno in (_errno.ECONNREFUSED, _errno.EHOSTUNREACH,
                                                      _errno.ENETUNREACH, _errno.EADDRNOTAVAIL)


def translate(exc: BaseException, address: str | None = None, operation: str | None = None) -> BaseException:
    """The fastbus error for ``exc``, a failure of ``operation`` (a few words:
    ``"PUT on queue 'jobs'"``) against the server at ``address``.

    fastbus's own errors, and errors that are not about the server (bad
    arguments, bugs), come back unchanged.  Never raises."""
    if isinstance(exc, FastbusError):
        return exc
    where = address or "?"
    doing = f" ({operation})" if operation else ""
    note = _embedded_note(address)
    kw = {"address": address, "operation": operation, "original": exc}
    try:
        if isinstance(exc, rx.ResponseError) or (isinstance(exc, rx.RedisError) and type(exc) is rx.RedisError
                                                  and str(exc).startswith(("ERR ", "OOM "))):
            return _refused(exc, where, operation, kw)
        if isinstance(exc, rx.AuthenticationError) or (isinstance(exc, rx.AuthorizationError)):
            return ServerUnavailable(
                f"Redis at {where} refused the credentials{doing}: {clean_reply(str(exc))}; check the user "
                f"and password in the URL", **kw)
        if isinstance(exc, rx.BusyLoadingError):
            return ServerUnavailable(
                f"Redis at {where} is loading its data set into memory{doing}; try again shortly", **kw)
        if isinstance(exc, rx.InvalidResponse) or (isinstance(exc, rx.ConnectionError)
                                                   and "protocol error" in str(exc).lower()):
            return not_redis(str(exc), address, operation, original=exc)
        if isinstance(exc, (rx.TimeoutError, TimeoutError)):
            if _connecting(exc):
                return ServerTimeout(
                    f"timed out connecting to Redis at {where}{doing}: is the host reachable (a "
                    f"firewall dropping packets?){note}", **kw)
            return ServerTimeout(
                f"Redis at {where} did not answer in time{doing}: {_reason(exc).lower()}; is the "
                f"server overloaded or blocked, or is what listens on that port not a Redis "
                f"server?{note}", **kw)
        if isinstance(exc, (rx.ConnectionError, OSError)):
            reason = _reason(exc)
            if _connecting(exc):
                return ServerUnavailable(
                    f"cannot connect to Redis at {where}{doing}: {reason}; is the server running, "
                    f"and is the URL right?{note}", **kw)
            return ServerUnavailable(
                f"lost the connection to Redis at {where}{doing}: {reason}; the server may have "
                f"stopped or closed the connection (see its log){note}", **kw)
    except Exception:  # noqa: BLE001 - a translation must never hide the error itself
        return exc
    return exc


def _refused(exc: BaseException, where: str, operation: str | None, kw: dict) -> BaseException:
    text = clean_reply(str(exc))
    upper = text.upper()
    op = operation or "the command"
    if isinstance(exc, rx.OutOfMemoryError) or upper.startswith("OOM") or \
            "COMMAND NOT ALLOWED WHEN USED MEMORY" in upper:
        return ServerOutOfMemory(
            f"Redis at {where} is out of memory (used memory > 'maxmemory') and refused {op}: "
            f"free memory (consume or purge what it holds) or raise its maxmemory", **kw)
    if "INVALID BULK LENGTH" in upper or "INVALID MULTIBULK LENGTH" in upper:
        return PayloadTooLarge(
            f"Redis at {where} refused {op}: a value is longer than its proto-max-bulk-len "
            f"(512 MB by default); split it, or raise the server's proto-max-bulk-len", **kw)
    if upper.startswith("NOSCRIPT"):
        return exc                               # the drivers handle it (load and run again)
    return ServerRefused(f"Redis at {where} refused {op}: {text}", **kw)


def not_redis(detail: str, address: str | None, operation: str | None = None,
              original: BaseException | None = None) -> NotARedisServer:
    """The error for a peer that does not speak RESP (``detail``: what it sent,
    or the parser's complaint)."""
    detail = " ".join(str(detail).split())[:120]
    what = "it answers like an HTTP server" if "HTTP" in detail or '"H"' in detail else "it answered"
    return NotARedisServer(
        f"the server at {address or '?'} does not speak the Redis protocol"
        f"{f' ({operation})' if operation else ''}: {what} ({detail}); is the URL's port the "
        f"Redis server's?", address=address, operation=operation, original=original)


# --------------------------------------------------------------------------- sizes

_limits: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

#: The command that reads the limit (a client's ``config_get(CONFIG_GET_LIMIT[2])``):
#: every reader sends it and parses the reply with :func:`parse_limit`.
CONFIG_GET_LIMIT = ("CONFIG", "GET", "proto-max-bulk-len")


def parse_limit(reply: Any) -> int:
    """``proto-max-bulk-len`` from a CONFIG GET reply: a flat list, a dict, or
    (a cluster client) a dict of node -> either, where the smallest of the
    nodes' counts; :data:`DEFAULT_MAX_BULK_LEN` if the reply has none."""
    found = _config_limit(reply)
    return DEFAULT_MAX_BULK_LEN if found is None else found


def _config_limit(reply: Any) -> int | None:
    if isinstance(reply, dict):
        items = list(reply.items())
    elif isinstance(reply, (list, tuple)):
        items = list(zip(reply[::2], reply[1::2]))
    else:
        return None
    nodes = []
    for k, v in items:
        if isinstance(k, (bytes, str)):
            name = k.decode() if isinstance(k, bytes) else k
            if name.lower() == CONFIG_GET_LIMIT[2]:
                return int(v)
        if isinstance(v, (dict, list)):          # a cluster client's reply: one per node
            n = _config_limit(v)
            if n is not None:
                nodes.append(n)
    return min(nodes) if nodes else None


def _cached(client: Any) -> int | None:
    pool = getattr(client, "connection_pool", None)
    try:
        return _limits[pool] if pool is not None else None
    except (KeyError, TypeError):
        return None


def _cache(client: Any, limit: int) -> int:
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        try:
            _limits[pool] = limit
        except TypeError:
            pass
    return limit


def max_bulk_len(client: Any) -> int:
    """The server's ``proto-max-bulk-len`` (a sync redis-py client; read once
    per connection pool), or 512 MiB if it cannot be read (CONFIG renamed or
    not allowed)."""
    cached = _cached(client)
    if cached is not None:
        return cached
    try:
        return _cache(client, parse_limit(client.config_get(CONFIG_GET_LIMIT[2])))
    except (rx.RedisError, OSError, ValueError):
        return DEFAULT_MAX_BULK_LEN


async def max_bulk_len_async(client: Any) -> int:
    """:func:`max_bulk_len` for a ``redis.asyncio`` client."""
    cached = _cached(client)
    if cached is not None:
        return cached
    try:
        return _cache(client, parse_limit(await client.config_get(CONFIG_GET_LIMIT[2])))
    except (rx.RedisError, OSError, ValueError):
        return DEFAULT_MAX_BULK_LEN


def largest(values: Any) -> int:
    """The length in bytes of the longest bytes or str among ``values`` (0 if none)."""
    best = 0
    for v in values:
        if isinstance(v, str):
            n = len(v) if len(v) * 4 <= MIN_MAX_BULK_LEN else len(v.encode("utf-8", "surrogatepass"))
        elif isinstance(v, memoryview):
            n = v.nbytes
        elif isinstance(v, (bytes, bytearray)):
            n = len(v)
        else:
            continue
        if n > best:
            best = n
    return best


def too_large(size: int, limit: int | None, address: str | None, operation: str | None = None,
              original: BaseException | None = None) -> PayloadTooLarge:
    """The error for a value of ``size`` bytes over the server's ``limit``
    (None: not known; the connection broke while such a value was sent)."""
    doing = f" ({operation})" if operation else ""
    if limit is None:
        return PayloadTooLarge(
            f"a value of {_mb(size)} could not be written to Redis at {address or '?'}{doing}: the "
            f"connection broke while sending it, as Redis does for values over its "
            f"proto-max-bulk-len (512 MiB by default); split it or store it elsewhere",
            size=size, limit=None, address=address, operation=operation, original=original)
    return PayloadTooLarge(
        f"a value of {_mb(size)} is over the proto-max-bulk-len ({_mb(limit)}) of Redis at "
        f"{address or '?'}{doing}: Redis refuses it; split it or store it elsewhere (or raise "
        f"the server's proto-max-bulk-len)",
        size=size, limit=limit, address=address, operation=operation, original=original)


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n >= 10 << 20 else f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 \
        else f"{n} bytes"


def is_connection_failure(exc: BaseException) -> bool:
    """A broken or refused connection (what a too-large value also looks like)."""
    return isinstance(exc, (rx.ConnectionError, OSError)) and not isinstance(exc, (rx.TimeoutError, TimeoutError))


__all__ += ["is_connection_failure", "largest", "max_bulk_len_async", "not_redis", "parse_limit",
            "too_large"]
