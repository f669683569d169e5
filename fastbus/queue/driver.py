"""How a queue operation runs: :class:`SyncDriver` and :class:`AsyncDriver`
carry out the requests an operation yields (:mod:`fastbus.queue.common`:
Call, Cmd, Many, Register) on a sync or an asyncio Redis client, one
pipeline where they can, loading the Lua scripts once per server, and turn
every failure into the exception a queue operation raises
(:mod:`fastbus.queue.failures`); :class:`SyncHandle` / :class:`AsyncHandle` own the client
a queue made from a URL.
"""

from __future__ import annotations

import asyncio
import os
import select
import threading
from collections.abc import Callable
from typing import Any, Self

import redis
import redis.asyncio
from redis.exceptions import NoScriptError

from fastbus._twins import twin_of
from fastbus.errors import FastbusError
from fastbus.queue import _lua
from fastbus.queue.common import Call, Cmd, Many, Op, Register
from fastbus.queue.failures import queue_failure, with_address
from fastbus.redis.connection import async_client, is_cluster, sync_client


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
    rest of the round trip (about 9 of 21 us measured).  Calls pipelined
    together (a :class:`Many`: get(ack=)'s ACK1 + GET1, a wait's BLPOP +
    GET) go on it too, without redis-py's pipeline object: get(ack=)'s
    round trip went from about 125 to 84 us.  One thread at a
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

    @staticmethod
    def _send_held(conn, commands: list[tuple]) -> None:
        """Send on the kept connection.  As the pool checks a connection it
        hands out: one the server closed while it was idle (a restart, its
        idle timeout) is connected again before the call, not failed by it."""
        try:
            if conn.can_read():
                raise redis.ConnectionError("connection has data")
        except _NETWORK:
            conn.disconnect()
        conn.connect()
        if _pack_command is not None:
            conn.send_packed_command([_pack_command(c) for c in commands])
        else:
            conn.send_packed_command(conn.pack_commands(commands))

    def _call_held(self, conn, request: "Call") -> Any:
        command = self._command(request)
        try:
            self._send_held(conn, [command])
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

    def _many_held(self, conn, calls: list) -> list:
        """Calls and commands pipelined on the kept connection (a Many):
        every reply read, then each taken as the client's pipeline would
        (a NOSCRIPT run again on its own, which loads the script; the
        first error raised).  redis-py's pipeline object, pool checkout
        and retry wrapper cost more client CPU than the round trip."""
        try:
            self._send_held(conn, [self._command(c) for c in calls])
            replies: list = []
            for _ in calls:
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as e:
                    replies.append(e)
        except BaseException:                            # (the connection's state is unknown)
            conn.disconnect()
            raise
        out = []
        for c, r in zip(calls, replies):
            if isinstance(r, NoScriptError) and isinstance(c, Call):
                r = self._call_held(conn, c)
            elif isinstance(r, redis.ResponseError) and not (isinstance(c, Cmd) and c.soft):
                raise r
            out.append(r)
        return out

    def release(self) -> None:
        """Give the kept connection back to the client's pool."""
        with self._held_lock:
            conn, self._held = self._held, None
            if conn is not None and self._held_pid == os.getpid():
                self.client.connection_pool.release(conn)

    def run(self, op: Op) -> Any:
        """Carry out an operation's requests.  A failure against the server,
        met by a request or raised by the operation itself from a reply it
        got, is raised as :func:`fastbus.queue.failures.queue_failure` makes it."""
        request = None
        try:
            request = next(op)
            while True:
                request = op.send(self._execute(request))
        except StopIteration as stop:
            return stop.value
        except (redis.RedisError, OSError) as e:
            if isinstance(e, FastbusError):
                raise with_address(e, self.client)
            error = queue_failure(e, self.client, request)
            if getattr(error, "limit", 0) is None:       # a large value is the suspect: ask the limit
                from fastbus.redis.errors import max_bulk_len
                error = queue_failure(e, self.client, request, max_bulk_len(self.client))
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
        if len(request.calls) > 1 and all(isinstance(c, (Call, Cmd)) for c in request.calls):
            conn = self._take()
            if conn is not None:
                try:
                    return self._many_held(conn, request.calls)
                finally:
                    self._held_lock.release()
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
    """Runs operations on a ``redis.asyncio`` client (plain or cluster).

    As :class:`SyncDriver`: script calls, and calls pipelined together (a
    :class:`Many`), go on a connection the driver keeps from the client's
    pool, straight through its ``Connection``; one task at a time uses it
    (a call made while another task holds it takes the client's ordinary
    path), in the event loop that connected it (another loop's call takes
    the ordinary path too).  Not retried; cluster clients and
    instrumented ones always take the ordinary path.

    ``remake`` (a client the driver made, from a URL): how to make it
    again.  A ``redis.asyncio`` client's connections belong to the event
    loop that opened them, so once that loop has closed (a second
    ``asyncio.run()``, a test framework's loop per test) the driver's next
    call makes a new client for the running loop instead of failing on
    the old one's (a client the caller gave is the caller's: used as it
    is, as redis-py would)."""

    def __init__(self, client: Any, remake: Callable[[], Any] | None = None) -> None:
        super().__init__(client)
        self._fast = self._pipeline and type(client).execute_command is redis.asyncio.Redis.execute_command
        self._remake = remake
        self._client_loop: Any = None        # the loop the client's connections belong to (remake only)
        self._held = None                    # the kept connection
        self._held_loop: Any = None          # the loop it belongs to
        self._held_pid = 0
        self._held_busy = False              # a task is using it (one loop: no lock needed)

    def _in_this_loop(self) -> None:
        """A client the driver made, whose loop has closed: a new one for
        the running loop (the old one's connections went with its loop:
        they are dropped, not closed, which would need that loop)."""
        loop = asyncio.get_running_loop()
        if self._client_loop is loop:
            return
        if self._client_loop is not None and self._client_loop.is_closed():
            self.client.connection_pool.reset()
            self.client = self._remake()
            self._scripts.clear()            # (registered on the old client)
            self._held = None
            self._held_busy = False
        self._client_loop = loop

    async def _take(self):
        """The kept connection, marked busy for this task; None if another
        task has it, it is another loop's, or the client is a cluster
        client."""
        if not self._fast or self._held_busy:
            return None
        loop = asyncio.get_running_loop()
        if self._held is not None and self._held_loop is not loop:
            if not self._held_loop.is_closed():
                return None                  # (another live loop's)
            self._held = None                # its loop is gone: a connection of this one instead
        self._held_busy = True
        if self._held is None or self._held_pid != os.getpid():
            try:
                try:
                    conn = await self.client.connection_pool.get_connection()      # redis-py >= 5.3
                except TypeError:                                               # pragma: no cover
                    conn = await self.client.connection_pool.get_connection("EVALSHA")
            except BaseException:
                self._held_busy = False
                raise
            self._held, self._held_loop, self._held_pid = conn, loop, os.getpid()
        return self._held

    def _give(self) -> None:
        self._held_busy = False

    @staticmethod
    async def _send_held(conn, commands: list[tuple]) -> None:
        """:meth:`SyncDriver._send_held` on asyncio."""
        try:
            if _readable(conn) or await (getattr(conn, "can_read", None) or conn.can_read_destructive)():
                raise redis.ConnectionError("connection has data")
        except _NETWORK:
            await conn.disconnect()
        await conn.connect()
        if _pack_command is not None:
            await conn.send_packed_command([_pack_command(c) for c in commands])
        else:
            await conn.send_packed_command(conn.pack_commands(commands))

    async def _call_held(self, conn, request: "Call") -> Any:
        """:meth:`SyncDriver._call_held` on asyncio."""
        command = self._command(request)
        try:
            await self._send_held(conn, [command])
            try:
                return await conn.read_response()
            except NoScriptError:                        # the server forgot it (a restart): load, call again
                await conn.send_command("SCRIPT", "LOAD", _lua.SCRIPTS[request.script])
                await conn.read_response()
                await conn.send_command(*command)
                return await conn.read_response()
        except BaseException as e:
            if not isinstance(e, redis.ResponseError):   # a network error, a timeout, a cancel:
                await _disconnect(conn)                  # the connection's state is unknown
            raise

    async def _many_held(self, conn, calls: list) -> list:
        """:meth:`SyncDriver._many_held` on asyncio."""
        try:
            await self._send_held(conn, [self._command(c) for c in calls])
            replies: list = []
            for _ in calls:
                try:
                    replies.append(await conn.read_response())
                except redis.ResponseError as e:
                    replies.append(e)
        except BaseException:                            # (the connection's state is unknown)
            await _disconnect(conn)
            raise
        out = []
        for c, r in zip(calls, replies):
            if isinstance(r, NoScriptError) and isinstance(c, Call):
                r = await self._call_held(conn, c)
            elif isinstance(r, redis.ResponseError) and not (isinstance(c, Cmd) and c.soft):
                raise r
            out.append(r)
        return out

    async def release(self) -> None:
        """Give the kept connection back to the client's pool."""
        if self._remake is not None:
            self._in_this_loop()
        conn, self._held = self._held, None
        if conn is not None and self._held_pid == os.getpid() and not self._held_busy and \
                self._held_loop is asyncio.get_running_loop():
            await self.client.connection_pool.release(conn)

    async def run(self, op: Op) -> Any:
        """As :meth:`SyncDriver.run`."""
        if self._remake is not None:
            self._in_this_loop()
        request = None
        try:
            request = next(op)
            while True:
                request = op.send(await self._execute(request))
        except StopIteration as stop:
            return stop.value
        except (redis.RedisError, OSError) as e:
            if isinstance(e, FastbusError):
                raise with_address(e, self.client)
            error = queue_failure(e, self.client, request)
            if getattr(error, "limit", 0) is None:       # a large value is the suspect: ask the limit
                from fastbus.redis.errors import max_bulk_len_async
                error = queue_failure(e, self.client, request, await max_bulk_len_async(self.client))
            if error is e:
                raise
            raise error from None

    async def _execute(self, request: Any) -> Any:
        if isinstance(request, Call):
            conn = await self._take()
            if conn is not None:
                try:
                    return await self._call_held(conn, request)
                finally:
                    self._give()
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
        if len(request.calls) > 1 and all(isinstance(c, (Call, Cmd)) for c in request.calls):
            conn = await self._take()
            if conn is not None:
                try:
                    return await self._many_held(conn, request.calls)
                finally:
                    self._give()
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
        await self.release()
        await self.client.aclose()


