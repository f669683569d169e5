"""The queue engine: every operation of the work queues, topics and inboxes,
written once, sans I/O, for both APIs.

An operation is a generator that yields requests (:class:`Call` of a Lua
script, :class:`Cmd`, :class:`Many`; see :mod:`fastbus.queue.common`) and
gets their replies; the sync and asyncio facades (:mod:`~fastbus.queue.workqueue`,
:mod:`~fastbus.queue.topic`, :mod:`~fastbus.queue.inbox`) hand it to a driver
that carries the requests out.  Here: :class:`QueueSpace` (one queue
namespace: a work queue, or a topic's logical consumer), :class:`ConsumerState`
(one consumer's tag, token, heartbeat and gets), :class:`TopicOps`,
:class:`InboxOps` and the records they return.

(This file is over 700 lines because the three primitives are one set of
operations on one key layout, each operation beside the Lua script call
it makes: a topic's consumer is a work queue's space, an inbox reuses its
claims.  The validation, the requests and the drivers are in
:mod:`~fastbus.queue.common` and :mod:`~fastbus.queue.driver`.)
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import struct
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from fastbus.queue._layout import topic_columns, topic_decode
from fastbus.errors import ConsumerGone, ConsumerTagInUse, QueueError
from fastbus.queue.common import (
    Call,
    Cmd,
    Many,
    MessageRef,
    Op,
    Register,
    SizeCheck,
    as_bytes,
    batch_ids,
    batch_marks,
    chunks,
    decode_items,
    id_key,
    pairs,
    payload_list,
    positive_int,
    positive_seconds,
)
from fastbus.queue.names import check_name, check_prefix, namespace
from fastbus.errors import PastLastId
from fastbus.redis.errors import MIN_MAX_BULK_LEN
from fastbus.queue._lua import INBOX_HEADER
from fastbus.queue.registry import Listing

log = logging.getLogger("fastbus.queue")

__all__ = [
    "GONE", "MAX_FETCH", "MAX_READ", "CleanResult", "ConsumerState", "InboxMessage", "InboxOps", "QueueSpace",
    "QueueStats", "SettleResult", "TopicOps", "TopicStats", "all_pending", "consumer_tag", "decode_messages",
    "fetch_count", "max_deliveries_of", "queue_namespace", "queue_stats",
]

NETWORK_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)


# -- work queues (and a topic's logical consumers: the same namespace layout)

COUNTERS = ("put", "get", "ack", "reject", "requeue", "dead", "returned", "expired")
GONE = -1                      # the scripts' reply when a topic instance's logical consumer is gone
# A consumer's heartbeat is a script call every heartbeat_ttl / 3, and a
# TTL shorter than a round trip plus a GC pause expires live consumers:
# below these, a consumer would load the server and gain nothing.
MIN_HEARTBEAT_TTL = 0.1
MIN_CLEAN_INTERVAL = 0.1
MAX_PREFETCH = 1000            # messages a consumer takes ahead in one round trip
# A message taken ahead is handed out only while the consumer's heartbeat
# is surely alive on the server: until this share of heartbeat_ttl after
# the last heartbeat was sent (what remains covers a clock running slow).
HELD_SHARE = 0.9


@dataclass(slots=True)
class SettleResult:
    """What :meth:`Consumer.settle` did.  ``missing``: the messages given that
    this consumer did not hold (already settled, or returned to the queue
    after its heartbeat expired: another consumer may have them now)."""

    acked: int = 0
    rejected: int = 0
    requeued: int = 0
    dead: int = 0          # requeued ones that had reached max_deliveries: moved to failed
    missing: list[MessageRef] = field(default_factory=list)


@dataclass(slots=True)
class CleanResult:
    """What a cleaner run did: messages back to ready, messages moved to
    failed (max deliveries reached) and dead consumers removed."""

    returned: int = 0
    dead: int = 0
    consumers: int = 0


@dataclass(slots=True)
class QueueStats:
    """A snapshot of one queue (or one logical consumer of a topic).

    ``unacked``: per consumer tag, what it holds; ``alive``: per tag, whether
    its heartbeat is current (a dead one's messages wait for the cleaner);
    ``totals``: running counts since the queue was made; ``rates``: per
    second over the last ``window`` seconds of server time, the second
    under way included (so a burst shows at once)."""

    name: str
    ready: int
    failed: int
    unacked: dict[str, int]
    alive: dict[str, bool]
    totals: dict[str, int]
    rates: dict[str, float]
    window: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def queue_namespace(prefix: str, name: str) -> str:
    return namespace("q", prefix, check_name("queue name", name))


def consumer_tag(tag: str | None) -> str:
    if tag is None:
        return f"{socket.gethostname().split('.')[0][:40]}-{os.getpid()}-{secrets.token_hex(4)}"
    return check_name("consumer tag", tag)


def max_deliveries_of(value: Any) -> int:
    return 0 if value is None else positive_int("max_deliveries", value)


class QueueSpace:
    """Operations on one queue namespace ``ns`` (a work queue, or a topic's
    logical consumer with bodies under ``body_ns``)."""

    def __init__(self, name: str, ns: str, body_ns: str, max_deliveries: int) -> None:
        self.name = name
        self.ns = ns
        self.ready = ns + "ready"
        self.body_ns = body_ns
        self.max = max_deliveries
        self.sizes = SizeCheck()
        self.names = Listing(ns)        # its name in the registry (fastbus.queue.registry)

    def put_many(self, payloads: Any) -> Op:
        """One script call per chunk (chunks()), pipelined.  Sizes are
        checked first; a batch of several calls names them, so that a
        failure part way says exactly what was written (batch_ids)."""
        payloads = payload_list(payloads)
        if not payloads:
            return []
        what = f"queue {self.name!r}: put_many"
        yield from self.sizes.check(f"put_many on queue {self.name!r}", payloads)
        if not self.names.listed:
            yield from self.names.listing()
        parts = list(chunks(payloads))
        if len(parts) == 1:
            first = yield Call("PUT", self.ready, (self.ns, "", *payloads))
            if first == 1:
                yield from self.names.listing(first)
            return list(range(first, first + len(payloads)))
        marks = batch_marks(len(parts))
        started = time.monotonic()
        replies = yield Many([Call("PUT", self.ready, (self.ns, m, *part)) for m, part in zip(marks, parts)],
                             partial=True)
        if replies and replies[0] == 1:
            yield from self.names.listing(1)
        return (yield from batch_ids(what, parts, marks, replies,
                                     lambda ms: Call("RESOLVE", self.ready, (self.ns, *ms)), started))

    def put(self, payload: Any) -> Op:
        payload = yield from self.admit(payload)
        return (yield from self.put_gathered([payload]))

    def admit(self, payload: Any) -> Op:
        """What put() checks before its message may be sent: the payload as
        bytes (its size checked), the queue listed."""
        payload = as_bytes(payload)
        if len(payload) > MIN_MAX_BULK_LEN:
            yield from self.sizes.check(f"put on queue {self.name!r}", [payload])
        if not self.names.listed:
            yield from self.names.listing()
        return payload

    def put_gathered(self, payloads: list[bytes]) -> Op:
        """Admitted payloads (at most one script call's: gather_limit) in one
        PUT: the first one's id (the others follow it, in order)."""
        first = yield Call("PUT", self.ready, (self.ns, "", *payloads))
        if first == 1:
            yield from self.names.listing(first)
        return first

    def peek(self, count: int, failed: bool) -> Op:
        positive_int("count", count)
        items = yield Cmd(("LRANGE", self.ns + ("failed" if failed else "ready"), 0, count - 1))
        return decode_items(items)

    def return_failed(self, count: int | None, ttl_ms: int = 0) -> Op:
        n = positive_int("count", count, allow_none=True) or 0
        return (yield Call("RETURN_FAILED", self.ready, (self.ns, n, self.body_ns, ttl_ms)))

    def purge(self, which: str) -> Op:
        if which not in ("ready", "failed"):
            raise ValueError(f"purge 'ready' or 'failed', not {which!r}")
        return (yield Call("PURGE", self.ready, (self.ns, which, self.body_ns)))

    def clean(self) -> Op:
        # body_ns: a topic consumer's cleaner must move bodies along (to failed) and release them
        r = yield Call("CLEAN", self.ready, ("q", self.ns, self.max, self.body_ns))
        return CleanResult(*r)

    def stats(self, window: int) -> Op:
        window = positive_int("window", window)
        if window > 100:
            raise ValueError(f"window is at most 100 seconds (rates are kept 120 s), not {window}")
        ready, failed, totals, cons, now, buckets, usec = yield Call("STATS", self.ready, (self.ns, window))
        return queue_stats(self.name, ready, failed, totals, cons, now, buckets, usec, window)


def queue_stats(name, ready, failed, totals, cons, now, buckets, usec, window) -> QueueStats:
    """Rates: what the last ``window`` seconds counted, the second now under
    way included (a burst shows at once), over the time they span."""
    unacked, alive = {}, {}
    for i in range(0, len(cons), 3):
        tag = cons[i].decode()
        unacked[tag] = int(cons[i + 1])
        alive[tag] = int(cons[i + 2]) > 0
    sums = dict.fromkeys(COUNTERS, 0)
    for i in range(0, len(buckets), 2):
        if int(buckets[i]) > now - window:      # window - 1 whole seconds and the one under way
            for k, v in pairs(buckets[i + 1]).items():
                sums[k] = sums.get(k, 0) + v
    span = max(1.0, window - 1 + int(usec) / 1e6)
    total = dict.fromkeys(COUNTERS, 0)
    total.update(pairs(totals))
    return QueueStats(name, int(ready), int(failed), unacked, alive, total,
                      {k: v / span for k, v in sums.items()}, window)


class ConsumerState:
    """One consumer's side of a namespace: its tag, token and heartbeat."""

    def __init__(self, space: QueueSpace, tag: str | None, heartbeat_ttl: Any, clean_interval: Any,
                 owner: Any, prefetch: Any = 1) -> None:
        heartbeat_ttl = positive_seconds("heartbeat_ttl", heartbeat_ttl)
        if heartbeat_ttl < MIN_HEARTBEAT_TTL:
            raise ValueError(f"heartbeat_ttl must be at least {MIN_HEARTBEAT_TTL} s (the heartbeat is a script "
                             f"call every heartbeat_ttl / 3), not {heartbeat_ttl!r}")
        self.clean_interval = positive_seconds("clean_interval", clean_interval, allow_none=True)
        if self.clean_interval is not None and self.clean_interval < MIN_CLEAN_INTERVAL:
            raise ValueError(f"clean_interval must be at least {MIN_CLEAN_INTERVAL} s (or None: no cleaner), "
                             f"not {clean_interval!r}")
        now = time.monotonic()
        self.next_beat = now + heartbeat_ttl / 3
        self.next_clean = None if self.clean_interval is None else now + self.clean_interval
        self.space = space
        self.tag = consumer_tag(tag)
        self.token = secrets.token_hex(12)
        self.ttl_ms = max(1, int(heartbeat_ttl * 1000))
        self.period = heartbeat_ttl / 3
        self.owner = owner
        self.gone = False
        # the arguments of the one-at-a-time scripts, made once
        self._get1 = (space.ns, self.tag, self.token, self.ttl_ms, space.body_ns, "")
        self._get1_woke = self._get1[:-1] + ("1",)
        # Taking ahead (prefetch > 1): messages this consumer holds on the
        # server (in its unacked hash) and has not handed out yet, and the
        # acks given with get(ack=) while the next message was one of them,
        # sent with the next round trip (a refill, the heartbeat, close).
        # Deques: the heartbeat's thread takes from them too.
        self.prefetch = positive_int("prefetch", prefetch)
        if self.prefetch > MAX_PREFETCH:
            raise ValueError(f"prefetch is at most {MAX_PREFETCH}, not {prefetch!r}")
        self._ahead: deque = deque()
        self._deferred: deque = deque()
        # Until when (monotonic) the heartbeat is surely alive on the server
        # (set by register and each heartbeat), and whether it may have
        # lapsed since the messages ahead were taken: a cleaner may have
        # given them to another consumer, so they go back, not out.
        self._held_until = 0.0
        self._lapsed = False

    def _check(self, reply: Any) -> Any:
        """A script's reply, unless it says this instance's logical consumer is gone."""
        if reply == GONE:
            self.gone = True
            raise self.gone_error()
        return reply

    def gone_error(self) -> ConsumerGone:
        topic, _, name = self.space.name.partition("/")
        return ConsumerGone(f"topic {topic}: logical consumer {name!r} is not registered (unregistered while "
                            f"instance {self.tag} ran?): this instance has stopped; register the consumer "
                            f"and start a new instance")

    def register(self) -> Op:
        s = self.space
        yield from s.names.listing(1)   # a consumer starting: registered whatever this process did before
        sent = time.monotonic()
        reply = yield Call("REGISTER", s.ready, (s.ns, self.tag, self.token, self.ttl_ms, s.body_ns, s.max))
        back, dead = self._check(reply)
        self._alive(sent)
        if back or dead:
            log.info("consumer %s of %s: %d messages a previous consumer with this tag held went back "
                     "to the queue, %d to failed", self.tag, s.name, back, dead)
        return CleanResult(back, dead, 0)

    def heartbeat(self) -> Op:
        sent = time.monotonic()
        self._check((yield self._heartbeat_call()))
        self._alive(sent)

    def _heartbeat_call(self) -> Call:
        s = self.space
        return Call("HEARTBEAT", s.ready, (s.ns, self.tag, self.token, self.ttl_ms, s.body_ns))

    def _alive(self, sent: float) -> None:
        """The server took a heartbeat sent at ``sent`` (monotonic): it
        lives until ``sent + heartbeat_ttl`` at least.  One sent after the
        last one's life may have found it expired and taken it anew."""
        if sent >= self._held_until and self._ahead:
            self._lapsed = True
        self._held_until = sent + self.ttl_ms / 1000 * HELD_SHARE

    def wait(self) -> float:
        """Seconds until the next tick is due: the heartbeat's or the cleaner's."""
        due = self.next_beat if self.next_clean is None else min(self.next_beat, self.next_clean)
        return max(0.0, due - time.monotonic())

    def tick(self) -> Op:
        """What the consumer's thread (or task) does when :meth:`wait` is
        over: extend the heartbeat (every ``period``) and send the acks
        waiting for a round trip, and run the cleaner (every
        ``clean_interval``) when it is due."""
        now = time.monotonic()
        if now >= self.next_beat:
            self.next_beat = now + self.period
            yield from self.heartbeat()
            yield from self._send_waiting_acks()
        if self.next_clean is not None and now >= self.next_clean:
            self.next_clean = now + self.clean_interval
            r = yield from self.space.clean()
            if r.returned or r.dead:
                log.info("cleaner (consumer %s of %s): %s", self.tag, self.space.name, r)

    def failed(self, error: Exception) -> bool:
        """A tick failed: log it; True if the consumer lost its tag or its
        logical consumer (stop beating)."""
        if isinstance(error, ConsumerTagInUse):
            log.error("consumer %s of %s lost its tag: %s", self.tag, self.space.name, error)
            return True
        if isinstance(error, ConsumerGone):
            log.error("consumer %s of %s stopped: %s", self.tag, self.space.name, error)
            return True
        if isinstance(error, NETWORK_ERRORS):
            log.warning("consumer %s: heartbeat failed (%s); retrying", self.tag, error)
        else:
            log.error("consumer %s: heartbeat failed", self.tag, exc_info=error)
        return False

    def get_many(self, n: int, timeout: float | None, ack: Any = None) -> Op:
        """Up to ``n`` messages; ``ack``: a message this consumer holds,
        acknowledged in the same round trip (pipelined before the take, in
        the queue's slot: a worker's loop is one round trip a message).
        With ``prefetch`` > 1, a take asks for that many and keeps what is
        not asked for now: later gets hand them out with no round trip (an
        ``ack`` then waits for the next one; see :meth:`tick`)."""
        positive_int("n", n)
        positive_seconds("timeout", timeout, allow_none=True, allow_zero=True)
        if self.gone:
            raise self.gone_error()
        ahead = self._ahead
        if ahead and not self._lapsed and time.monotonic() < self._held_until:
            out = _drain(ahead, n)
            if out:
                if ack is not None:
                    self._deferred.append(ack)
                return out
        deferred = _drain(self._deferred)
        acks = deferred + [ack] if ack is not None else deferred
        # Taken ahead while the heartbeat may have lapsed: back to the queue
        # (a cleaner may have given them to another consumer meanwhile).
        back = _drain(ahead) if ahead else []
        self._lapsed = False
        s = self.space
        deadline = None if timeout is None else time.monotonic() + timeout
        want = max(n, self.prefetch)
        if want == 1:
            first = Call("GET1", s.ready, self._get1)
            get = Call("GET1", s.ready, self._get1_woke)
        else:
            first = Call("GET", s.ready, (s.ns, self.tag, self.token, self.ttl_ms, want, s.body_ns, ""))
            get = Call("GET", s.ready, (s.ns, self.tag, self.token, self.ttl_ms, want, s.body_ns, "1"))
        if not acks and not back:
            items = self._check((yield first))
        else:
            settle = self._ack1_call(acks[0]) if len(acks) == 1 and not back else self._settle_call(acks, [], back)
            calls = [settle, first]
            if back:
                # The heartbeat is overdue (its thread stalled, or failed):
                # renewed in the same round trip, so the messages this take
                # keeps ahead can go out (not be given back in turn).
                calls.insert(0, self._heartbeat_call())
            sent = time.monotonic()
            done = False
            try:
                replies = yield Many(calls)
                done = True
            finally:
                if not done:                    # (not known to be sent: they wait for the next round trip)
                    self._unsettled(deferred, back)
            if back:
                self._check(replies[0])
                self._alive(sent)
            settled, items = replies[-2:]
            settled = self._check(settled)
            if len(acks) == 1 and not back:
                self._ack1_result(settled, acks[0])
            else:
                self._settle_result(settled, acks + back, len(acks))
            items = self._check(items)
        while not items:
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait <= 0:
                return []
            # Block until a producer's token arrives (no polling), and take
            # in the same round trip: the server runs the pipelined GET as
            # soon as BLPOP returns.  A token is only a hint, so the loop
            # waits again if another consumer was faster.  The 1 s slices
            # bound the wait for a token lost with a consumer that died
            # holding it.
            _token, items = yield Many([Cmd(("BLPOP", s.ns + "notify", max(0.01, round(wait, 3)))), get])
            self._check(items)
        got = decode_items(items, self.owner)
        if len(got) > n:
            ahead.extend(got[n:])
            del got[n:]
        return got

    def ack1(self, message: Any) -> Op:
        """settle(ack=[message]), one script call lighter (ACK1)."""
        if self.gone:
            raise self.gone_error()
        return self._ack1_result(self._check((yield self._ack1_call(message))), message)

    def _ack1_call(self, message: Any) -> Call:
        s = self.space
        return Call("ACK1", s.ready, (s.ns, self.tag, self.token, self.ttl_ms, s.body_ns, id_key(message)))

    def _ack1_result(self, r: Any, message: Any) -> SettleResult:
        s = self.space
        if r[0]:
            return SettleResult(1)
        log.warning("consumer %s of %s: a message acked was not held by it (its heartbeat expired and it "
                    "went back to the queue, or it was settled already)", self.tag, s.name)
        return SettleResult(0, 0, 0, 0, [message])

    def settle(self, ack, reject, requeue) -> Op:
        ack, reject, requeue = list(ack), list(reject), list(requeue)
        if len(ack) == 1 and not reject and not requeue:
            return (yield from self.ack1(ack[0]))
        if not (ack or reject or requeue):
            return SettleResult()
        if self.gone:
            raise self.gone_error()
        return (yield from self._settle(ack, reject, requeue))

    def _settle(self, ack: list, reject: list, requeue: Iterable = ()) -> Op:
        r = self._check((yield self._settle_call(ack, reject, requeue)))
        return self._settle_result(r, ack + reject + list(requeue))

    def _settle_call(self, ack: list, reject: list, requeue: Iterable = ()) -> Call:
        given = [*ack, *reject, *requeue]
        keys = [id_key(m) for m in given]
        if len(set(keys)) != len(keys):
            raise ValueError("a message is given twice to settle")
        a, r = len(ack), len(ack) + len(reject)
        ids = (b"".join(keys[:a]), b"".join(keys[a:r]), b"".join(keys[r:]))
        s = self.space
        return Call("SETTLE", s.ready, (s.ns, self.tag, self.token, self.ttl_ms, s.body_ns, s.max, *ids))

    def _settle_result(self, r: Any, given: list, told: int | None = None) -> SettleResult:
        """SETTLE's reply; a warning for the messages it did not find held
        (of the first ``told`` of ``given``: the rest are messages taken
        ahead that go back, and a cleaner may have taken them first)."""
        missing = [given[i - 1] for i in r[4]]
        told_missing = missing if told is None else [m for i, m in zip(r[4], missing) if i <= told]
        if told_missing:
            s = self.space
            log.warning("consumer %s of %s: %d of %d messages settled were not held by it (its heartbeat "
                        "expired and they went back to the queue, or they were settled already)",
                        self.tag, s.name, len(told_missing), len(given) if told is None else told)
        return SettleResult(r[0], r[1], r[2], r[3], missing)

    def _send_waiting_acks(self) -> Op:
        """The acks get(ack=) left waiting, in one SETTLE (kept for the
        next round trip if it fails)."""
        acks = _drain(self._deferred)
        if not acks:
            return
        done = False
        try:
            yield from self._settle(acks, [])
            done = True
        finally:
            if not done:
                self._unsettled(acks, [])

    def _unsettled(self, acks: list, back: list) -> None:
        """A round trip that carried waiting acks (and messages taken ahead
        going back) failed: they wait for the next one."""
        self._deferred.extendleft(reversed(acks))
        if back:
            self._ahead.extendleft(reversed(back))
            self._lapsed = True

    def release(self) -> Op:
        """Close: the acks still waiting sent, then everything held given
        back (messages taken ahead among them), not counted as deliveries."""
        s = self.space
        acks = _drain(self._deferred)
        _drain(self._ahead)
        release = Call("RELEASE", s.ready, (s.ns, self.tag, self.token, s.body_ns))
        if not acks:
            return (yield release)[0]
        # (partial: a SETTLE refused, say the tag was lost, still lets the
        # RELEASE's answer through; only that one's failure fails close())
        settled, r = yield Many([self._settle_call(acks, []), release], partial=True)
        if isinstance(r, Exception):
            raise r
        if isinstance(settled, Exception) or settled == GONE:
            log.warning("consumer %s of %s closed: %d acks could not be sent (%s): those messages go back "
                        "to the queue", self.tag, s.name, len(acks), settled)
        else:
            self._settle_result(settled, acks)
        return r[0]


def _drain(q: deque, n: int | None = None) -> list:
    """Up to ``n`` (None: all) items off the left of ``q``, which another
    thread may take from at the same time."""
    out: list = []
    while n is None or len(out) < n:
        try:
            out.append(q.popleft())
        except IndexError:
            break
    return out


# -- topics


MAX_READ = 10000


@dataclass(slots=True)
class TopicStats:
    """``last_id``: the newest message id; ``published``: messages ever
    published; ``consumers``: per logical consumer, its queue's stats."""

    name: str
    last_id: int
    published: int
    consumers: dict[str, QueueStats]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TopicOps:
    def __init__(self, name: str, prefix: str, ttl: float, max_deliveries: int | None) -> None:
        self.name = check_name("topic name", name)
        self.ns = namespace("t", prefix, self.name)
        self.seq = self.ns + "seq"
        self.ttl_ms = max(1, int(positive_seconds("ttl", ttl) * 1000))
        self.max = max_deliveries_of(max_deliveries)
        self.sizes = SizeCheck()
        self.names = Listing(self.ns)     # its name in the registry (fastbus.queue.registry)

    def space(self, consumer: str) -> QueueSpace:
        consumer = check_name("consumer name", consumer)
        return QueueSpace(f"{self.name}/{consumer}", f"{self.ns}c:{consumer}:", self.ns, self.max)

    def publish_many(self, payloads) -> Op:
        """As the work queue's put_many (QueueSpace.put_many)."""
        payloads = payload_list(payloads)
        if not payloads:
            return []
        what = f"topic {self.name!r}: publish_many"
        yield from self.sizes.check(f"publish_many on topic {self.name!r}", payloads)
        if not self.names.listed:
            yield from self.names.listing()
        parts = list(chunks(payloads))
        if len(parts) == 1:
            first = yield Call("PUBLISH", self.seq, (self.ns, self.ttl_ms, "", *payloads))
            if first == 1:
                yield from self.names.listing(first)
            return list(range(first, first + len(payloads)))
        marks = batch_marks(len(parts))
        started = time.monotonic()
        replies = yield Many([Call("PUBLISH", self.seq, (self.ns, self.ttl_ms, m, *p)) for m, p in zip(marks, parts)],
                             partial=True)
        if replies and replies[0] == 1:
            yield from self.names.listing(1)
        return (yield from batch_ids(what, parts, marks, replies,
                                     lambda ms: Call("RESOLVE", self.seq, (self.ns, *ms)), started))

    def publish(self, payload) -> Op:
        payload = as_bytes(payload)
        if len(payload) > MIN_MAX_BULK_LEN:
            yield from self.sizes.check(f"publish on topic {self.name!r}", [payload])
        if not self.names.listed:
            yield from self.names.listing()
        first = yield Call("PUBLISH", self.seq, (self.ns, self.ttl_ms, "", payload))
        if first == 1:
            yield from self.names.listing(first)
        return first

    def register(self, consumer: str) -> Op:
        consumer = check_name("consumer name", consumer)
        yield from self.names.listing(1)  # rare: registered whatever this process did before
        new, _last = yield Call("SUBSCRIBE", self.seq, (self.ns, consumer))
        return bool(new)

    def unregister(self, consumer: str) -> Op:
        dropped = yield Call("UNSUBSCRIBE", self.seq, (self.ns, check_name("consumer name", consumer)))
        if dropped < 0:
            raise QueueError(f"topic {self.name} has no consumer named {consumer!r}")
        return dropped

    def consumers(self) -> Op:
        names = yield Cmd(("SMEMBERS", self.ns + "consumers"))
        return sorted(n.decode() for n in names)

    def last_id(self) -> Op:
        v = yield Cmd(("GET", self.seq))
        return int(v or 0)

    def read(self, first: int, last: int) -> Op:
        positive_int("first", first)
        positive_int("last", last)
        if last < first:
            return []
        if last - first >= MAX_READ:
            raise ValueError(f"read at most {MAX_READ} ids per call, not {last - first + 1}")
        values = yield Call("READ", self.seq, (self.ns, first, last))
        return topic_decode(values, first)

    def read_columns(self, first: int, last: int) -> Op:
        positive_int("first", first)
        positive_int("last", last)
        if last < first:
            return topic_columns([], first)
        if last - first >= MAX_READ:
            raise ValueError(f"read at most {MAX_READ} ids per call, not {last - first + 1}")
        values = yield Call("READ", self.seq, (self.ns, first, last))
        return topic_columns(values, first)

    def retained(self) -> Op:
        while True:
            first, last = yield Call("RETAINED", self.seq, (self.ns,))
            if first >= 0:
                return int(first), int(last)

    def position(self, consumer: str) -> Op:
        consumer = check_name("consumer name", consumer)
        pos = yield Call("POSITION", self.seq, (self.ns, consumer))
        if pos < 0:
            raise QueueError(f"topic {self.name} has no consumer named {consumer!r}")
        return pos

    def ack_upto(self, consumer: str, last: int, step: int = 10000) -> Op:
        consumer = check_name("consumer name", consumer)
        total = 0
        while True:
            removed, more = yield Call("ACK_UPTO", self.seq, (self.ns, consumer, int(last), step))
            if removed == -2:
                raise PastLastId(f"topic {self.name!r}: ack_upto({consumer!r}, {last}) is past the last id "
                                 f"published ({more}); nothing was removed")
            if removed < 0:
                raise QueueError(f"topic {self.name} has no consumer named {consumer!r}")
            total += removed
            if not more:
                return total

    def stats(self, window: int) -> Op:
        positive_int("window", window)
        last, names, totals = yield Call("TOPIC_INFO", self.seq, (self.ns,))
        names = sorted(n.decode() for n in names)
        spaces = [self.space(n) for n in names]
        replies = (yield Many([Call("STATS", s.ready, (s.ns, window)) for s in spaces])) if spaces else []
        return TopicStats(self.name, int(last), pairs(totals).get("put", 0),
                          {s.name.split("/", 1)[1]: queue_stats(s.name, *r, window) for s, r in zip(spaces, replies)})

    def clean(self) -> Op:
        r = yield Call("CLEAN", self.seq, ("t", self.ns, self.max))
        return CleanResult(*r)

    def return_failed(self, consumer: str, count: int | None) -> Op:
        return (yield from self.space(consumer).return_failed(count, self.ttl_ms))



# -- inboxes


MAX_FETCH = 10000                     # messages per fetch (one script reply)
_MSG = struct.Struct(">BQQH")         # version, id, created ms, sender length
assert _MSG.size == INBOX_HEADER


@dataclass(slots=True)
class InboxMessage:
    """A message of an inbox: ``id`` (strictly increasing per inbox),
    ``sender`` (a member when it was sent), ``payload`` (bytes),
    ``created_at`` (server time of the send, seconds since the epoch) and
    ``inbox`` (the inbox's name: the per-user view mixes inboxes)."""

    id: int
    sender: str
    payload: bytes
    created_at: float
    inbox: str


def decode_messages(inbox: str, items: list) -> list[InboxMessage]:
    out = []
    for item in items:
        _v, mid, created, n = _MSG.unpack_from(item)
        start = _MSG.size
        out.append(InboxMessage(mid, item[start:start + n].decode(), item[start + n:], created / 1000.0, inbox))
    return out


def _member(value: Any) -> str:
    return check_name("member name", value)


def fetch_count(count: Any) -> int:
    positive_int("count", count)
    if count > MAX_FETCH:
        raise ValueError(f"count is at most {MAX_FETCH} messages per fetch, not {count}")
    return count


def _ttl_ms(ttl: Any) -> int:
    """Seconds (None: no ttl) -> the scripts' milliseconds (0: no ttl)."""
    t = positive_seconds("ttl", ttl, allow_none=True)
    return 0 if t is None else max(1, int(t * 1000))


def _user_key(prefix: str, member: str) -> str:
    return f"{prefix}:u:{{{member}}}:inboxes"


def _flat_pairs(flat: list) -> list[tuple[str, int]]:
    return [(flat[i].decode(), int(flat[i + 1])) for i in range(0, len(flat), 2)]


class InboxOps:
    def __init__(self, name: str, prefix: str, ttl: float | None) -> None:
        self.name = check_name("inbox name", name)
        self.prefix = check_prefix(prefix)
        self.ns = namespace("i", self.prefix, self.name)
        self.key = self.ns + "members"            # KEYS[1] of every script: routes the call
        self.ttl_ms = _ttl_ms(ttl)
        self.names = Listing(self.ns)             # its name in the registry (fastbus.queue.registry)

    def _hint(self, member: str, *args: Any) -> Call:
        return Call("INBOX_HINT", _user_key(self.prefix, member), args)

    def create(self, members: Iterable[str], sender: str | None, message: Any) -> Op:
        if isinstance(members, (str, bytes)):
            raise TypeError("members must be an iterable of member names, not a single name")
        names = list(dict.fromkeys(_member(m) for m in members))   # deduplicated, in order
        if (sender is None) != (message is None):
            raise ValueError("create takes sender and message together (or neither)")
        payload = b""
        if sender is not None:
            sender = _member(sender)
            if sender not in names:
                names.append(sender)              # the sender is a member, as in the book
            payload = as_bytes(message)
        if not names:
            raise ValueError("an inbox needs at least one member")
        if (yield Cmd(("EXISTS", self.key))):     # the usual refusal, before touching any hint
            raise QueueError(f"inbox {self.name} exists already: join it instead")
        versions = yield Many([self._hint(m, "add", self.name) for m in names])
        args = (self.ns, self.name, self.ttl_ms, "0" if sender is None else "1",
                sender or "", payload, *names)
        ok, detail = yield Call("INBOX_CREATE", self.key, args)
        if not ok:
            # Created by someone else meanwhile: withdraw the hints of those
            # that are not members of that inbox (version-checked, see fastbus.queue.inbox).
            drops = [self._hint(m, "drop", self.name, v) for m, v, flag in zip(names, versions, detail) if not flag]
            if drops:
                yield Many(drops)
            raise QueueError(f"inbox {self.name} exists already: join it instead")
        yield Many([self._hint(m, "add", self.name) for m in names])
        yield from self.names.listing(1)          # new: registered whatever this process did before
        return detail or None

    def join(self, member: str, create: bool) -> Op:
        member = _member(member)
        version = yield self._hint(member, "add", self.name)
        state, pos = yield Call("INBOX_JOIN", self.key, (self.ns, member, "1" if create else "0"))
        if state < 0:
            yield self._hint(member, "drop", self.name, version)
            raise QueueError(f"no inbox named {self.name}: create it first (or join with create=True)")
        yield self._hint(member, "add", self.name)   # after the membership: see fastbus.queue.inbox
        yield from self.names.listing(1)          # rare: registered whatever this process did before
        return pos

    def leave(self, member: str) -> Op:
        member = _member(member)
        version = yield Cmd(("ZSCORE", _user_key(self.prefix, member), self.name))
        left = yield Call("INBOX_LEAVE", self.key, (self.ns, member))
        if version is not None:
            # only the version seen before leaving: a concurrent join's newer hint stays
            yield self._hint(member, "drop", self.name, int(float(version)))
        if left == 2 and self.names.entry is not None:
            # the inbox is gone: its name leaves the registry, and comes back
            # if a create or join made it anew meanwhile (their own
            # registration may have come before this removal)
            e = self.names.entry
            yield Register("remove", e.key, e.member)
            self.names.listed = False
            if (yield Cmd(("EXISTS", self.key))):
                yield from self.names.listing(1)
        return bool(left)

    def send(self, sender: str, payload: Any) -> Op:
        args = (self.ns, self.name, self.ttl_ms, _member(sender), as_bytes(payload))
        if not self.names.listed:
            yield from self.names.listing()
        return (yield Call("INBOX_SEND", self.key, args))

    def fetch(self, member: str, count: int) -> Op:
        args = (self.ns, self.name, self.ttl_ms, _member(member), fetch_count(count), "1")
        _pos, items = yield Call("INBOX_FETCH", self.key, args)
        return decode_messages(self.name, items)

    def ack(self, member: str, upto_id: int) -> Op:
        member = _member(member)
        positive_int("upto_id", upto_id)
        return (yield Call("INBOX_ACK", self.key, (self.ns, self.name, self.ttl_ms, member, upto_id)))

    def members(self) -> Op:
        return dict(_flat_pairs((yield Call("INBOX_MEMBERS", self.key, (self.ns,)))))

    def last_id(self) -> Op:
        return int((yield Cmd(("GET", self.ns + "seq"))) or 0)


def all_pending(prefix: str, member: str, count: int, ttl: float | None = None) -> Op:
    """member -> {inbox: pending messages} over its hinted inboxes; stale
    hints are dropped.  count 0: membership only (empty lists)."""
    prefix, member = check_prefix(prefix), _member(member)
    ttl_ms = _ttl_ms(ttl)
    ukey = _user_key(prefix, member)
    hints = []
    for name, version in _flat_pairs((yield Call("INBOX_HINT", ukey, ("list",)))):
        try:
            hints.append((check_name("inbox name", name), version))
        except ValueError:
            continue                      # not a name fastbus wrote: leave it alone
    if not hints:
        return {}
    ops = [InboxOps(name, prefix, None) for name, _v in hints]
    replies = yield Many([Call("INBOX_FETCH", o.key, (o.ns, o.name, ttl_ms, member, count, "0")) for o in ops])
    out, stale = {}, []
    for (name, version), (pos, items) in zip(hints, replies):
        if pos < 0:
            stale.append(Call("INBOX_HINT", ukey, ("drop", name, version)))
        else:
            out[name] = decode_messages(name, items)
    if stale:
        yield Many(stale)
    return dict(sorted(out.items()))
