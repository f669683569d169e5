"""docs/ARCHITECTURE.md names, for each step of a message's and a
subscription's path, the file and function it happens in
(`` `path:Name` `` or `` `path:Class.method` ``).  Every one must exist,
so a rename that leaves the page behind fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
REF = re.compile(r"`((?:fastbus|csrc)/[\w/]+\.(?:py|pyx|pxi|c)):([\w.]+)`")


def _defines(text: str, suffix: str, name: str) -> bool:
    """Is ``name`` defined (a function, method or class) in this file?"""
    n = re.escape(name)
    if suffix == ".c":
        # A function definition: a declarator at the start of a line, its
        # parameters (over several lines, perhaps), then the body's "{".
        return re.search(rf"^[A-Za-z_][\w \t\*]*\b{n}\([^;{{}}]*\)\s*\{{", text, re.M) is not None
    return re.search(rf"^\s*(?:async\s+)?(?:def|cdef|cpdef|class|cdef class)\s+(?:[\w\*\s]+\s)?{n}\s*[(:]",
                     text, re.M) is not None


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
