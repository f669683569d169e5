"""How the package's modules hang together (issues 17 and 18): every public
exception is defined in fastbus.errors and is a FastbusError; no module
imports another module's private names."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import fastbus
import fastbus.errors
from fastbus.errors import FastbusError

SOURCE = Path(__file__).resolve().parents[1] / "fastbus"

#: Importing a private name of another module, allowed, and why (none now).
ALLOWED_PRIVATE_IMPORTS: dict[tuple[str, str], str] = {}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _sources() -> list[Path]:
    files = sorted(SOURCE.rglob("*.py"))
    assert len(files) > 40, files          # the tree is where this test thinks it is
    return files


def _private_owner(module: str) -> str | None:
    """The package whose private module ``module`` is (or is inside), or None
    for a public one: fastbus.client for fastbus.client._session."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            return ".".join(parts[:i])
    return None


def private_imports(path: Path, module: str | None = None) -> list[str]:
    """``from fastbus.X import _name``, ``fastbus.X._name`` and ``from
    fastbus.X._y import name`` in the module at ``path``, where the module
    is not X itself nor inside package X (a package may use its own
    private submodules and names: ``from ._session import Session``,
    ``from fastbus.queue import _lua`` in fastbus.queue; and every module of
    fastbus may use fastbus's own, such as fastbus._core).  Another
    package's private module is not a shared API (issue 24)."""
    module = module or _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not _inside(target, "fastbus"):
                continue
            owner = _private_owner(target)
            if owner is not None and not _inside(module, owner):
                found.append(f"{module} (line {node.lineno}): from {target} (a private module of {owner})")
                continue
            for alias in node.names:
                if _private(alias.name) and not _inside(module, target):
                    found.append(f"{module} (line {node.lineno}): from {target} import {alias.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id == "fastbus":
                owner = ".".join(["fastbus", *reversed(chain[1:])])
                if not _inside(module, owner):
                    found.append(f"{module} (line {node.lineno}): {owner}.{node.attr}")
    return found


def test_the_private_import_check_sees_what_it_should(tmp_path):
    """The checker itself, on a module written for it (as if fastbus.probe)."""
    probe = tmp_path / "probe.py"
    probe.write_text("from fastbus.cli import _positive\nfrom fastbus.client._session import Session\n"
                     "from fastbus import _messages\nimport fastbus.queue\nx = fastbus.queue._lua.load\n"
                     "from ._twins import twin_of\nfrom .client import _client\n")
    assert private_imports(probe, "fastbus.probe") == [
        "fastbus.probe (line 1): from fastbus.cli import _positive",
        "fastbus.probe (line 2): from fastbus.client._session (a private module of fastbus.client)",
        "fastbus.probe (line 7): from fastbus.client import _client",
        "fastbus.probe (line 5): fastbus.queue._lua"]
    inside = tmp_path / "inside.py"
    inside.write_text("from fastbus.client._session import Session\nfrom fastbus._core import Router\n")
    assert private_imports(inside, "fastbus.client.inside") == []


def test_no_module_imports_another_modules_private_names():
    found = [f for path in _sources() for f in private_imports(path)
             if not any(f.startswith(f"{m} (") and f.endswith(n) for m, n in ALLOWED_PRIVATE_IMPORTS)]
    assert not found, "\n".join(found)


def _public_modules() -> list:
    modules = []
    for info in pkgutil.walk_packages(fastbus.__path__, "fastbus."):
        if info.name.endswith("__main__"):
            continue                            # runs the command line
        try:
            modules.append(importlib.import_module(info.name))
        except ImportError as exc:               # fastbus.spark without pyspark
            if "pyspark" not in str(exc):
                raise
    return [fastbus, *modules]


def test_every_public_exception_is_a_fastbus_error_defined_in_fastbus_errors():
    """Every exception class a user can reach (a public name of any module)
    subclasses FastbusError, is fastbus.errors.<its name> and is listed in
    fastbus.errors.__all__.  The Redis server errors are defined in
    fastbus.redis.errors (they need redis-py's classes among their bases,
    and importing fastbus.errors must not import redis-py) and handed out by
    fastbus.errors as its own: their __module__ says fastbus.errors."""
    seen: dict[type, str] = {}
    for module in _public_modules():
        for name, obj in vars(module).items():
            if _private(name) or not (inspect.isclass(obj) and issubclass(obj, BaseException)):
                continue
            if not obj.__module__.startswith("fastbus"):
                continue                        # a built-in or redis-py's, imported
            seen.setdefault(obj, f"{module.__name__}.{name}")
    assert len(seen) > 30, seen
    wrong = [f"{where}: {cls.__module__}.{cls.__qualname__}" for cls, where in seen.items()
             if not issubclass(cls, FastbusError) or cls.__module__ != "fastbus.errors"
             or getattr(fastbus.errors, cls.__name__, None) is not cls
             or cls.__name__ not in fastbus.errors.__all__]
    assert not wrong, "\n".join(wrong)
    # and every name in fastbus.errors.__all__ is such a class
    for name in fastbus.errors.__all__:
        cls = getattr(fastbus.errors, name)
        assert issubclass(cls, FastbusError) and cls.__module__ == "fastbus.errors", name


def test_no_exception_class_is_defined_outside_fastbus_errors():
    """The same, by reading the source: it also covers the modules that
    cannot be imported here (fastbus.spark without pyspark)."""
    names = set(fastbus.errors.__all__) | {"Exception", "BaseException", "ValueError", "TypeError", "KeyError",
                                           "RuntimeError", "OSError", "LookupError", "TimeoutError",
                                           "ConnectionError", "Warning", "UserWarning"}
    found = []
    for path in _sources():
        if path.relative_to(SOURCE).as_posix() in ("errors.py", "redis/errors.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and not _private(node.name):
                bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases}
                if bases & names or any(b.endswith(("Error", "Exception")) for b in bases):
                    found.append(f"{_module_name(path)}.{node.name} (line {node.lineno})")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", sorted(fastbus.errors.__all__))
def test_each_error_also_inherits_a_builtin_or_is_a_base(name):
    """FastbusError subclasses that resemble a built-in inherit it; the few
    that are bases or aggregates of their own (no built-in fits) are named here."""
    own = {"FastbusError", "ConnectionClosed", "ForwarderError", "QueueError", "ConsumerTagInUse",
           "PartialBatchError", "PublishError", "RedisServerError", "ServerRefused", "ServerOutOfMemory"}
    cls = getattr(fastbus.errors, name)
    builtins = [b for b in cls.__mro__ if b.__module__ == "builtins" and b not in (Exception, BaseException, object)]
    assert builtins or name in own, name


def test_the_redis_servers_size_limit_is_read_in_one_place():
    """Issue 14: the name "proto-max-bulk-len" as a value (what a CONFIG GET
    sends or a reply is searched for) appears only in fastbus.redis.errors,
    next to its parser and its two constants."""
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in ("proto-max-bulk-len", b"proto-max-bulk-len"):
                found.append(_module_name(path))
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and "BULK" in t.id for t in node.targets):
                found.append(f"{_module_name(path)}: {ast.unparse(node)}")
    assert sorted(found) == ["fastbus.redis.errors",
                             "fastbus.redis.errors: DEFAULT_MAX_BULK_LEN = 512 << 20",
                             "fastbus.redis.errors: MIN_MAX_BULK_LEN = 1 << 20"], found


