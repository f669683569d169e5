"""Where fastbus gets its Redis connections: what a target (a URL, a client,
a pool or None) means, and the one connection a publisher or subscriber
keeps for its life.

Every Redis-backed part of fastbus takes the same targets: None
(``$FASTBUS_REDIS_URL``, else the embedded server, see
:func:`fastbus.redis.server.resolve_url`), a URL, a redis-py client (plain or
cluster) or a connection pool.  The buffered publishers and the subscriber
run their own connection (:class:`Connection`); the queue primitives run
redis-py clients (:func:`sync_client`, :func:`async_client`).
"""

from __future__ import annotations

import socket
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fastbus.redis.errors import CONFIG_GET_LIMIT, DEFAULT_MAX_BULK_LEN, address_of, parse_limit

__all__ = ["Connection", "async_client", "is_asyncio", "is_cluster", "pool_from", "sync_client"]


def is_asyncio(target: Any) -> bool:
    """True for an object of ``redis.asyncio`` (a client, cluster client or pool)."""
    return type(target).__module__.startswith("redis.asyncio")


def is_cluster(target: Any) -> bool:
    """True for a redis-py ``RedisCluster``, synchronous or asyncio."""
    from redis.cluster import RedisCluster
    try:
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    except ImportError:                 # pragma: no cover - redis-py always has it
        AsyncRedisCluster = RedisCluster
    return isinstance(target, (RedisCluster, AsyncRedisCluster))


def pool_from(target: Any) -> tuple[redis.ConnectionPool, bool]:
    """A connection pool for a URL, Redis client or pool; True if ours to close."""
    from fastbus.redis.server import check_url, resolve_url
    if target is None:
        target = resolve_url(None)           # $FASTBUS_REDIS_URL, else the user's shared server
    if isinstance(target, str):
        return redis.ConnectionPool.from_url(check_url(target)), True
    if is_asyncio(target):
        raise TypeError(f"got an asyncio Redis client ({type(target).__module__}.{type(target).__name__}): "
                        "fastbus's Redis publishers and subscriber run their own connection, also the "
                        "asyncio ones; give them a URL, a redis.Redis or a redis.ConnectionPool")
    if isinstance(target, redis.ConnectionPool):
        return target, False
    if isinstance(target, redis.Redis):
        return target.connection_pool, False
    if is_cluster(target):
        # Plain PUBLISH: any node reaches the whole cluster.
        return target.get_default_node().redis_connection.connection_pool, False
    raise TypeError(f"expected a Redis URL, redis.Redis or redis.ConnectionPool, not {type(target).__name__}")


def sync_client(target: Any) -> tuple[Any, bool]:
    """A synchronous redis-py client (``redis.Redis`` or ``RedisCluster``)
    for a URL, a client, a connection pool, or None (the embedded server);
    True if the client is ours to close.  Used by the queue primitives."""
    if is_asyncio(target):
        # Checked first: redis.asyncio.Redis is no redis.Redis, and would
        # otherwise meet the generic "expected a URL..." below.
        raise TypeError(f"got an asyncio Redis client ({type(target).__module__}.{type(target).__name__}): "
                        f"use the asyncio classes (AsyncWorkQueue, AsyncTopic, AsyncInbox) with it, or give "
                        f"this one a redis.Redis, a URL, or None for the embedded server")
    if isinstance(target, redis.Redis) or is_cluster(target):
        return target, False
    # A URL, a pool or None: resolved as the publishers and subscriber do it.
    pool, own = pool_from(target)
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = own              # close() then closes a pool made here
    return client, own


