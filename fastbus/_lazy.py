"""A package's public names imported on first use (PEP 562), so that
importing one of its light submodules does not import them all.

Why: ``fastbus queue ...``, ``fastbus monitor ...`` and ``fastbus broker``
build one argument parser from every command group's module, and each
group lives in its package (``fastbus.queue.cli``, ``fastbus.monitor.cli``).
With eager package ``__init__``s, every command paid for redis-py, asyncio
and the Lua scripts before parsing its arguments: a broker's start cost
0.6 CPU-seconds, most of it imports its command never used.

The names are written once, as ordinary imports inside the package's
``if TYPE_CHECKING:`` block (type checkers and editors read them there);
:func:`attach` reads that block from the package's source when a name is
first asked for, and imports the module that defines it.
tests/test_modules.py checks that every name of each lazy package's
``__all__`` resolves."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from typing import Any


def exports_of(source_file: str) -> dict[str, str]:
    """name -> module, for each ``from MODULE import NAME [as ALIAS]`` of the
    file's top-level ``if TYPE_CHECKING:`` block."""
    with open(source_file, encoding="utf-8") as f:
        tree = ast.parse(f.read(), source_file)
    table: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
                    for alias in stmt.names:
                        table[alias.asname or alias.name] = stmt.module
    return table


def attach(package: str, source_file: str, namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` (whose ``__init__.py`` is
    ``source_file`` and whose globals are ``namespace``): a name of its
    ``TYPE_CHECKING`` imports is imported from its module and kept in the
    package, so each is looked up once; any other name raises
    AttributeError (which is also how ``from package import submodule``
    falls back to importing the submodule)."""
    table: dict[str, str] | None = None

    def __getattr__(name: str) -> Any:
        nonlocal table
        if table is None:
            table = exports_of(source_file)
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
