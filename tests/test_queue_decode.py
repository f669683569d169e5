"""fastbus.queue's item decoder (C, no server): every header field, the
payload, and a clear error for what is not an item; also run under ASan."""

from __future__ import annotations

import struct

import pytest
from fastbus.queue._layout import queue_decode

from fastbus.queue import Message


def item(prior: int, mid: int, created_ms: int, payload: bytes) -> bytes:
    return struct.pack(">BIQQ", 1, prior, mid, created_ms) + payload


def test_fields_and_payloads_as_put():
    items = [item(0, 1, 1_795_000_000_123, b""), item(7, 2**53 + 1, 5, b"\x00\xff" * 1000)]
    owner = object()
    a, b = queue_decode(items, owner)
    assert (a.id, a.payload, a.created_at, a.deliveries) == (1, b"", 1_795_000_000.123, 1)
    assert (b.id, b.payload, b.deliveries, b._key) == (2**53 + 1, b"\x00\xff" * 1000, 8, struct.pack(">Q", 2**53 + 1))
    assert a._consumer is owner and isinstance(a, Message)
    (peeked,) = queue_decode(items[1:])                 # looked at, not delivered
    assert peeked.deliveries == 7 and peeked._consumer is None
    assert queue_decode([]) == []


def test_what_is_not_an_item_is_refused():
    good = item(0, 1, 1, b"x")
    for bad in (b"", good[:20], b"\x02" + good[1:]):
        with pytest.raises(ValueError, match="not a fastbus v1 item"):
            queue_decode([good, bad])
    with pytest.raises(TypeError, match="not bytes"):
        queue_decode([good, "text"])