def async_client(target: Any) -> tuple[Any, bool]:
    """As :func:`sync_client`, a ``redis.asyncio`` client."""
    import redis.asyncio as aioredis
    if target is None or isinstance(target, str):
        # The same resolution as the sync side: None is $FASTBUS_REDIS_URL,
        # else the embedded server; a URL is checked for its scheme.
        from fastbus.redis.server import check_url, resolve_url
        return aioredis.Redis.from_url(check_url(resolve_url(target))), True
    if is_asyncio(target):
        return target, False
    if isinstance(target, (redis.Redis, redis.ConnectionPool)) or is_cluster(target):
        raise TypeError(f"got a synchronous Redis client ({type(target).__module__}.{type(target).__name__}): "
                        f"the asyncio classes need a redis.asyncio client, a URL, or None for the embedded "
                        f"server; or use the synchronous classes (WorkQueue, Topic, Inbox) with it")
    raise TypeError(f"expected a Redis URL, a redis.asyncio client or None, not {type(target).__name__}")


class Connection:
    """One connection of a pool's kind and settings for the life of a
    publisher or subscriber (made here, not checked out of the pool), used
    through its raw socket (fastbus does its own pipelining and parsing);
    redis-py still connects it (AUTH, SELECT, TLS)."""

    def __init__(self, target: Any, command: str) -> None:
        self.pool, self._own_pool = pool_from(target)
        self._command = command
        self.redis_conn: Any = None                 # the redis-py connection, made on first use
        self.address = address_of(self.pool)        # "host:port", for errors
        self.max_bulk_len: int | None = None        # the server's proto-max-bulk-len, once read

    def socket(self, connect_timeout: float | None = None):
        """The connected socket (connecting first if needed; ``connect_timeout``
        bounds a new connection's attempt, when shorter than the pool's)."""
        if self.redis_conn is None:
            # A connection of the pool's kind and settings, owned here (not
            # the pool's get_connection(), which connects it at once, beyond
            # reach of connect_timeout and of interrupt()).
            self.redis_conn = self.pool.connection_class(**self.pool.connection_kwargs)
        conn = self.redis_conn
        if connect_timeout is not None and getattr(conn, "_sock", None) is None:
            saved = (conn.socket_connect_timeout, conn.socket_timeout)
            saved_retry = getattr(conn, "retry", None)
            bound = max(connect_timeout, 0.001)
            conn.socket_connect_timeout = min(saved[0] or bound, bound)
            conn.socket_timeout = min(saved[1] or bound, bound)          # the handshake's replies
            if saved_retry is not None:
                # One attempt: the caller retries (redis-py's own retries
                # would multiply the bound and outlive an interrupt).
                conn.retry = Retry(NoBackoff(), 0)
            try:
                conn.connect()
            finally:
                conn.socket_connect_timeout, conn.socket_timeout = saved
                if saved_retry is not None:
                    conn.retry = saved_retry
                if getattr(conn, "_sock", None) is not None:
                    conn._sock.settimeout(saved[1])
        else:
            conn.connect()
        sock = getattr(conn, "_sock", None)
        if sock is None:
            raise redis.ConnectionError("no socket after connect")
        return sock

    def read_max_bulk_len(self) -> int:
        """The server's ``proto-max-bulk-len`` (CONFIG GET on the connection,
        before it is used raw), read once; 512 MB if CONFIG is refused."""
        if self.max_bulk_len is None:
            conn = self.redis_conn
            try:
                conn.send_command(*CONFIG_GET_LIMIT)
                limit = parse_limit(conn.read_response())
            except redis.ResponseError:
                limit = DEFAULT_MAX_BULK_LEN
            except (TypeError, ValueError, IndexError):
                limit = DEFAULT_MAX_BULK_LEN
            self.max_bulk_len = limit
        return self.max_bulk_len

    def interrupt(self) -> None:
        """From another thread: make a read or write blocked on the
        connection return at once (shutdown; the owner still closes it)."""
        sock = getattr(self.redis_conn, "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def disconnect(self) -> None:
        """Close the socket (the next :meth:`socket` connects again)."""
        if self.redis_conn is not None:
            self.redis_conn.disconnect()

    def close(self) -> None:
        """Close the socket for good, and the pool if it was made here."""
        if self.redis_conn is not None:
            self.redis_conn.disconnect()
            self.redis_conn = None
        if self._own_pool:
            self.pool.disconnect()
