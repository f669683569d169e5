"""The wire protocol's command bytes and flag bits are written once for C
and Cython (csrc/fb_protocol.h) and once for Python (fastbus/protocol.py):
these tests hold the two to each other, through what the extension was
built with (``fastbus._core.WIRE_HEADER``), and keep the command bytes out
of the broker's and the engine's sources as literals (issue 48 item 1: the
relay spelled 19 of them itself)."""

from __future__ import annotations

import re
from pathlib import Path

import fastbus.protocol as P
from fastbus import _core

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "csrc" / "fb_protocol.h"

#: fastbus/protocol.py's names of the protocol's commands.
COMMANDS = ("HELLO", "SUB", "PUB", "PING", "STATS", "BYE", "ACK", "TAKEN", "RESP_REQUEST",
            "WELCOME", "CONFIRM", "DATA", "WANT", "GAP", "TOOK", "PONG", "STATS_REPLY", "KICK",
            "FLOW", "REFUSED", "NOTICE")
FLAGS = ("WANT_RESET", "OP_SUBSCRIBE", "OP_PREFIX", "OP_GLOB", "OP_QUEUE", "OP_HOLD", "OP_BIND")


def test_every_command_byte_is_the_same_in_the_header_and_in_protocol_py():
    for name in COMMANDS + ("FLOW_PAUSE", "FLOW_RESUME"):
        byte, string = _core.WIRE_HEADER[name]
        assert byte == string == getattr(P, name), name
    for name in FLAGS:
        assert _core.WIRE_HEADER[name] == getattr(P, name), name
    assert _core.WIRE_HEADER["LEASE_ASK"] == P.LEASE_ASK
    assert set(_core.WIRE_HEADER) == set(COMMANDS + FLAGS + ("FLOW_PAUSE", "FLOW_RESUME", "LEASE_ASK"))


def test_the_commands_are_distinct_and_protocol_py_has_no_other():
    values = [getattr(P, n) for n in COMMANDS]
    assert len(set(values)) == len(values)
    # A one-byte constant protocol.py adds is a command (or FLOW's byte):
    # it needs its place in the header and in this test.
    one_byte = {n for n, v in vars(P).items() if n.isupper() and isinstance(v, bytes) and len(v) == 1}
    assert one_byte == set(COMMANDS) | {"FLOW_PAUSE", "FLOW_RESUME"}


def test_every_define_of_the_header_is_exported_for_the_check():
    """A value added to the header without a place in WIRE_HEADER would be
    checked against nothing."""
    text = HEADER.read_text()
    defined = set(re.findall(r"^#define (FB_\w+)\s", text, re.M)) - {"FB_PROTOCOL_H"}
    expected = set()
    for name in COMMANDS:
        expected |= {f"FB_CMD_{name}", f"FB_CMD_{name}_S"}
    expected |= {"FB_FLOW_PAUSE", "FB_FLOW_PAUSE_S", "FB_FLOW_RESUME", "FB_FLOW_RESUME_S", "FB_WANT_RESET",
                 "FB_LEASE_ASK_S", "FB_LEASE_ASK_LEN"}
    expected |= {f"FB_OP_F_{n[3:]}" for n in FLAGS if n.startswith("OP_")}
    assert defined == expected


# A command byte (or the lease ask) as a literal: b"D" / b'W' in Cython, 'D' as a case or a
# one-byte frame "P", 1 in C.
_PYX_LITERAL = re.compile(r"""\bb(["'])[A-Za-z]\1|b["']lease["']""")
_C_LITERAL = re.compile(r"""case '[A-Za-z]':|\("[A-Za-z]", 1\)|, "[A-Za-z]", 1\)""")


def test_the_broker_and_the_engine_spell_no_command_as_a_literal():
    """The broker's data plane and the client's engine (Cython), and every
    C file, take command bytes from fb_protocol.h (Python code uses
    fastbus.protocol's names)."""
    found = []
    cython = sorted((ROOT / "fastbus" / "broker").glob("*.p[yx][xi]")) + [ROOT / "fastbus" / "client" / "_engine.pyx"]
    assert len(cython) > 3
    for path in cython:
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if _PYX_LITERAL.search(line):
                found.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    for path in sorted((ROOT / "csrc").glob("*.c")):
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if _C_LITERAL.search(line):
                found.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert not found, "command bytes spelled out (use fb_protocol.h / fastbus.protocol):\n" + "\n".join(found)
