"""The fastbus wire protocol, version 1: frame layouts shared by the broker
and the clients.  docs/PROTOCOL.md is the normative description.

Every message is a ZeroMQ multipart message whose first frame is one command
byte.  Clients use a DEALER socket, the broker a ROUTER socket (which adds the
peer's routing id in front).  Batches of messages use the batch format of
docs/BATCH_FORMAT.md; subscription operations too (an "ops batch": one
record per operation, the key as topic and one flags byte as payload).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterable
from typing import NamedTuple

from fastbus._core import LEASE_USE, SUBSCRIBE, UNSUBSCRIBE, Batch, decode, encode
from fastbus.errors import ProtocolError

VERSION = 1
#: Every broker takes at least this many subscription operations in one
#: SUB frame (its WELCOME may announce more: limits.max_sub_ops), so a
#: peer that has not heard the limit yet splits at this size.
MIN_SUB_OPS = 1000
DEFAULT_PORT = 6464
DEFAULT_ENDPOINT = f"tcp://127.0.0.1:{DEFAULT_PORT}"

# client -> broker
HELLO = b"H"        # [H, json hello]
SUB = b"S"          # [S, seq u64, ops batch]
PUB = b"P"          # [P, message batch]
PING = b"p"         # [p, token(, LEASE_ASK)]   with LEASE_ASK: grant me a filter lease (peers that said "ack")
STATS = b"Q"        # [Q]
BYE = b"B"          # [B]   both ways: a broker whose WELCOME has "bye" answers it, the peer forgotten
ACK = b"A"          # [A, want seq u64]   WANT up to this seq applied (peers that said "ack" in HELLO)
TAKEN = b"T"        # [T, taken u64]   a resumable session took its stream this far: the broker may forget it
#: Never on the wire: a Redis client's request that the broker's Python
#: side answers, from its connection's C side (csrc/fb_resp_session.h),
#: [r, state u8, request as a RESP array]; answered [r, reply, state u8].
RESP_REQUEST = b"r"
# broker -> client
WELCOME = b"h"      # [h, json]
CONFIRM = b"c"      # [c, seq u64]
DATA = b"D"         # [D, acked seq u64, message batch]
WANT = b"W"         # [W, flags u8, ops batch(, seq u64)]   flags bit 0: reset (a full snapshot);
                    # the seq to peers that acknowledge (ACK)
GAP = b"G"          # [G, lost u64]
TOOK = b"a"         # [a, n u64]   a resumable session's PUB and SUB messages that came, so far (RESENT)
PONG = b"q"         # [q, token, broker instance(, lease u64 µs)]   the lease to peers that acknowledge
STATS_REPLY = b"R"  # [R, json]
KICK = b"X"         # [X, json {"reason": ...}]
FLOW = b"F"         # [F, b"\x00" pause | b"\x01" resume]   to publishers
REFUSED = b"N"      # [N, seq u64, ops batch, json {"reason": ...}]   before the CONFIRM of that seq
NOTICE = b"E"       # [E, json {"dropped": n, "reason": ...}]   to a sender whose records were dropped
#: Never on the wire: what a client's native reader queues when the
#: connection went (csrc/fb_reader.h lost), in order with what it read.
LOST_LOCAL = b"\x00lost"

#: LEASE_USE (from csrc/fb_view.h, where the client applies leases): a peer
#: that filters by the broker's WANT messages counts its view only for this
#: share of a lease the broker granted (clocks may run at slightly
#: different rates on two hosts), from when it sent what the grant answers.
#: The third frame of a PING that asks for a filter lease (its PONG then
#: carries one): only a peer whose filter is in use asks, and only a peer
#: that holds a lease is waited for.
LEASE_ASK = b"lease"
#: The token of a lease ping (a client's or a downstream broker's): then
#: the send time, u64 ns of the sender's monotonic clock, so whoever reads
#: the PONG knows when the lease counts from.
LEASE_TOKEN = b"lease:"

FLOW_PAUSE = b"\x00"
FLOW_RESUME = b"\x01"

WANT_RESET = 1

#: What a resumable session's client keeps until the broker's TOOK covers
#: it, and sends again after a lost connection: the messages whose first
#: frame is one of these commands (the broker counts the same).
RESENT = PUB + SUB
#: The token of the PING a Stream sends first on a connection made again
#: after a loss (the broker answers an unknown connection's PING with KICK
#: "hello required": the session resumes at once, not at the next ping).
RECONNECT_TOKEN = b"again"

#: The largest message a broker takes in one frame unless it was built to
#: take more (BrokerConfig.max_message_bytes; WELCOME's limits say it); a
#: larger one closes the connection.  A client refuses a payload over
#: MAX_PAYLOAD_UNWELCOMED until the broker's WELCOME says its own limits.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: What a message's frames hold beyond its payload and channel: its
#: command, the batch header, the record's lengths.
FRAME_MARGIN = 1024
#: The largest payload any broker's frame carries with any channel (its
#: max_topic, 65535 at most by default).
MAX_PAYLOAD_UNWELCOMED = MAX_MESSAGE_BYTES - 65535 - FRAME_MARGIN

#: A resumable session's id, in HELLO's "session": hex, 32 characters
#: (128 random bits, drawn once per PubSub: new_session_id()).
SESSION_ID_CHARS = 32


def new_session_id() -> str:
    """A random id for a session that may resume on another connection."""
    return os.urandom(SESSION_ID_CHARS // 2).hex()


def valid_session_id(value: object) -> bool:
    return isinstance(value, str) and len(value) == SESSION_ID_CHARS and \
        all(c in "0123456789abcdef" for c in value)


#: A durable subscriber's name (HELLO's "durable"): what a process that
#: takes its place presents; 1 to this many characters, no control ones.
DURABLE_NAME_CHARS = 200


def valid_durable_name(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= DURABLE_NAME_CHARS and value.isprintable()


def durable_session_id(name: str) -> str:
    """The session id of durable subscriber ``name``: the same in every
    process that presents the name (the broker binds it to the CURVE key
    too, where CURVE is on)."""
    return hashlib.sha256(b"fastbus durable\x00" + name.encode()).hexdigest()[:SESSION_ID_CHARS]

# ops batch flags byte
OP_SUBSCRIBE = 0x01
OP_PREFIX = 0x02
OP_GLOB = 0x04          # the key is a Redis glob (never with OP_PREFIX)
OP_QUEUE = 0x08         # a queue group member's: the group's name follows the flags byte
OP_HOLD = 0x10          # with OP_QUEUE: the group is held (no membership); u32 expiry ms, then the name
OP_BIND = 0x20          # with OP_HOLD: the key is bound to a held group; u32 life ms, u32 capacity,
                        # u16 length and the group's channel, then the name
#: The third field of an op ``(op, key, prefix)`` for a glob: neither exact
#: (False) nor prefix (True).  Only a subscriber's SUB and the REFUSED
#: naming it carry globs; brokers and publishers' filters see prefixes.
GLOB = 2
#: A queue group's name: 1 to this many bytes.
MAX_QUEUE_NAME = 255


class Queue(NamedTuple):
    """The third field of an op ``(op, key, prefix)`` of a queue group
    member (``subscribe(channel, queue=name)``): of the group's members,
    each message goes to one.  ``glob``: the key is a Redis glob (a
    ``psubscribe``), else a channel.  Only a subscriber's SUB (and the
    REFUSED naming it) carries these.

    ``hold`` (milliseconds, of a channel only): not a member's op but the
    declaration that the group is held (SUBSCRIBE): the broker keeps what
    no member can take, for a member to come, at most that long (and
    refreshes the declaration's own life by as much); or that it is no
    longer (UNSUBSCRIBE: what it kept is dropped).  docs/PROTOCOL.md,
    "Held groups".

    ``into`` (with ``hold``): not a declaration but a binding: what is
    published on the op's key goes to channel ``into``'s held group
    ``name`` too, as if published on ``into``, for ``hold`` ms (bound
    again: renewed; UNSUBSCRIBE: unbound); of what comes so, its backlog
    keeps at most ``capacity`` (0: no count bound).  docs/PROTOCOL.md,
    "Bound channels"."""

    name: bytes
    glob: bool
    hold: int = 0
    into: bytes | None = None
    capacity: int = 0

#: The :status of the broker's answer to a request to a held group (its
#: :hold header; csrc/fb_batch.h): a member has it, kept for one, not kept.
STATUS_DELIVERED = "200"
STATUS_KEPT = "202"
STATUS_FULL = "507"
#: A held group's expiry: at most this many milliseconds (a day).
MAX_HOLD_MS = 86_400_000
_HOLD_MS = struct.Struct("!I")
_BIND = struct.Struct("!IIH")      # a binding's life (ms), capacity, the group's channel's length

U64 = struct.Struct("<Q")


def new_instance_id() -> bytes:
    """A random id for one run of a broker or client (detects restarts)."""
    return os.urandom(8).hex().encode()


def pack_u64(n: int) -> bytes:
    return U64.pack(n)


def unpack_u64(frame) -> int:
    b = frame if isinstance(frame, (bytes, bytearray, memoryview)) else frame.buffer
    if len(b) != 8:
        raise ProtocolError(f"expected an 8-byte integer frame, got {len(b)} bytes")
    return U64.unpack(b)[0]


def encode_ops(ops: Iterable[tuple[int, bytes, bool | int]]) -> Batch:
    """Subscription operations ``(op, key, prefix)`` as an ops batch
    (``prefix``: False, True or GLOB)."""
    return encode((key, _op_payload(op, prefix)) for op, key, prefix in ops)


def _op_payload(op: int, prefix) -> bytes:
    sub = OP_SUBSCRIBE if op == SUBSCRIBE else 0
    if isinstance(prefix, Queue):
        if prefix.into is not None:
            return (bytes((sub | OP_QUEUE | OP_HOLD | OP_BIND,)) +
                    _BIND.pack(prefix.hold, prefix.capacity, len(prefix.into)) + prefix.into + prefix.name)
        if prefix.hold:
            return bytes((sub | OP_QUEUE | OP_HOLD,)) + _HOLD_MS.pack(prefix.hold) + prefix.name
        return bytes((sub | OP_QUEUE | (OP_GLOB if prefix.glob else 0),)) + prefix.name
    return bytes((sub | (OP_GLOB if prefix == GLOB else OP_PREFIX if prefix else 0),))


def decode_ops(data, *, max_key: int = 0, max_ops: int = 0) -> list[tuple[int, bytes, bool | int]]:
    """An ops batch back into ``(op, key, prefix)`` (``prefix``: False, True
    or GLOB); ProtocolError if invalid."""
    try:
        records = decode(data, max_topic=max_key,
                         max_payload=1 + _BIND.size + (max_key or 0xFFFF) + MAX_QUEUE_NAME, max_records=max_ops)
    except ValueError as exc:
        raise ProtocolError(f"bad subscription batch: {exc}") from exc
    ops = []
    for key, flags in records:
        f = flags[0] if flags else 0xFF
        if f & ~(OP_SUBSCRIBE | OP_PREFIX | OP_GLOB | OP_QUEUE | OP_HOLD | OP_BIND) or \
                (f & OP_PREFIX and f & (OP_GLOB | OP_QUEUE)) or \
                (f & OP_HOLD and (f & (OP_GLOB | OP_PREFIX) or not f & OP_QUEUE)) or \
                (f & OP_BIND and not f & OP_HOLD):
            raise ProtocolError(f"bad subscription flags {flags[:1]!r}")
        if f & OP_BIND:
            if len(flags) < 1 + _BIND.size:
                raise ProtocolError("a binding without its life, capacity and channel")
            life, capacity, n = _BIND.unpack_from(flags, 1)
            o = 1 + _BIND.size
            name = bytes(flags[o + n:])
            if not 0 < life <= MAX_HOLD_MS or not 0 < n <= len(flags) - o or not 0 < len(name) <= MAX_QUEUE_NAME \
                    or (max_key and n > max_key):
                raise ProtocolError("a binding's life must be 1 to {} ms, and its channel and group name given"
                                    .format(MAX_HOLD_MS))
            kind = Queue(name, False, life, bytes(flags[o:o + n]), capacity)
        elif f & OP_HOLD:
            if not 1 + _HOLD_MS.size < len(flags) <= 1 + _HOLD_MS.size + MAX_QUEUE_NAME:
                raise ProtocolError("a held group's declaration without its expiry and name")
            hold = _HOLD_MS.unpack_from(flags, 1)[0]
            if not 0 < hold <= MAX_HOLD_MS:
                raise ProtocolError(f"a held group's expiry must be 1 to {MAX_HOLD_MS} ms, not {hold}")
            kind = Queue(bytes(flags[1 + _HOLD_MS.size:]), False, hold)
        elif f & OP_QUEUE:
            if not 2 <= len(flags) <= 1 + MAX_QUEUE_NAME:
                raise ProtocolError(f"a queue group subscription needs the group's name (1 to {MAX_QUEUE_NAME} bytes)")
            kind = Queue(bytes(flags[1:]), bool(f & OP_GLOB))
        elif len(flags) != 1:
            raise ProtocolError(f"bad subscription flags {flags!r}")
        else:
            kind = GLOB if f & OP_GLOB else bool(f & OP_PREFIX)
        ops.append((SUBSCRIBE if f & OP_SUBSCRIBE else UNSUBSCRIBE, key, kind))
    return ops


def dump_json(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def load_json(frame, limit: int = 65536) -> dict:
    b = frame if isinstance(frame, (bytes, bytearray)) else bytes(frame.buffer if hasattr(frame, "buffer") else frame)
    if len(b) > limit:
        raise ProtocolError(f"control message of {len(b)} bytes is over the {limit}-byte limit")
    try:
        obj = json.loads(b)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"bad JSON in control message: {exc}") from exc
    if not isinstance(obj, dict):
        raise ProtocolError("control message must be a JSON object")
    return obj
