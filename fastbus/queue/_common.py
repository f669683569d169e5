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
import re
import struct
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any, Self

import redis
from redis.exceptions import NoScriptError

from fastbus._core import QueueMessage, queue_decode
from fastbus.errors import FastbusError
from fastbus.queue import _lua

DEFAULT_PREFIX = "fastbus"
MAX_CALL_MESSAGES = 1000        # messages per script call (Lua's unpack limit is ~8000)
MAX_CALL_BYTES = 8 << 20        # payload bytes per script call (one message may exceed it alone)
_ID = struct.Struct(">Q")
_NAME = re.compile(r"[^\s{}:]{1,200}\Z")


class QueueError(FastbusError):
    """A queue operation the server refused (the message says why)."""


class ConsumerTagInUse(QueueError):
    """Another live consumer holds this consumer tag (its heartbeat has not expired)."""


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


@dataclass(slots=True)
class Many:
    calls: list           # Calls and Cmds, sent together (one pipeline where the client allows)


Op = Generator[Any, Any, Any]


def _translate(error: redis.ResponseError) -> Exception:
    text = str(error)
    if text.startswith("FBQ "):
        text = text[4:].split(" script:")[0]
        kind, _, rest = text.partition(" ")
        if kind == "TAKEN":
            return ConsumerTagInUse(rest)
        return QueueError(rest)
    if text.startswith("WRONGTYPE"):
        return QueueError(f"a key of this queue holds a value of another type (not made by fastbus?): {text}")
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
        self._pipeline = not _is_cluster(client)    # a cluster pipeline cannot carry scripts

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
    """Runs operations on a redis-py ``Redis`` or ``RedisCluster``."""

    def run(self, op: Op) -> Any:
        try:
            request = next(op)
            while True:
                request = op.send(self._execute(request))
        except StopIteration as stop:
            return stop.value
        except redis.ResponseError as e:
            raise _translate(e) from None

    def _execute(self, request: Any) -> Any:
        if isinstance(request, Call):
            return self._script(request.script)(keys=[request.key], args=request.args)
        if isinstance(request, Cmd):
            return self.client.execute_command(*request.args)
        if len(request.calls) > 1 and self._pipeline:
            pipe = self.client.pipeline(transaction=False)
            for c in request.calls:
                pipe.execute_command(*self._command(c))
            replies = pipe.execute(raise_on_error=False)
            return [self._execute(c) if isinstance(r, NoScriptError) else self._reply(r)
                    for c, r in zip(request.calls, replies)]
        return [self._execute(c) for c in request.calls]

    def close(self) -> None:
        self.client.close()


class AsyncDriver(_Driver):
    """Runs operations on a ``redis.asyncio`` client (plain or cluster)."""

    async def run(self, op: Op) -> Any:
        try:
            request = next(op)
            while True:
                request = op.send(await self._execute(request))
        except StopIteration as stop:
            return stop.value
        except redis.ResponseError as e:
            raise _translate(e) from None

    async def _execute(self, request: Any) -> Any:
        if isinstance(request, Call):
            return await self._script(request.script)(keys=[request.key], args=request.args)
        if isinstance(request, Cmd):
            return await self.client.execute_command(*request.args)
        if len(request.calls) > 1 and self._pipeline:
            pipe = self.client.pipeline(transaction=False)
            for c in request.calls:
                pipe.execute_command(*self._command(c))
            replies = await pipe.execute(raise_on_error=False)
            return [await self._execute(c) if isinstance(r, NoScriptError) else self._reply(r)
                    for c, r in zip(request.calls, replies)]
        return [await self._execute(c) for c in request.calls]

    async def close(self) -> None:
        await self.client.aclose()


def _is_cluster(client: Any) -> bool:
    from redis.cluster import RedisCluster
    try:
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    except ImportError:                 # pragma: no cover
        AsyncRedisCluster = RedisCluster
    return isinstance(client, (RedisCluster, AsyncRedisCluster))


def sync_driver(target: Any) -> tuple[SyncDriver, bool]:
    """A driver for a URL, a ``redis.Redis``/``RedisCluster``, a connection
    pool, or None (the embedded server); True if the client is ours to close."""
    if isinstance(target, redis.Redis) or _is_cluster(target):
        if type(target).__module__.startswith("redis.asyncio"):
            raise TypeError("an asyncio Redis client needs the Async classes (AsyncWorkQueue, ...)")
        return SyncDriver(target), False
    # A URL, a pool or None: resolved where the rest of fastbus.redis does it.
    from fastbus.redis.publisher import _pool_from
    pool, own = _pool_from(target)
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = own              # close() then closes a pool made here
    return SyncDriver(client), own


def async_driver(target: Any) -> tuple[AsyncDriver, bool]:
    """As :func:`sync_driver`, for a ``redis.asyncio`` client."""
    import redis.asyncio as aioredis
    if target is None or isinstance(target, str):
        from fastbus.redis.server import resolve_url
        return AsyncDriver(aioredis.Redis.from_url(resolve_url(target))), True
    if type(target).__module__.startswith("redis.asyncio"):
        return AsyncDriver(target), False
    raise TypeError(f"expected a Redis URL or a redis.asyncio client, not {type(target).__name__}")


class SyncHandle:
    """What the synchronous queue objects share: a driver, and the client
    closed with them if they made it (from a URL or the embedded default)."""

    def __init__(self, redis: Any) -> None:
        self._driver, self._own = sync_driver(redis)

    @property
    def redis(self):
        """The redis-py client in use."""
        return self._driver.client

    def close(self) -> None:
        """Close the client if this object made it."""
        if self._own:
            self._driver.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncHandle:
    """:class:`SyncHandle` for the asyncio objects."""

    def __init__(self, redis: Any) -> None:
        self._driver, self._own = async_driver(redis)

    @property
    def redis(self):
        """The ``redis.asyncio`` client in use."""
        return self._driver.client

    async def close(self) -> None:
        if self._own:
            await self._driver.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