def test_developing_md_layout_names_every_file_of_the_package():
    """docs/DEVELOPING.md "Layout": a purpose for every module (the Lua
    scripts are described as a directory, the C headers' .pxd as a group;
    the extension fastbus._core, core/ and _core.*, is described by concern
    in its own paragraph, which names the files as trie.pxd/.pxi and so on)."""
    doc = (SOURCE.parent / "docs" / "DEVELOPING.md").read_text()
    layout = doc[doc.index("## Layout"):]
    layout = layout[:layout.index("\n## ", 3)]
    missing = []
    for path in sorted(SOURCE.rglob("*")):
        rel = path.relative_to(SOURCE).as_posix()
        if not path.is_file() or "__pycache__" in rel or rel.startswith(("queue/lua/", "includes/fb_", "core/", "_core.")) \
                or path.suffix not in (".py", ".pyx", ".pyi", ".pxd", ".pxi", ".html", ".js", ".css", ".typed"):
            continue
        if path.name not in layout:
            missing.append(rel)
    assert not missing, missing


LAZY_PACKAGES = ("fastbus.queue", "fastbus.redis", "fastbus.monitor")


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_a_lazy_packages_public_names_all_resolve_to_what_type_checkers_see(package):
    """fastbus._lazy: each name of the package's __all__ is one of its
    TYPE_CHECKING imports, and resolves at run time to the object of the
    module that import names; a name it does not have is an AttributeError."""
    from fastbus._lazy import exports_of
    mod = importlib.import_module(package)
    table = exports_of(mod.__file__)
    assert sorted(table) == sorted(mod.__all__)
    for name, source in table.items():
        assert getattr(mod, name) is getattr(importlib.import_module(source), name), name
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        mod.no_such_name  # noqa: B018
    namespace: dict = {}
    exec(f"from {package} import *", namespace)
    assert set(mod.__all__) <= set(namespace)


def test_the_command_lines_parser_imports_no_command_s_machinery():
    """Every command builds the whole parser first: it must not import
    redis-py, asyncio, the HTTP server, the Lua scripts or
    importlib.metadata (a broker's start cost 0.6 CPU-seconds when it did;
    0.24 now).  In a fresh interpreter, with the installed package."""
    import subprocess
    import sys
    heavy = ("redis", "asyncio", "fastbus.aio", "fastbus.monitor.http", "fastbus.queue._lua", "importlib.metadata",
             "prometheus_client")
    script = ("import sys; from fastbus.cli import build_parser; build_parser().parse_args(['broker']); "
              f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
