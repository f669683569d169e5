"""The broker's journal (``fastbus broker --journal DIR``): a kill -9 of
the broker, and its restart, lose nothing a client was told the broker
took (docs/PROTOCOL.md, "The journal").

The data plane appends, and commits once a turn before anything goes out,
every batch owed to a resumable session and what each publishing session
has sent (fastbus/broker/_journal.pxi).  This module writes what describes
the sessions (rare records), reads the journal back at start, makes every
session in it linger again with what it was owed, and keeps the directory
within ``journal_bytes`` by writing what is still owed into a new segment
(a snapshot) and deleting the segments before it.

Records (a type byte and a payload; csrc/fb_journal.h frames them):

    O  JSON {"sid", "pub", "name", "linger", "user", "acks", "durable",
       "claim"}: a resumable session opened (again, at a takeover)
    S  sid[16] | seq u64 | ops: subscriptions changed (what was applied)
    Z  sid[16] | seq u64 | ops: its whole subscription set (a snapshot)
    C  sid[16] | seq u64: the latest CONFIRM it was sent
    T  sid[16] | n u64: its client took its stream up to n (TAKEN)
    E  sid[16]: the session ended
    B  sid[16] | end u64 | records u32 | seq[8] | batch: owed to it (relay)
    R  sid[16] | received u64: what came from it (relay)

and of the held queue groups (docs/PROTOCOL.md, "Held groups"), each by
its mark (``interest.group_mark``; ``mlen u8 | mark``):

    H  JSON {"mark", "name", "key", "glob", "hold_ms", "declared", "binds"}: held
       (declared, or again, or its bindings changed; ``declared`` wall-clock
       seconds; ``binds`` [channel hex, until (wall-clock s), capacity] each)
    X  mlen | mark: no longer held
    K  mlen | mark | wall ns u64 | topic_len u32 | headers_len u32 |
       payload_len u32 | topic, headers, payload: kept, the newest (relay)
    G  mlen | mark | n u64: its n oldest left: given, expired, dropped (relay)
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections import deque

from fastbus import protocol as P
from fastbus._core import SUBSCRIBE

from .interest import group_mark

log = logging.getLogger("fastbus.broker")

OPENED, SUBSCRIBED, RESET, CONFIRMED, TAKEN, ENDED, BATCH, RECEIVED = (ord(c) for c in "OSZCTEBR")
HELD, UNHELD, KEPT, GONE = (ord(c) for c in "HXKG")
_U64 = struct.Struct("<Q")
_KEPT = struct.Struct("<QIII")
_BATCH_HEAD = struct.Struct("<16sQI8s")
#: The routing id a restored session holds until its client is back (no
#: connection's: a ROUTER's start with a zero byte and are 5 bytes long).
_IDENT = b"\xfejournal:"
#: The most one segment holds (a smaller journal_bytes makes them smaller).
SEGMENT_BYTES = 64 * 1024 * 1024


class _Restored:
    """One session as the journal tells it."""

    __slots__ = ("meta", "subs", "seq", "confirmed", "taken", "received", "batches", "ended")

    def __init__(self) -> None:
        self.meta: dict | None = None
        self.subs: set[tuple[bytes, int]] = set()
        self.seq = 0
        self.confirmed = 0
        self.taken = 0
        self.received = 0
        self.batches: dict[int, tuple] = {}          # end -> (end, records, seq, batch)
        self.ended = False


def replay(records: list) -> dict[bytes, _Restored]:
    """The sessions the records describe, by their 16-byte id (in order;
    what the client took no longer kept)."""
    out: dict[bytes, _Restored] = {}

    def of(sid: bytes) -> _Restored:
        r = out.get(sid)
        if r is None:
            r = out[sid] = _Restored()
        return r

    for kind, payload in records:
        if kind == BATCH:
            sid, end, n, seq = _BATCH_HEAD.unpack_from(payload)
            r = of(sid)
            if end > r.taken:
                r.batches[end] = (end, n, seq, payload[_BATCH_HEAD.size:])
        elif kind == RECEIVED:
            of(payload[:16]).received = _U64.unpack_from(payload, 16)[0]
        elif kind == OPENED:
            meta = json.loads(payload)
            r = of(bytes.fromhex(meta["sid"]))
            r.meta, r.ended = meta, False
        elif kind in (SUBSCRIBED, RESET):
            r = of(payload[:16])
            r.seq = _U64.unpack_from(payload, 16)[0]
            if kind == RESET:
                r.subs = set()
            for op, key, prefix in P.decode_ops(payload[24:]):
                (r.subs.add if op == SUBSCRIBE else r.subs.discard)((key, prefix))
        elif kind == CONFIRMED:
            of(payload[:16]).confirmed = _U64.unpack_from(payload, 16)[0]
        elif kind == TAKEN:
            r = of(payload[:16])
            r.taken = max(r.taken, _U64.unpack_from(payload, 16)[0])
            r.batches = {e: b for e, b in r.batches.items() if e > r.taken}
        elif kind == ENDED:
            r = of(payload[:16])
            r.ended, r.batches, r.subs = True, {}, set()
    return out


class _RestoredGroup:
    """One held group as the journal tells it: its declaration (None once
    released) and its backlog, oldest first: (wall ns, topic, headers,
    payload)."""

    __slots__ = ("meta", "items")

    def __init__(self) -> None:
        self.meta: dict | None = None
        self.items: deque[tuple[int, bytes, bytes, bytes]] = deque()


def _mark_of(payload: bytes) -> tuple[bytes, int]:
    """A held group's record: its mark, and where the rest starts."""
    n = payload[0]
    return payload[1:1 + n], 1 + n


