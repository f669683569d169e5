"""The Lua scripts behind :mod:`fastbus.queue` and :mod:`fastbus.monitor`,
read from the ``.lua`` files of ``fastbus/queue/lua/`` (package data) and
linked: each script gets, before its own text, only the paragraphs of its
libraries that it uses.

The files: ``lib.lua`` (the functions the queue scripts share; its header
describes a queue's keys and items), ``marks.lua`` (batch markers),
``inbox_lib.lua`` (the inbox scripts' functions; an inbox's keys and
messages), ``monitor_lib.lua`` (the monitoring scripts' functions), and one
file per script, named after it (``put.lua`` is ``SCRIPTS["PUT"]``; its
header comment gives its KEYS, ARGV and reply).  A file's leading comment
lines are its header and are not sent to the server.

:data:`SCRIPTS` (name -> source, for ``register_script``/``SCRIPT LOAD``) is
built once, at import, from the table :data:`_GROUPS`: nothing else adds to it.
"""

from __future__ import annotations

import re
from importlib.resources import files

__all__ = ["INBOX_HEADER", "MARK_TTL_MS", "QUEUE_HEADER", "SCRIPTS", "link", "load"]

QUEUE_HEADER = 21       # bytes before the payload of a work-queue item (lib.lua)
INBOX_HEADER = 19       # bytes before the sender of an inbox message (inbox_lib.lua)

# Which scripts there are, and the libraries (in order) each group links with.
_GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "queue": (("lib", "marks"), (
        "PUT", "RESOLVE", "REGISTER", "HEARTBEAT", "GET", "GET1", "ACK1", "SETTLE", "RELEASE", "CLEAN",
        "STATS", "RETURN_FAILED", "PURGE",
        "PUBLISH", "SUBSCRIBE", "UNSUBSCRIBE", "READ", "RETAINED", "POSITION", "ACK_UPTO", "TOPIC_INFO",
        "COMMIT_STAGED")),
    "inbox": (("lib", "inbox_lib"), (
        "INBOX_CREATE", "INBOX_JOIN", "INBOX_LEAVE", "INBOX_SEND", "INBOX_FETCH", "INBOX_ACK",
        "INBOX_MEMBERS", "INBOX_HINT")),
    "monitor": (("lib", "monitor_lib"), ("MONITOR_QUEUE", "MONITOR_TOPIC", "MONITOR_INBOX")),
}


def load(stem: str) -> str:
    """The text of ``lua/<stem>.lua`` without its header (the leading
    comment lines, up to the first blank or code line)."""
    text = files("fastbus.queue").joinpath("lua", f"{stem}.lua").read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].lstrip().startswith("--"):
        i += 1
    return "".join(lines[i:]).lstrip("\n")


def _paragraphs(lib: str) -> list[tuple[set[str], set[str], str]]:
    """A library as (names defined, names used, text) per paragraph (blank-line
    separated; a paragraph of comments only goes with the next one)."""
    out, pending = [], ""
    for para in re.split(r"\n\s*\n", lib.strip("\n")):
        code = "\n".join(line.split("--", 1)[0] for line in para.splitlines())
        defined = set(re.findall(r"^local function (\w+)", code, re.M))
        for names in re.findall(r"^local ((?:\w+)(?:\s*,\s*\w+)*)", code, re.M):
            defined.update(n.strip() for n in names.split(",") if n.strip() != "function")
        defined.discard("function")
        if not defined:
            pending += para + "\n\n"
            continue
        out.append((defined, set(re.findall(r"\b[A-Za-z_]\w*\b", code)) - defined, pending + para + "\n"))
        pending = ""
    return out


def link(body: str, lib: str) -> str:
    """``body`` after the paragraphs of ``lib`` it needs, directly or
    through one another, in their order."""
    paras = _paragraphs(lib)
    code = "\n".join(line.split("--", 1)[0] for line in body.splitlines())
    want = set(re.findall(r"\b[A-Za-z_]\w*\b", code))
    keep = [False] * len(paras)
    changed = True
    while changed:
        changed = False
        for i, (defined, used, _text) in enumerate(paras):
            if not keep[i] and defined & want:
                keep[i] = changed = True
                want |= used
    return "".join(text for k, (_d, _u, text) in zip(keep, paras) if k) + body


def _build() -> dict[str, str]:
    scripts: dict[str, str] = {}
    for libraries, names in _GROUPS.values():
        lib = "\n\n".join(load(stem).strip("\n") for stem in libraries)
        for name in names:
            scripts[name] = link(load(name.lower()), lib)
    return scripts


def _mark_ttl_ms() -> int:
    m = re.search(r"^local MARK_TTL = (\d+)\s*$", load("marks"), re.M)
    if m is None:                       # pragma: no cover - the file ships with the package
        raise RuntimeError("fastbus/queue/lua/marks.lua does not set MARK_TTL")
    return int(m.group(1))


#: Script name -> its linked source.
SCRIPTS: dict[str, str] = _build()
#: How long a batch marker lives on the server (ms), as marks.lua sets it.
MARK_TTL_MS: int = _mark_ttl_ms()
