"""What the queue primitives share: names and key namespaces, the message
record, errors, and one way to run an operation on a sync or an asyncio
Redis client.

An operation is written once, as a generator that yields requests
(:class:`Call` of a script, :class:`Cmd` of a plain command, :class:`Many`
of several calls at once) and receives their replies; :class:`SyncDriver`
and :class:`AsyncDriver` carry the requests out.  So the blocking loop of a
``get`` or the chunking of a ``put_many`` exists once for both APIs.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import struct
import threading
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, Self

import redis
from redis.exceptions import NoScriptError

from fastbus._core import QueueMessage, queue_decode
from fastbus._twins import twin_of
from fastbus.errors import ConsumerGone, ConsumerTagInUse, FastbusError, PartialBatchError, QueueError
from fastbus.queue import _lua
from fastbus.redis.connection import async_client, is_cluster, sync_client
from fastbus.redis.errors import (CONFIG_GET_LIMIT, DEFAULT_MAX_BULK_LEN, MIN_MAX_BULK_LEN, PayloadTooLarge, address_of,
                                   parse_limit, too_large)

DEFAULT_PREFIX = "fastbus"
MAX_CALL_MESSAGES = 1000        # messages per script call (Lua's unpack limit is ~8000)
MAX_CALL_BYTES = 8 << 20        # payload bytes per script call (one message may exceed it alone)
_ID = struct.Struct(">Q")
_NAME = re.compile(r"[^\s{}:]{1,200}\Z")


def check_name(what: str, value: Any) -> str:
    """A queue, topic, inbox, consumer or tag name: 1-200 characters, no
    whitespace, no ``{ } :`` (they delimit the keys' hash tag and fields)."""
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            raise ValueError(f"{what} must be text, not {value!r}") from None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not _NAME.match(value):
        raise ValueError(f"{what} must be 1-200 characters without whitespace, '{{', '}}' or ':', not {value!r}")
    return value


def check_prefix(prefix: Any) -> str:
    if not isinstance(prefix, str) or not prefix or any(c in prefix for c in "{} \t\r\n"):
        raise ValueError(f"prefix must be a non-empty str without braces or whitespace, not {prefix!r}")
    return prefix


def namespace(kind: str, prefix: str, name: str) -> str:
    """``prefix:kind:{name}:``, the start of every key of one queue ("q"),
    topic ("t"), inbox ("i") or staged writer's channel ("c"): the braces
    make them one Redis Cluster hash slot.  ``name`` is checked by the caller."""
    return f"{check_prefix(prefix)}:{kind}:{{{name}}}:"


def payload_list(payloads: Any, what: str = "payloads") -> list[bytes]:
    """A list (or other iterable) of payloads as bytes.  A single str or
    bytes is refused: iterating it would make one message per character."""
    if isinstance(payloads, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be a list (or another iterable) of payloads, not a single "
                        f"{type(payloads).__name__}: wrap it in a list, or use put()/publish() for one message")
    try:
        items = iter(payloads)
    except TypeError:
        raise TypeError(f"{what} must be a list (or another iterable) of payloads, "
                        f"not {type(payloads).__name__}") from None
    return [as_bytes(p) for p in items]


def as_bytes(payload: Any) -> bytes:
    """Payloads are bytes; a str is taken as UTF-8 for convenience."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode()
    if isinstance(payload, (bytearray, memoryview)):
        return bytes(payload)
    raise TypeError(f"a payload must be bytes (or str), not {type(payload).__name__}")


def positive_seconds(what: str, value: Any, *, allow_none: bool = False, allow_zero: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"{what} must be a number of seconds, not {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, not {value!r}")
    return float(value)


def positive_int(what: str, value: Any, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {value!r}")
    if value <= 0:
        raise ValueError(f"{what} must be > 0, not {value!r}")
    return value


Message = QueueMessage           # a C type: fastbus.queue's messages are made many per call (queue_decode)
#: What settle/ack/reject/requeue take: a Message, or a message id.
MessageRef = Message | int


def decode_items(items: list, consumer: Any = None) -> list[Message]:
    """Items as the scripts return them (21-byte header + payload) -> Messages.
    With a consumer, they are being delivered (``deliveries`` counts this
    one); without, they are looked at (``deliveries`` so far)."""
    return queue_decode(items, consumer)


def id_key(message: Any) -> bytes:
    """The 8-byte field under which a consumer holds a message: from a
    :class:`Message` or an int id."""
    if isinstance(message, Message):
        return message._key
    if isinstance(message, int) and not isinstance(message, bool) and 0 < message < 1 << 63:
        return _ID.pack(message)
    raise TypeError(f"expected a Message or a message id (int > 0), not {message!r}")


def chunks(payloads: list[bytes]) -> Iterable[list[bytes]]:
    """Split into script calls of at most MAX_CALL_MESSAGES and about MAX_CALL_BYTES."""
    start, size = 0, 0
    for i, p in enumerate(payloads):
        if i > start and (i - start >= MAX_CALL_MESSAGES or size + len(p) > MAX_CALL_BYTES):
            yield payloads[start:i]
            start, size = i, 0
        size += len(p)
    if start < len(payloads):
        yield payloads[start:]


# -- payload sizes: the server refuses a bulk string over proto-max-bulk-len
#    (and breaks the connection), so a payload over it is refused here first

class SizeCheck:
    """Refuses a batch with a payload the server would refuse, before
    sending any of it.  Payloads up to 1 MiB always fit; the first larger one
    reads ``proto-max-bulk-len`` once (CONFIG GET; where CONFIG is not
    allowed, the default 512 MB is assumed)."""

    __slots__ = ("limit",)

    def __init__(self) -> None:
        self.limit: int | None = None

    def check(self, what: str, payloads: list[bytes]) -> Op:
        big = max(map(len, payloads), default=0)
        if big <= MIN_MAX_BULK_LEN:
            return
        if self.limit is None:
            reply = yield Cmd(CONFIG_GET_LIMIT, soft=True)
            self.limit = DEFAULT_MAX_BULK_LEN if isinstance(reply, Exception) else parse_limit(reply)
        if big > self.limit:
            i = next(i for i, p in enumerate(payloads) if len(p) == big)
            which = f", payload {i + 1} of {len(payloads)}" if len(payloads) > 1 else ""
            # The driver names the server (with_address); nothing was sent.
            raise too_large(big, self.limit, None, f"{what}{which}; nothing was written")


# -- batches of several script calls: what was written when one failed


def batch_marks(n: int) -> list[str]:
    """Names for the n calls of one batch (see lua/resolve.lua); '' for a single call."""
    if n == 1:
        return [""]
    token = secrets.token_hex(8)
    return [f"{token}.{i}" for i in range(n)]


def batch_ids(what: str, parts: list[list], marks: list[str], replies: list,
              resolve: Callable[[list[str]], "Call"], started: float) -> Op:
    """The ids of a batch sent as script calls (``parts``, named ``marks``),
    from their replies (first ids, or the exceptions of calls that failed).
    When some failed, asks the server which of them were written (RESOLVE,
    which also fences the others) and raises :class:`PartialBatchError`
    with what was; a batch of which nothing was written raises the first
    failure itself."""
    firsts: list = list(replies)
    failed = [i for i, r in enumerate(firsts) if isinstance(r, BaseException) or not r]
    unknown_calls: list[int] = []
    cause = next((firsts[i] for i in failed if isinstance(firsts[i], BaseException)), None)
    if failed and marks[0]:
        (res,) = yield Many([resolve([marks[i] for i in failed])], partial=True)
        # a mark lives MARK_TTL: past half of it a call's mark might have
        # expired before the question reached the server
        if isinstance(res, BaseException) or time.monotonic() - started > _lua.MARK_TTL_MS / 2000:
            unknown_calls = failed
            cause = cause or (res if isinstance(res, BaseException) else None)
        else:
            for i, first in zip(failed, res):
                firsts[i] = int(first)
    elif failed:
        unknown_calls = [i for i in failed if not isinstance(firsts[i], redis.ResponseError)]
    written: list[int] = []
    ids: list[int] = []
    unknown: list[int] = []
    pos = 0
    for i, part in enumerate(parts):
        first = firsts[i]
        if i in unknown_calls:
            unknown.extend(range(pos, pos + len(part)))
        elif isinstance(first, int) and first > 0:
            written.extend(range(pos, pos + len(part)))
            ids.extend(range(first, first + len(part)))
        pos += len(part)
    if len(written) == pos:
        return ids
    if not written and not unknown and cause is not None:
        raise cause
    n_calls = len(parts)
    done_calls = sum(1 for i in range(n_calls) if isinstance(firsts[i], int) and firsts[i] > 0
                     and i not in unknown_calls)
    msg = (f"{what} wrote {len(written):,} of {pos:,} messages ({done_calls} of {n_calls} script calls); "
           f"{pos - len(written) - len(unknown):,} were not written")
    if unknown:
        msg += f" and {len(unknown):,} may or may not have been (the server could not be asked)"
    if cause is not None:
        msg += f": {type(cause).__name__}: {cause}"
    msg += " (the error's .written and .ids say which were written)"
    raise PartialBatchError(msg, written, ids, unknown, pos) from cause


def pairs(flat: list) -> dict[str, int]:
    """A flat HGETALL reply of counters -> dict."""
    return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}


# -- requests an operation yields


@dataclass(slots=True)
class Call:
    script: str           # a name in _lua.SCRIPTS
    key: str              # KEYS[1]: routes the call (Redis Cluster)
    args: tuple


@dataclass(slots=True)
class Cmd:
    args: tuple           # a plain command, e.g. ("BLPOP", key, 0.5)
    soft: bool = False    # an error reply comes back as the reply (a ResponseError), not raised


@dataclass(slots=True)
class Many:
    calls: list           # Calls and Cmds, sent together (one pipeline where the client allows)
    partial: bool = False  # every call's reply or exception comes back, none is raised (see _partial)


@dataclass(slots=True)
class Register:
    """A name into (or out of) the registry of queue names
    (:mod:`fastbus.queue.registry`): ``op`` "add" (an SADD, sent once per
    process, server and name), "renew" (an SADD whatever this process did
    before: the server said the name is new, e.g. a put got id 1) or
    "remove" (an SREM).  The reply is True when the server took it; a
    refusal (out of memory, a read-only replica) is False, never raised:
    the registry only lists names, the operation goes on without it."""

    op: str
    key: str              # prefix:registry
    member: str           # "q:jobs", "t:orders", "i:team"


# (server, registry key, member) this process has registered (Register "add")
REGISTERED: set[tuple] = set()
_REGISTERED_MAX = 100_000     # a process that touches more names than this starts over (one SADD each again)


def _server_of(client: Any) -> tuple:
    """What tells a client's server (and database) apart, for REGISTERED."""
    from fastbus.redis.errors import address_of
    pool = getattr(client, "connection_pool", None)
    db = pool.connection_kwargs.get("db", 0) if pool is not None else 0
    return (address_of(client), db)


def _register_command(driver: Any, request: Register) -> tuple | None:
    """The command a Register needs, or None (registered already)."""
    if request.op == "remove":
        REGISTERED.discard((driver.server, request.key, request.member))
        return ("SREM", request.key, request.member)
    if request.op == "add" and (driver.server, request.key, request.member) in REGISTERED:
        return None
    return ("SADD", request.key, request.member)


def _registered(driver: Any, request: Register) -> None:
    if request.op != "remove":
        if len(REGISTERED) >= _REGISTERED_MAX:
            REGISTERED.clear()
        REGISTERED.add((driver.server, request.key, request.member))


_NETWORK = (redis.ConnectionError, redis.TimeoutError, OSError)

try:                                    # packs a command in C (redis-py's own packer checks each argument in Python)
    from hiredis import pack_command as _pack_command
except ImportError:                     # pragma: no cover - hiredis is optional
    _pack_command = None


Op = Generator[Any, Any, Any]


def _translate(error: BaseException, client: Any = None, request: Any = None, limit: int | None = None) -> BaseException:
    """The exception a queue operation raises for ``error``, a failure of
    ``request`` on ``client``: the scripts' own refusals (``FBQ ...``) as
    :class:`QueueError` / :class:`ConsumerTagInUse`; everything else (network,
    timeouts, a peer that is not Redis, OOM, sizes) through
    :func:`fastbus.redis.errors.translate`, the one mechanism every Redis
    part uses, naming the operation, the queue and the server.  ``limit``:
    the server's ``proto-max-bulk-len``, when the caller read it because a
    large value was refused."""
    from fastbus.redis.errors import clean_reply, is_connection_failure, largest, translate
    text = str(error)
    if isinstance(error, redis.ResponseError) and text.startswith("FBQ "):
        text = text[4:].split(" script:")[0]
        kind, _, rest = text.partition(" ")
        if kind == "TAKEN":
            return ConsumerTagInUse(rest)
        return QueueError(rest)
    # What was being done: "PUT on queue 'jobs'", "BLPOP on topic 'ev'".
    operation = None
    values: list = []
    if request is not None:
        calls = request.calls if isinstance(request, Many) else [request]
        first = calls[0] if calls else None
        if isinstance(first, Call):
            verb, key = first.script, first.key
        elif isinstance(first, Register):        # the registry of names: "q:jobs"
            verb, key = "registering", f":{first.member[0]}:{{{first.member[2:]}}}"
        elif isinstance(first, Cmd) and first.args:
            verb, key = str(first.args[0]).upper(), (first.args[1] if len(first.args) > 1 else "")
        else:
            verb, key = None, ""
        if verb is not None:
            if isinstance(key, bytes):
                key = key.decode("utf-8", "replace")
            m = re.search(r":([qticu]):\{([^}]*)\}", str(key))
            kinds = {"q": "queue", "t": "topic", "i": "inbox", "c": "channel", "u": "member"}
            operation = f"{verb} on {kinds[m.group(1)]} {m.group(2)!r}" if m else verb
            if len(calls) > 1:
                operation += f" and {len(calls) - 1} more call{'s' if len(calls) > 2 else ''}"
        for c in calls:
            values.extend(c.args if isinstance(c, (Call, Cmd)) else ())
    address = address_of(client)
    if isinstance(error, redis.ResponseError) and text.startswith("WRONGTYPE"):
        return QueueError(f"a key of this queue holds a value of another type (not made by fastbus?)"
                          f"{f' ({operation})' if operation else ''} at {address}: {clean_reply(text)}")
    # A value over the server's proto-max-bulk-len: Redis answers "invalid
    # bulk length" and closes the connection, or the connection just breaks
    # (a broken pipe) while the value is being written.  Without ``limit``
    # a large value is the suspect (a PayloadTooLarge without a limit: the
    # caller reads the server's limit and calls again with it).
    if is_connection_failure(error) or "bulk length" in text.lower():
        size = largest(values)
        if size > MIN_MAX_BULK_LEN and (limit is None or size > limit):
            return too_large(size, limit, address, operation, original=error)
    return translate(error, address, operation)


def _with_address(error: BaseException, client: Any) -> BaseException:
    """A size refusal an operation raised before sending (SizeCheck) knows
    no server: name the client's."""
    if isinstance(error, PayloadTooLarge) and error.address is None:
        return too_large(error.size or 0, error.limit, address_of(client), error.operation)
    return error


def _decode_responses(client: Any) -> bool:
    try:
        return bool(client.get_encoder().decode_responses)
    except AttributeError:
        pool = getattr(client, "connection_pool", None)
        return bool(pool and pool.connection_kwargs.get("decode_responses"))


def _check_client(client: Any) -> None:
    if _decode_responses(client):
        raise ValueError("the Redis client has decode_responses=True: fastbus queues need bytes "
                         "(payloads are binary); pass a client made without it, or a URL")


class _Driver:
    def __init__(self, client: Any) -> None:
        _check_client(client)
        self.client = client
        self._scripts: dict[str, Any] = {}
        self._pipeline = not is_cluster(client)    # a cluster pipeline cannot carry scripts
        self.server = _server_of(client)

    def _script(self, name: str):
        s = self._scripts.get(name)
        if s is None:
            s = self._scripts[name] = self.client.register_script(_lua.SCRIPTS[name])
        return s

    def _command(self, request: Any) -> tuple:
        """A request as a pipelined command.  Scripts go as plain EVALSHA:
        redis-py's pipelines would ask SCRIPT EXISTS first, a round trip
        more each time; a NOSCRIPT reply (the server restarted) is run
        again on its own, which loads the script."""
        if isinstance(request, Cmd):
            return request.args
        return ("EVALSHA", self._script(request.script).sha, 1, request.key, *request.args)

    @staticmethod
    def _reply(reply: Any) -> Any:
        if isinstance(reply, Exception):
            raise reply
        return reply


class SyncDriver(_Driver):
    """Runs operations on a redis-py ``Redis`` or ``RedisCluster``.

    A script call goes on a connection the driver keeps from the client's
    pool, straight through redis-py's ``Connection`` (send the command, read
    the reply): the client's ``execute_command`` path (pool checkout and
    release, retry wrapper, events) cost as much client CPU per call as the
    rest of the round trip (about 9 of 21 us measured).  One thread at a
    time uses it; a call made while another thread holds it (the heartbeat
    thread, say) takes the client's ordinary path.  Such calls are not
    retried: a script call whose reply was lost may have run (a put retried
    would be put twice).  Cluster clients, and clients of a class that
    overrides ``execute_command`` (instrumented ones), always take the
    ordinary path."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self._fast = self._pipeline and type(client).execute_command is redis.Redis.execute_command
        self._held = None                    # the kept connection
        self._held_pid = 0
        self._held_lock = threading.Lock()
        self._shas: dict[str, str] = {}

    def _take(self):
        """The kept connection, locked for this thread; None if another
        thread has it (or the client is a cluster client)."""
        if not self._fast or not self._held_lock.acquire(blocking=False):
            return None
        conn = self._held
        if conn is None or self._held_pid != os.getpid():   # none yet, or a forked child's copy
            pool = self.client.connection_pool
            try:
                conn = pool.get_connection()                  # redis-py >= 5.3
            except TypeError:                                 # pragma: no cover - older redis-py
                conn = pool.get_connection("EVALSHA")
            except BaseException:
                self._held_lock.release()
                raise
            self._held, self._held_pid = conn, os.getpid()
        return conn

    def _call_held(self, conn, request: "Call") -> Any:
        sha = self._shas.get(request.script)
        if sha is None:
            sha = self._shas[request.script] = self._script(request.script).sha
        command = ("EVALSHA", sha, 1, request.key, *request.args)
        try:
            # as the pool checks a connection it hands out: one the server
            # closed while it was idle (a restart, its idle timeout) is
            # connected again before the call, not failed by it
            try:
                if conn.can_read():
                    raise redis.ConnectionError("connection has data")
            except _NETWORK:
                conn.disconnect()
            conn.connect()
            if _pack_command is not None:
                conn.send_packed_command([_pack_command(command)])
            else:
                conn.send_command(*command)
            try:
                return conn.read_response()
            except NoScriptError:                        # the server forgot it (a restart): load, call again
                conn.send_command("SCRIPT", "LOAD", _lua.SCRIPTS[request.script])
                conn.read_response()
                conn.send_command(*command)
                return conn.read_response()
        except BaseException as e:
            if not isinstance(e, redis.ResponseError):   # a network error, a timeout, an interrupt:
                conn.disconnect()                        # the connection's state is unknown
            raise

    def release(self) -> None:
        """Give the kept connection back to the client's pool."""
        with self._held_lock:
            conn, self._held = self._held, None
            if conn is not None and self._held_pid == os.getpid():
                self.client.connection_pool.release(conn)

    def run(self, op: Op) -> Any:
        """Carry out an operation's requests.  A failure against the server,
        met by a request or raised by the operation itself from a reply it
        got, is raised as :func:`_translate` makes it."""
        request = None
        try:
            request = next(op)
            while True:
                request = op.send(self._execute(request))
        except StopIteration as stop:
            return stop.value
        except (redis.RedisError, OSError) as e:
            if isinstance(e, FastbusError):
                raise _with_address(e, self.client)
            error = _translate(e, self.client, request)
            if getattr(error, "limit", 0) is None:       # a large value is the suspect: ask the limit
                from fastbus.redis.errors import max_bulk_len
                error = _translate(e, self.client, request, max_bulk_len(self.client))
            if error is e:
                raise
            raise error from None

    def _execute(self, request: Any) -> Any:
        if isinstance(request, Call):
            conn = self._take()
            if conn is not None:
                try:
                    return self._call_held(conn, request)
                finally:
                    self._held_lock.release()
            return self._script(request.script)(keys=[request.key], args=request.args)
        if isinstance(request, Cmd):
            if request.soft:
                try:
                    return self.client.execute_command(*request.args)
                except redis.ResponseError as e:
                    return e
            return self.client.execute_command(*request.args)
        if isinstance(request, Register):
            command = _register_command(self, request)
            if command is not None:
                try:
                    self.client.execute_command(*command)
                except redis.ResponseError:
                    return False
                _registered(self, request)
            return True
        if request.partial:
            return self._partial(request.calls)
        if len(request.calls) > 1 and self._pipeline:
            pipe = self.client.pipeline(transaction=False)
            for c in request.calls:
                pipe.execute_command(*self._command(c))
            replies = pipe.execute(raise_on_error=False)
            return [self._execute(c) if isinstance(r, NoScriptError) else self._reply(r)
                    for c, r in zip(request.calls, replies)]
        return [self._execute(c) for c in request.calls]

    def _partial(self, calls: list) -> list:
        """Each call's reply, or the exception it met.  Pipelined, a broken
        connection leaves every call unanswered (each gets the error: they
        may or may not have run); one at a time, the calls after a broken
        connection are not sent (they get the error too)."""
        out: list = []
        if len(calls) > 1 and self._pipeline:
            pipe = self.client.pipeline(transaction=False)
            for c in calls:
                pipe.execute_command(*self._command(c))
            try:
                replies = pipe.execute(raise_on_error=False)
            except _NETWORK as e:
                return [e] * len(calls)
            for c, r in zip(calls, replies):
                if isinstance(r, NoScriptError):
                    try:
                        r = self._execute(c)
                    except (redis.ResponseError, *_NETWORK) as e:
                        r = e
                out.append(r)
            return out
        for i, c in enumerate(calls):
            try:
                out.append(self._execute(c))
            except redis.ResponseError as e:
                out.append(e)
            except _NETWORK as e:
                return out + [e] * (len(calls) - i)
        return out

    def close(self) -> None:
        self.release()
        self.client.close()


class AsyncDriver(_Driver):
    """Runs operations on a ``redis.asyncio`` client (plain or cluster)."""

    async def run(self, op: Op) -> Any:
        """As :meth:`SyncDriver.run`."""
        request = None
        try:
            request = next(op)
            while True:
                request = op.send(await self._execute(request))
        except StopIteration as stop:
            return stop.value
        except (redis.RedisError, OSError) as e:
            if isinstance(e, FastbusError):
                raise _with_address(e, self.client)
            error = _translate(e, self.client, request)
            if getattr(error, "limit", 0) is None:       # a large value is the suspect: ask the limit
                from fastbus.redis.errors import max_bulk_len_async
                error = _translate(e, self.client, request, await max_bulk_len_async(self.client))
            if error is e:
                raise
            raise error from None

    async def _execute(self, request: Any) -> Any:
        if isinstance(request, Call):
            return await self._script(request.script)(keys=[request.key], args=request.args)
        if isinstance(request, Cmd):
            if request.soft:
                try:
                    return await self.client.execute_command(*request.args)
                except redis.ResponseError as e:
                    return e
            return await self.client.execute_command(*request.args)
        if isinstance(request, Register):
            command = _register_command(self, request)
            if command is not None:
                try:
                    await self.client.execute_command(*command)
                except redis.ResponseError:
                    return False
                _registered(self, request)
            return True
        if request.partial:
            return await self._partial(request.calls)
        if len(request.calls) > 1 and self._pipeline:
            pipe = self.client.pipeline(transaction=False)
            for c in request.calls:
                pipe.execute_command(*self._command(c))
            replies = await pipe.execute(raise_on_error=False)
            return [await self._execute(c) if isinstance(r, NoScriptError) else self._reply(r)
                    for c, r in zip(request.calls, replies)]
        return [await self._execute(c) for c in request.calls]

    async def _partial(self, calls: list) -> list:
        """:meth:`SyncDriver._partial` on asyncio."""
        out: list = []
        if len(calls) > 1 and self._pipeline:
            pipe = self.client.pipeline(transaction=False)
            for c in calls:
                pipe.execute_command(*self._command(c))
            try:
                replies = await pipe.execute(raise_on_error=False)
            except _NETWORK as e:
                return [e] * len(calls)
            for c, r in zip(calls, replies):
                if isinstance(r, NoScriptError):
                    try:
                        r = await self._execute(c)
                    except (redis.ResponseError, *_NETWORK) as e:
                        r = e
                out.append(r)
            return out
        for i, c in enumerate(calls):
            try:
                out.append(await self._execute(c))
            except redis.ResponseError as e:
                out.append(e)
            except _NETWORK as e:
                return out + [e] * (len(calls) - i)
        return out

    async def close(self) -> None:
        await self.client.aclose()


def sync_driver(target: Any) -> tuple[SyncDriver, bool]:
    """A driver for a URL, a ``redis.Redis``/``RedisCluster``, a connection
    pool, or None (the embedded server); True if the client is ours to close."""
    client, own = sync_client(target)
    return SyncDriver(client), own


def async_driver(target: Any) -> tuple[AsyncDriver, bool]:
    """As :func:`sync_driver`, for a ``redis.asyncio`` client."""
    client, own = async_client(target)
    return AsyncDriver(client), own


class SyncHandle:
    """What the synchronous queue objects share: a driver, and the client
    closed with them if they made it (from a URL or the embedded default)."""

    def __init__(self, redis: Any) -> None:
        self._driver, self._own = sync_driver(redis)

    @property
    def redis(self) -> Any:
        """The redis-py client in use (``redis.Redis`` or ``redis.RedisCluster``)."""
        return self._driver.client

    def close(self) -> None:
        """Close the client if this object made it (else give back the
        connection it kept of the client's pool)."""
        if self._own:
            self._driver.close()
        else:
            self._driver.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@twin_of(SyncHandle)
class AsyncHandle:
    """:class:`SyncHandle` for the asyncio objects."""

    def __init__(self, redis: Any) -> None:
        self._driver, self._own = async_driver(redis)

    @property
    def redis(self) -> Any:
        """The ``redis.asyncio`` client in use."""
        return self._driver.client

    async def close(self) -> None:
        if self._own:
            await self._driver.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