def replay_held(records: list) -> dict[bytes, _RestoredGroup]:
    """The held groups the records describe, by their mark (in order)."""
    out: dict[bytes, _RestoredGroup] = {}
    for kind, payload in records:
        if kind == KEPT:
            mark, o = _mark_of(payload)
            wall, tl, hl, pl = _KEPT.unpack_from(payload, o)
            o += _KEPT.size
            g = out.setdefault(mark, _RestoredGroup())
            g.items.append((wall, payload[o:o + tl], payload[o + tl:o + tl + hl],
                            payload[o + tl + hl:o + tl + hl + pl]))
        elif kind == GONE:
            mark, o = _mark_of(payload)
            items = out.setdefault(mark, _RestoredGroup()).items
            for _ in range(min(len(items), _U64.unpack_from(payload, o)[0])):
                items.popleft()
        elif kind == HELD:
            meta = json.loads(payload)
            out.setdefault(bytes.fromhex(meta["mark"]), _RestoredGroup()).meta = meta
        elif kind == UNHELD:
            g = out.get(_mark_of(payload)[0])
            if g is not None:
                g.meta = None
    return out


class Journal:
    """The journal of one broker (BrokerConfig.journal)."""

    def __init__(self, broker) -> None:
        cfg = broker.config
        self.b = broker
        self.path: str = cfg.journal
        self.fsync: str = cfg.fsync
        self.max_bytes: int = cfg.journal_bytes
        self.segment_bytes = max(1024 * 1024, min(SEGMENT_BYTES, self.max_bytes // 8))
        self._subs: dict[int, set] = {}       # link id -> its subscriptions (for a snapshot)
        self._snapshot_bytes = 0
        self.torn = 0                          # bytes a kill cut off past the last commit (at start)
        self.restored = 0                      # sessions read back at start
        self.restored_messages = 0
        self.held_restored = 0                 # held groups read back at start
        self.held_restored_messages = 0        # ... and the messages they kept
        self.held_lost = 0                     # ... and those a bound refused now (logged)

    # -- start -------------------------------------------------------------

    def start(self) -> None:
        """Read what the directory holds, journal from now on into a new
        segment, make each session read back linger again, write what they
        are owed into it, and delete the older segments.  OSError if the
        directory cannot be read or written."""
        from ._relay import read_journal
        records, self.torn = read_journal(self.path)
        relay = self.b.relay
        relay.journal_open(self.path, self.fsync, self.segment_bytes)
        now = time.monotonic()
        for sid, r in replay(records).items():
            if r.ended or r.meta is None:
                continue
            self._restore(sid, r, now)
        # After the sessions: their members are away, so a backlog waits
        # for one to resume (or a new member) as it did before the restart.
        for mark, g in replay_held(records).items():
            self._restore_held(mark, g)
        self.compact()
        if self.torn:
            log.warning("journal %s: %d bytes past its last whole commit were cut off (a kill, or a full disk): "
                        "nothing that was acknowledged", self.path, self.torn)
        log.info("journal %s (fsync %s): %d sessions read back, %d messages owed to them; %d held groups, "
                 "%d messages kept by them", self.path, self.fsync, self.restored, self.restored_messages,
                 self.held_restored, self.held_restored_messages)

    def _restore_held(self, mark: bytes, r: _RestoredGroup) -> None:
        b = self.b
        meta = r.meta
        if meta is None:
            if r.items:                      # (not written so: a release drops the backlog first)
                self._held_lost(len(r.items), mark.hex(), "its declaration was released")
            return
        group = (bytes.fromhex(meta["name"]), bytes.fromhex(meta["key"]), bool(meta["glob"]))
        wall = time.time()
        g = b.interest.restore_held(group, int(meta["hold_ms"]), wall - float(meta["declared"]))
        if isinstance(g, str):
            self._held_lost(len(r.items), group[0].decode(errors="replace"), g)
            return
        self.held_restored += 1
        b.interest.restore_binds(group, [(bytes.fromhex(k), round((until - wall) * 1000), int(capacity))
                                         for k, until, capacity in meta.get("binds", ())])
        mono_ns, wall_ns = time.monotonic_ns(), time.time_ns()
        lost = 0
        for at, topic, headers, payload in r.items:
            if b.router.group_restore(g.gid, topic, headers, payload, max(0, mono_ns - max(0, wall_ns - at))):
                self.held_restored_messages += 1
            else:
                lost += 1
        if lost:
            self._held_lost(lost, group[0].decode(errors="replace"), "over --max-held-bytes")

    def _held_lost(self, n: int, name: str, why: str) -> None:
        """Messages a held group kept before the restart that it cannot keep
        now: counted (drops.held_full) and logged with the exact number."""
        self.held_lost += n
        self.b.drops["held_full"] += n
        log.warning("journal %s: held group %s: %d messages it kept are not kept after the restart (%s)",
                    self.path, name, n, why)

    def _restore(self, sid: bytes, r: _Restored, now: float) -> None:
        from .links import ClientLink
        b = self.b
        meta = r.meta
        link = ClientLink(b.links.new_id(), _IDENT + sid, str(meta.get("name", ""))[:100] or sid.hex(),
                          b.sessions.sock, bool(meta.get("pub")))
        link.session_id = sid.hex()
        link.user_id = meta.get("user") or None
        link.linger = float(meta.get("linger") or b.config.session_linger)
        link.acks = meta.get("acks") is True
        link.headers = meta.get("headers") is True
        link.headers_again = meta.get("headers_again") is True
        link.durable = meta.get("durable")
        link.claim = meta.get("claim")
        link.consumed = r.taken if link.durable else 0
        link.confirmed = r.confirmed
        b.add_link(link)
        if r.subs:
            b.interest.apply(link, [(SUBSCRIBE, key, prefix) for key, prefix in r.subs])
        b.relay.confirm(link.link, r.seq)
        self.opened(link, write=False)
        self._subs[link.link] = set(r.subs)
        end = max([r.taken, *r.batches])
        kept = b.relay.journal_restore(link.link, list(r.batches.values()), end, r.taken, r.received)
        b.relay.detach(link.link)
        b.router.set_away(link.link, True)       # (a queue group picks it last until it resumes)
        link.detached_at = now
        self.restored += 1
        self.restored_messages += kept

    # -- what describes the sessions ---------------------------------------

    def opened(self, link, write: bool = True) -> None:
        """A resumable session opened (or taken over: its claim changed)."""
        sid = bytes.fromhex(link.session_id)
        self.b.relay.journal_session(link.link, sid)
        self._subs.setdefault(link.link, set())
        if write:
            self._append(OPENED, json.dumps(self._meta(link)).encode())

    @staticmethod
    def _meta(link) -> dict:
        return {"sid": link.session_id, "pub": link.publisher, "name": link.name, "linger": link.linger,
                "user": link.user_id, "acks": link.acks, "headers": link.headers,
                "headers_again": link.headers_again, "durable": link.durable,
                "claim": link.claim}

    def subscribed(self, link, seq: int, ops: list, refused: list) -> None:
        """A SUB applied (less what was refused)."""
        if link.link not in self._subs:
            return
        no = {(key, prefix) for key, prefix, _why in refused}
        # (A held group's declaration is no subscription of the session's:
        # the group is journaled on its own, and outlives the session.)
        applied = [op for op in ops if (op[0] != SUBSCRIBE or (op[1], op[2]) not in no) and
                   not (isinstance(op[2], P.Queue) and op[2].hold)]
        held = self._subs[link.link]
        for op, key, prefix in applied:
            (held.add if op == SUBSCRIBE else held.discard)((key, prefix))
        self._append(SUBSCRIBED, bytes.fromhex(link.session_id) + _U64.pack(seq) + P.encode_ops(applied))

    def confirmed(self, link, seq: int) -> None:
        if link.link in self._subs:
            self._append(CONFIRMED, bytes.fromhex(link.session_id) + _U64.pack(seq))

    def taken(self, link, n: int) -> None:
        if link.link in self._subs:
            self._append(TAKEN, bytes.fromhex(link.session_id) + _U64.pack(n))

    def ended(self, link) -> None:
        if self._subs.pop(link.link, None) is not None:
            self._append(ENDED, bytes.fromhex(link.session_id))

    def held_declared(self, group: tuple, g) -> None:
        """A held group declared (again): its expiry and when."""
        name, key, glob = group
        wall, mono = time.time(), time.monotonic()
        declared = wall - (mono - g.declared)
        binds = [[k.hex(), wall + (until - mono), capacity] for k, (until, capacity) in g.binds.items()]
        self._append(HELD, json.dumps({"mark": group_mark(*group).hex(), "name": name.hex(), "key": key.hex(),
                                       "glob": glob, "hold_ms": g.hold_ms, "declared": declared,
                                       "binds": binds}).encode())

    def held_ended(self, g) -> None:
        """A held group no longer held (its backlog's end: the router's G)."""
        mark = group_mark(g.queue.name, g.key, g.queue.glob)
        self._append(UNHELD, bytes([len(mark)]) + mark)

    def _append(self, kind: int, payload: bytes) -> None:
        self.b.relay.journal_append(kind, payload)

    # -- the directory's bound ---------------------------------------------

    # The directory holds at most the trigger plus one turn's writes, and
    # for the moment a compaction takes, the new snapshot besides: the
    # trigger is half the bound and the snapshot (what sessions are owed)
    # gets a quarter, so a compaction never rewrites more than half of
    # what it finds, and the directory stays at three quarters of its
    # bound and a turn's writes.

    def _trigger(self) -> int:
        return self.max_bytes // 2

    def maintain(self) -> None:
        """Once a maintenance turn: the relay's trigger armed again (a
        compaction that found the disk full disarmed it)."""
        self.b.relay.journal_compact_at(self._trigger())

    def compact(self) -> None:
        """Write, into a new segment, every journaled session and what it
        is owed (at most a quarter of the bound of batches: past it a
        session's oldest are not kept, and a restart tells its client the
        exact loss), then delete the segments before it, and arm the
        relay's trigger for the next."""
        relay = self.b.relay
        relay.journal_compact_at(0)               # (armed again below, or by the next maintenance turn)
        if not relay.journal_commit(roll=True):
            return                                # (a full disk: nothing is deleted, the next turn tries again)
        first = relay.journal_stats()["segment"]
        for link in self.b.links.by_id.values():
            subs = self._subs.get(link.link)
            if subs is None or not self.b.links.is_current(link):
                continue
            sid = bytes.fromhex(link.session_id)
            self._append(OPENED, json.dumps(self._meta(link)).encode())
            self._append(RESET, sid + _U64.pack(relay.data_seq(link.link)) +
                         P.encode_ops([(SUBSCRIBE, key, prefix) for key, prefix in subs]))
            self._append(CONFIRMED, sid + _U64.pack(link.confirmed))
            taken = link.consumed if link.durable else relay.ring_from(link.link)
            self._append(TAKEN, sid + _U64.pack(taken))
        for group, g in self.b.interest.held.items():
            self.held_declared(group, g)
            relay.journal_backlog(g.gid, group_mark(*group))
        self._snapshot_bytes = relay.journal_snapshot(self.max_bytes // 4)
        if not relay.journal_commit():
            return                                # (the older segments stay until a snapshot is written)
        dropped = relay.journal_drop_before(first)
        relay.journal_compact_at(self._trigger())
        if dropped:
            log.info("journal %s: compacted (%d bytes owed to sessions rewritten), %d segments deleted",
                     self.path, self._snapshot_bytes, dropped)

    def stats(self) -> dict | None:
        st = self.b.relay.journal_stats()
        if st is None:
            return None
        return {**st, "path": self.path, "fsync": self.fsync, "max_bytes": self.max_bytes, "torn_at_start": self.torn,
                "sessions_restored": self.restored, "messages_restored": self.restored_messages,
                "held_groups_restored": self.held_restored, "held_messages_restored": self.held_restored_messages,
                "held_lost_at_start": self.held_lost}

    def close(self) -> None:
        self.b.relay.journal_close()
