"""What the queue primitives share: the message record, the size checks,
and the requests an operation yields (their names and key namespaces are
in :mod:`fastbus.queue.names`).

An operation is written once, as a generator that yields requests
(:class:`Call` of a script, :class:`Cmd` of a plain command, :class:`Many`
of several calls at once) and receives their replies; the drivers of
:mod:`fastbus.queue.driver` carry the requests out on a sync or an asyncio
Redis client.  So the blocking loop of a ``get`` or the chunking of a
``put_many`` exists once for both APIs.
"""

from __future__ import annotations

import math
import secrets
import struct
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

import redis

from fastbus.queue._layout import QueueMessage, queue_decode
from fastbus.errors import PartialBatchError
from fastbus.queue import _lua
from fastbus.redis.errors import CONFIG_GET_LIMIT, DEFAULT_MAX_BULK_LEN, MIN_MAX_BULK_LEN, parse_limit, too_large

MAX_CALL_MESSAGES = 1000        # messages per script call (Lua's unpack limit is ~8000)
MAX_CALL_BYTES = 8 << 20        # payload bytes per script call (one message may exceed it alone)
_ID = struct.Struct(">Q")


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


Op = Generator[Any, Any, Any]
