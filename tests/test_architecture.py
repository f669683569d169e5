"""docs/ARCHITECTURE.md names, for each step of a message's and a
subscription's path, the file and function it happens in
(`` `path:Name` `` or `` `path:Class.method` ``), and, in its last
section, chains of calls between them (`` `a` → `b` ``: a's body calls
b).  Every name must exist and every call be made, so a rename or a move
that leaves the page behind fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
REF = re.compile(r"`((?:fastbus|csrc)/[\w/]+\.(?:py|pyx|pxd|pxi|c)):([\w.]+)`")
#: A chain line of the last section: refs joined by arrows.
CHAIN = re.compile(r"^- (`[^`]+`(?: → `[^`]+`)+)\s*$", re.M)


def _defines(text: str, suffix: str, name: str) -> bool:
    """Is ``name`` defined (a function, method or class) in this file?"""
    n = re.escape(name)
    if suffix == ".c":
        # A function definition: a declarator at the start of a line, its
        # parameters (over several lines, perhaps), then the body's "{".
        return re.search(rf"^[A-Za-z_][\w \t\*]*\b{n}\([^;{{}}]*\)\s*\{{", text, re.M) is not None
    return re.search(rf"^\s*(?:async\s+)?(?:def|cdef|cpdef|class|cdef class)\s+(?:[\w\*\s]+\s)?{n}\s*[(:]",
                     text, re.M) is not None


def _body(text: str, suffix: str, qual: str) -> str | None:
    """The body of function ``qual`` (``Class.method`` for a method) in a
    file's text, without its comments and docstrings; None if not there."""
    if suffix == ".c":
        m = re.search(rf"^[A-Za-z_][\w \t\*]*\b{re.escape(qual)}\([^;{{}}]*\)\s*\{{", text, re.M)
        if m is None:
            return None
        i, depth = m.end(), 1
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        return re.sub(r"/\*.*?\*/|//[^\n]*", "", text[m.end():i], flags=re.S)
    lines = text.splitlines()
    start, indent = 0, -1
    for part in qual.split("."):
        head = re.compile(rf"^(\s*)(?:async\s+)?(?:def|cdef|cpdef|class|cdef class)\s+(?:[\w\*\s]+\s)?"
                          rf"{re.escape(part)}\s*[(:]")
        for j in range(start, len(lines)):
            m = head.match(lines[j])
            if m and len(m.group(1)) > indent:
                start, indent = j + 1, len(m.group(1))
                break
        else:
            return None
    body = []
    for line in lines[start:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    code = re.sub(r'"""(?:.|\n)*?"""', "", "\n".join(body))
    return re.sub(r"#[^\n]*", "", code)


def _calls(body: str, name: str) -> bool:
    """Does this body call ``name`` (or hand it on as a bound method)?"""
    n = re.escape(name)
    return re.search(rf"\b{n}\s*\(|\.{n}\b", body) is not None


def _chains() -> list[list[tuple[str, str]]]:
    return [REF.findall(line) for line in CHAIN.findall(DOC.read_text())]


def _refs() -> list[tuple[str, str]]:
    return REF.findall(DOC.read_text())


def test_the_page_names_the_steps():
    refs = _refs()
    assert len(refs) >= 40, f"only {len(refs)} file:function references in {DOC.name}"
    files = {f for f, _ in refs}
    for needed in ("fastbus/broker/_relay.pyx", "csrc/fb_router.c", "fastbus/client/_pubsub.py",
                   "fastbus/broker/interest.py", "fastbus/broker/settle.py"):
        assert needed in files


def test_every_named_file_and_function_exists():
    missing = []
    for path, qual in _refs():
        f = ROOT / path
        if not f.is_file():
            missing.append(f"{path} (no such file)")
            continue
        text = f.read_text()
        for name in qual.split("."):
            if not _defines(text, f.suffix, name):
                missing.append(f"{path}:{qual} ({name} is not defined there)")
                break
    assert not missing, "docs/ARCHITECTURE.md names what does not exist:\n" + "\n".join(missing)


def test_the_check_fails_for_a_name_that_is_not_there():
    text = (ROOT / "fastbus/broker/_relay.pyx").read_text()
    assert _defines(text, ".pyx", "wait") and not _defines(text, ".pyx", "wait_for_nothing")
    c = (ROOT / "csrc/fb_router.c").read_text()
    assert _defines(c, ".c", "fb_router_route") and not _defines(c, ".c", "fb_router_teleport")


def test_each_named_call_is_made():
    chains = _chains()
    assert len(chains) >= 20, f"only {len(chains)} call chains in {DOC.name}"
    wrong = []
    for chain in chains:
        for (path, qual), (callee_path, callee) in zip(chain, chain[1:]):
            f = ROOT / path
            body = _body(f.read_text(), f.suffix, qual) if f.is_file() else None
            if body is None:
                wrong.append(f"{path}:{qual} (no such function)")
            elif not _calls(body, callee.split(".")[-1]):
                wrong.append(f"{path}:{qual} does not call {callee_path}:{callee}")
    assert not wrong, "docs/ARCHITECTURE.md says calls are made that are not:\n" + "\n".join(wrong)


def test_the_call_check_fails_for_a_call_that_is_not_made():
    relay = (ROOT / "fastbus/broker/_relay.pyx").read_text()
    run = _body(relay, ".pyx", "Relay._run")
    assert run is not None and _calls(run, "_read") and not _calls(run, "_route_nowhere")
    router = (ROOT / "csrc/fb_router.c").read_text()
    route = _body(router, ".c", "fb_router_route")
    assert route is not None and _calls(route, "deliver") and not _calls(route, "fb_trie_match_batch")
    # A name said only in a comment or a docstring is not a call.
    assert not _calls(_body('def f():\n    """g() does it"""\n    # g()\n    return 1\n', ".py", "f"), "g")



#: Past this, a file says at its top why it is one file (or is split).
LONG = 700


def test_every_long_file_says_why_it_is_one():
    sources = [p for p in (ROOT / "csrc").rglob("*.[ch]") if "build" not in p.relative_to(ROOT).parts]
    for top, patterns in (("fastbus", ("*.py", "*.pyx", "*.pxi", "*.pxd")), ("tests", ("*.py",)),
                          ("bench", ("*.py",))):
        for pattern in patterns:
            sources += (ROOT / top).rglob(pattern)
    assert len(sources) > 100
    silent = []
    for p in sources:
        text = p.read_text()
        if text.count("\n") > LONG and f"over {LONG} lines" not in text[:4000].lower():
            silent.append(f"{p.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not silent, (f"files over {LONG} lines that do not say at their top why they are one file "
                        f"(a sentence with 'over {LONG} lines'), or split them:\n" + "\n".join(silent))
