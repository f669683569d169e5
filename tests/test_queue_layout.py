"""The queue item and topic value layouts have one source of truth, the Lua
scripts that write them (fastbus/queue/lua/lib.lua): the core's decoder
(fastbus/core/queue.pxi) and fastbus.queue._lua must agree with it."""

from __future__ import annotations

import re
import struct

from conftest import REPO

from fastbus.queue._layout import QUEUE_ITEM_LAYOUT, queue_decode, topic_decode
from fastbus.queue import _lua

LIB = (REPO / "fastbus" / "queue" / "lua" / "lib.lua").read_text()


def lua_format(pattern: str) -> str:
    """The struct format of the one `struct.pack(<fmt>, ...)` the pattern picks."""
    found = set(re.findall(pattern, LIB))
    assert len(found) == 1, found
    return found.pop()


def lua_size(fmt: str) -> int:
    """Bytes a Lua struct format packs (the codes the scripts use: B, and In
    for an n-byte integer; '>' is the byte order)."""
    codes = re.findall(r"([BI])(\d*)", fmt.lstrip(">"))
    assert "".join(c + n for c, n in codes) == fmt.lstrip(">"), fmt
    return sum(1 if c == "B" else int(n) for c, n in codes)


def test_the_item_header_is_what_the_scripts_pack():
    item = lua_format(r"struct\.pack\('(>BI4I8I8)', 1, 0,")          # PUT: version 1, prior 0, id, created
    assert lua_size(item) == QUEUE_ITEM_LAYOUT["header"] == _lua.QUEUE_HEADER
    assert f"A work-queue item is a {QUEUE_ITEM_LAYOUT['header']}-byte header" in LIB
    assert QUEUE_ITEM_LAYOUT["version"] == 1
    # Lua's struct.unpack offsets are 1-based: the id at 6, the prior deliveries at 2
    assert "struct.unpack('>I8', item, 6)" in LIB and QUEUE_ITEM_LAYOUT["id"] == 5
    assert "struct.unpack('>I4', item, 2)" in LIB and QUEUE_ITEM_LAYOUT["prior"] == 1
    assert QUEUE_ITEM_LAYOUT["created"] == 1 + 4 + 8


def test_the_topic_value_header_is_the_stamp_the_scripts_pack():
    stamp = lua_format(r"local stamp = struct\.pack\('(>I8)', now\)")
    assert lua_size(stamp) == QUEUE_ITEM_LAYOUT["topic_value_header"]


def test_items_packed_as_the_scripts_do_decode():
    item = struct.pack(">BIQQ", 1, 2, 77, 1_700_000_000_123) + b"payload"
    (m,) = queue_decode([item])
    assert (m.id, m.deliveries, m.created_at, m.payload) == (77, 2, 1_700_000_000.123, b"payload")
    assert m._key == struct.pack(">Q", 77)
    (t,) = topic_decode([None, struct.pack(">Q", 1_700_000_000_123) + b"x"], 10)
    assert (t.id, t.created_at, t.payload) == (11, 1_700_000_000.123, b"x")
