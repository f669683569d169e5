"""The client package around one owner per connection (issue 22, item 2):
its settings in one checked object, its modules in layers with no circle,
its session locks taken only inside the session, ``publish`` a real method.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import fastbus
from brokers import STEADY_FILTER, collect, confirm, wait_wanted

CLIENT = Path(__file__).resolve().parents[1] / "fastbus" / "client"

#: Top down: a module may import at run time only modules after it here.
LAYERS = ["_client", "_requests", "_pubsub", "_subsession", "_items", "_pubsession", "_connections", "_keeper", "_session",
          "_options", "_stats", "_endpoint", "_engine", "_keys", "_redis_compat"]


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(fastbus.client module imported, only for type checking?) of a file."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fastbus.client"):
            names = [node.module.rpartition(".")[2]] if node.module != "fastbus.client" else \
                [a.name for a in node.names]
            found += [(n, id(node) in typing_only) for n in names if n.startswith("_")]
    return found


def test_every_client_module_has_a_layer():
    assert sorted(p.stem for p in CLIENT.glob("_*.py*") if p.stem != "__init__") == sorted(LAYERS)


@pytest.mark.parametrize("module", LAYERS)
def test_modules_import_only_the_layers_below_them(module):
    path = next(CLIENT.glob(f"{module}.py*"))
    if path.suffix != ".py":
        return                                     # the native engine imports no Python module
    below = LAYERS[LAYERS.index(module) + 1:]
    wrong = [name for name, typing_only in _imports(path) if not typing_only and name not in below]
    assert not wrong, f"{module} imports {wrong} at run time, which are not below it"


def test_nothing_below_the_client_knows_the_client():
    """Not even for type checking: sessions, PubSubs and the keeper are
    given the Connections that own them, never the Client."""
    for path in CLIENT.glob("_*.py"):
        if path.stem in ("_client", "__init__"):
            continue
        assert "_client" not in [n for n, _t in _imports(path)], path.name
        assert not re.search(r"(?<![.\w])client\._\w", path.read_text()), f"{path.name} reads a Client's private field"


def test_session_locks_are_taken_only_inside_the_session():
    """``lock.acquire``/``lock.release`` and the posted-work queue appear
    only in _session.py (the native threads take the lock in C)."""
    pattern = re.compile(r"\.lock\.(acquire|release)\b|\.posted\.popleft|\bwith \w+\.lock\b")
    files = [*CLIENT.glob("*.py"), CLIENT.parent / "aio.py", CLIENT.parent / "sharding.py"]
    wrong = [f"{p.name}:{i}" for p in files if p.name != "_session.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not wrong, wrong


def test_publish_is_a_method_of_the_class_not_swapped_per_instance(brokers):
    b = brokers(*STEADY_FILTER)
    with fastbus.Client(endpoint=b.endpoint) as c:
        assert "publish" not in vars(c)
        assert type(c).publish is fastbus.Client.publish
        assert fastbus.Client.publish.__doc__ and "channel" in fastbus.Client.publish.__doc__
        with c.pubsub() as p:
            p.subscribe("a")
            confirm(p, 1)
            wait_wanted(c, "a")
            assert c.publish("a", b"1") == 1
            assert c.publish("nobody-wants-this", b"x") == 0       # the filter, in the same C call
            c.flush()
            assert [(m["channel"], m["data"]) for m in collect(p, 1)] == [(b"a", b"1")]


def test_options_are_checked_once_and_shared_by_every_part(brokers):
    b = brokers()
    with pytest.raises(ValueError, match="max_inbox_bytes"):
        fastbus.ClientOptions(max_inbox_bytes=0)
    with pytest.raises(ValueError, match="CURVE needs"):
        fastbus.Client(endpoint=b.endpoint, curve_server_key="x" * 40)
    with pytest.raises(fastbus.InvalidEndpoint):
        fastbus.ClientOptions(endpoint="tcp://127.0.0.1")
    with fastbus.Client(endpoint=b.endpoint, decode_responses=True, max_inbox_bytes=1 << 20, name="orders") as c:
        o = c.options
        assert (o.endpoint, o.name, o.decode_responses, o.max_inbox_bytes) == (b.endpoint, "orders", True, 1 << 20)
        assert (c.endpoint, c.name, c.decode_responses, c.max_inbox_bytes) == (b.endpoint, "orders", True, 1 << 20)
        with pytest.raises(dataclasses.FrozenInstanceError):
            o.max_inbox_bytes = 1                                 # type: ignore[misc]
        with c.pubsub() as p:
            assert p.session.options is o                         # the same object, not copies
        assert c.session.options is o
        # Another client with the same settings, but a different name.
        with fastbus.Client.from_options(dataclasses.replace(o, name="orders-2")) as c2:
            assert c2.options.decode_responses and c2.name == "orders-2"
            with c2.pubsub() as p2:
                p2.subscribe("x")
                confirm(p2, 1)
                wait_wanted(c, "x")
                c.publish("x", "hé")
                c.flush()
                got = [(m["channel"], m["data"]) for m in collect(p2, 1)]
                assert got == [("x", "hé")]                       # decode_responses came with the options


def test_the_secret_key_is_never_printed():
    o = fastbus.ClientOptions(curve_server_key="S" * 40, curve_public_key="P" * 40, curve_secret_key="Z" * 40)
    assert "Z" * 40 not in repr(o) and "P" * 40 in repr(o)
