"""The Python snippets of README.md and docs/, in one place for the tests
that read them: tests/test_types.py type-checks the README's (mypy
--strict), tests/test_snippets.py runs every one but the Spark ones, and
tests/test_spark.py runs those in its Spark session.

A snippet may read names it does not define, as a reader's code would (a
channel, a Spark session): GIVEN declares them, with the types a reader
would have and values that run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

#: The marker that leaves the README snippet right after it out of the type
#: check (partial snippets only); it is still run.
SKIP = "<!-- mypy: skip -->"

PRELUDE_IMPORTS = """\
from typing import Any

import prometheus_client

import fastbus
"""
#: Names the snippets read without binding them, declared before each
#: snippet that reads one.  (The Spark names are None here: the type check
#: cannot see pyspark; tests/test_spark.py gives real ones.)
GIVEN = {
    "channel": 'channel: str = "news"',
    "message": 'message: bytes = b"hello"',
    "channels": 'channels: list[str] = ["news", "sport"]',
    "topics": 'topics: list[bytes] = [b"market.NYSE.00042.trades"]',
    "url": 'url: str = "redis://127.0.0.1:6379/0"',
    "spark": "spark: Any = None          # a pyspark.sql.SparkSession (pyspark is not in the test extra)",
    "totals": "totals: Any = None         # a streaming DataFrame",
    "counts": "counts: Any = None         # a streaming DataFrame",
    "df": "df: Any = None             # a DataFrame",
}
SPARK_NAMES = ("spark", "totals", "counts", "df")


def reads(code: str) -> set[str]:
    """The names ``code`` reads and never binds."""
    tree = ast.parse(code)
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return read - bound


def prelude(code: str, leave_out: tuple[str, ...] = ()) -> str:
    """The imports, and the GIVEN names the snippet reads but never binds
    (less ``leave_out``)."""
    free = reads(code)
    return PRELUDE_IMPORTS + "".join(GIVEN[n] + "\n" for n in GIVEN if n in free and n not in leave_out)


def python_snippets(path: Path = README, with_skipped: bool = False) -> list[tuple[int, str]]:
    """``(line, code)`` of each ```python block of ``path`` (less those
    right after a SKIP marker, unless ``with_skipped``)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            if with_skipped or not (k >= 0 and lines[k].strip() == SKIP):
                out.append((start + 1, "\n".join(lines[start:j]) + "\n"))
            i = j
        i += 1
    return out


def readme_snippets() -> list[tuple[int, str]]:
    """The README's snippets the type check reads."""
    return python_snippets(README)


def all_snippets() -> list[tuple[str, str]]:
    """``(where, code)`` of every snippet of README.md and docs/, ``where``
    as ``README.md:87``."""
    return [(f"{doc.name}:{line}", code) for doc in DOCS for line, code in python_snippets(doc, with_skipped=True)]


def is_spark(code: str) -> bool:
    """The snippet reads a Spark name it does not bind (a session, a DataFrame)."""
    return bool(reads(code) & set(SPARK_NAMES))


def for_this_machine(code: str, redis_url: str, scratch: Path) -> str:
    """The snippet pointed at this machine's Redis and scratch directory."""
    code = re.sub(r"redis://[\w.\-]+:\d+(?:/\d+)?", redis_url, code)
    return code.replace('"/data/', f'"{scratch}/data/')