def _readable(conn) -> bool:
    """Does an idle asyncio connection's socket hold anything (data, or
    the server's close)?  Asked of the kernel: redis-py's own check
    (can_read) reads with a zero timeout, which an event loop that has not
    run since the close passes as nothing to read (a connection the server
    closed while idle was then used, and the call failed).  False where
    the socket cannot be had."""
    transport = getattr(getattr(conn, "_writer", None), "transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    try:
        return bool(select.select([sock.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return True                                      # (closed under us: connect again)


async def _disconnect(conn) -> None:
    """Close a connection whose state is unknown; a cancel meanwhile still
    leaves it closed (shielded)."""
    try:
        await asyncio.shield(conn.disconnect())
    except Exception:                                    # pragma: no cover - closing anyway
        pass


def sync_driver(target: Any) -> tuple[SyncDriver, bool]:
    """A driver for a URL, a ``redis.Redis``/``RedisCluster``, a connection
    pool, or None (the embedded server); True if the client is ours to close."""
    client, own = sync_client(target)
    return SyncDriver(client), own


def async_driver(target: Any) -> tuple[AsyncDriver, bool]:
    """As :func:`sync_driver`, for a ``redis.asyncio`` client."""
    client, own = async_client(target)
    return AsyncDriver(client, (lambda: async_client(target)[0]) if own else None), own


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
        else:
            await self._driver.release()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
