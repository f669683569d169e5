"""Async twins by rule: an asyncio twin changes only how it waits.

For every pair (sync class, asyncio twin) the public names must be the
same, with the same parameters and defaults; a call that waits (talks to
the server, or waits for room or messages) is a coroutine in the twin,
and a call that does not is a plain call in both; and every public method
of the twin carries its sync twin's docstring (``fastbus._twins.twin_of``
copies them; a twin's own note may follow).  A difference fails unless it
is in ALLOWED below, with the reason.
"""

from __future__ import annotations

import inspect

import pytest

import fastbus
import fastbus.aio
from fastbus.queue import (AsyncConsumer, AsyncInbox, AsyncTopic, AsyncWorkQueue, Consumer, Inbox, Topic,
                           WorkQueue)
from fastbus.redis import (AsyncBufferedListProducer, AsyncBufferedPublisher, BufferedListProducer,
                           BufferedPublisher)

#: The Redis publishers' plain calls: and the steps and hooks their twin
#: waits with (room_check, start_flush/flush_done, stop_steps: the sync
#: class's own waits in steps; the twin awaits between them).
REDIS_PUBLISHER_PLAIN = {"has_room", "stats", "room_check", "room_deadline", "start_flush", "flush_done",
                         "stop_steps", "closing", "stopped", "driven_by_loop"}

#: (sync, async twin, the twin's public members that are plain calls or
#: attributes: they do not wait).  Every other public method of the twin
#: must be a coroutine (or an async generator).
PAIRS = [
    (fastbus.Client, fastbus.aio.Client,
     {"pubsub", "stats", "is_wanted", "shutdown", "session", "closed", "driven_by_loop",
      "options", "from_options", "from_url", "connections", "endpoint", "name", "decode_responses", "max_delay", "max_inbox_bytes",
      "socket_connect_timeout", "subscribe_timeout"}),
    (fastbus.PubSub, fastbus.aio.PubSub,
     {"subscribed", "has_ready", "ready_message", "ready_batch", "read_nowait", "session", "closed",
      "shutdown", "subscribe_nowait", "psubscribe_nowait", "unsubscribe_nowait", "open", "awaits_handlers",
      "require_handlers", "take_notices", "responder"}),
    (WorkQueue, AsyncWorkQueue, {"consumer", "redis"}),
    (Consumer, AsyncConsumer, {"tag"}),
    (Topic, AsyncTopic, {"consumer", "redis"}),
    (Inbox, AsyncInbox, {"redis"}),
    (BufferedPublisher, AsyncBufferedPublisher, REDIS_PUBLISHER_PLAIN),
    (BufferedListProducer, AsyncBufferedListProducer, REDIS_PUBLISHER_PLAIN),
]

#: Known differences: (twin class name, member) -> why.  Keep each one
#: explained; remove it when the difference goes.
ALLOWED = {
    # redis.asyncio's name for close() is aclose(); both are the same coroutine.
    ("Client", "aclose"): "alias of close(), redis-py asyncio's name",
    ("PubSub", "aclose"): "redis.asyncio's name for close(), which is deprecated there and here",
    ("PubSub", "run"): "redis.asyncio's run(): handlers until cancelled (the sync class has run_in_thread())",
    ("PubSub", "connect"): "redis.asyncio's connect(): get_message() raises RuntimeError until it, or a "
                           "subscribe(); the sync class is connected when made (open() after close())",
    # An asyncio consumer is started by awaiting it (or ``async with``):
    # registering is a round trip, which __init__ cannot await.
    ("AsyncConsumer", "start"): "registers and starts the heartbeat (the sync __init__ does it)",
    ("AsyncConsumer", "__init__"): "the same parameters; its driver is the asyncio one (how it waits)",
}


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


def _kind(cls: type, name: str) -> str:
    v = inspect.getattr_static(cls, name)
    if isinstance(v, property):
        return "property"
    if isinstance(v, (staticmethod, classmethod)):
        v = v.__func__
    if inspect.iscoroutinefunction(v) or inspect.isasyncgenfunction(v):
        return "async"
    if callable(v):
        return "method"
    return "attribute"


def _params(func) -> list[tuple]:
    """Parameters after self: name, kind, default, annotation (as written)."""
    sig = inspect.signature(func)
    return [(p.name, p.kind, p.default, p.annotation) for p in list(sig.parameters.values())[1:]]


def _doc(cls: type, name: str) -> str:
    v = inspect.getattr_static(cls, name)
    if isinstance(v, (staticmethod, classmethod)):
        v = v.__func__
    return inspect.cleandoc(v.__doc__ or "")


def _ids(pair):
    return f"{pair[0].__name__}-{pair[1].__module__}.{pair[1].__name__}"


@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
def test_same_public_names(pair):
    sync, twin, _plain = pair
    missing = sorted(n for n in _public(sync) - _public(twin) if (twin.__name__, n) not in ALLOWED)
    extra = sorted(n for n in _public(twin) - _public(sync) if (twin.__name__, n) not in ALLOWED)
    assert not missing, f"{twin.__name__} lacks {missing} of {sync.__name__}"
    assert not extra, f"{twin.__name__} has {extra} that {sync.__name__} has not"


@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
def test_same_signatures(pair):
    sync, twin, _plain = pair
    diffs = []
    for name in sorted(_public(sync) & _public(twin)) + ["__init__"]:
        if (twin.__name__, name) in ALLOWED:
            continue
        ks, kt = _kind(sync, name), _kind(twin, name)
        if ks in ("property", "attribute") or kt in ("property", "attribute"):
            if ks != kt:
                diffs.append(f"{name}: {ks} in {sync.__name__}, {kt} in {twin.__name__}")
            continue
        ps, pt = _params(getattr(sync, name)), _params(getattr(twin, name))
        if ps != pt:
            diffs.append(f"{name}{inspect.signature(getattr(sync, name))} vs "
                         f"{name}{inspect.signature(getattr(twin, name))}")
    assert not diffs, "signatures differ:\n" + "\n".join(diffs)


@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
def test_waiting_calls_are_coroutines(pair):
    sync, twin, plain = pair
    assert plain <= _public(twin), f"PAIRS names what {twin.__name__} does not have: {plain - _public(twin)}"
    wrong = []
    for name in sorted(_public(twin)):
        kind = _kind(twin, name)
        if name in plain:
            if kind == "async":
                wrong.append(f"{name} is a coroutine but listed as a plain call")
            if name in _public(sync) and _kind(sync, name) == "async":
                wrong.append(f"{name} is a coroutine in the sync class")
        elif kind != "async" and (twin.__name__, name) not in ALLOWED:
            wrong.append(f"{name} ({kind}) waits in {sync.__name__} but is no coroutine in {twin.__name__}")
    assert not wrong, "\n".join(wrong)
    # Context managers: ``with`` for the sync class, ``async with`` for the twin.
    if hasattr(sync, "__enter__"):
        assert inspect.iscoroutinefunction(twin.__aenter__) and inspect.iscoroutinefunction(twin.__aexit__)


@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
def test_twin_methods_carry_the_sync_docstrings(pair):
    sync, twin, _plain = pair
    bad = []
    for name in sorted(_public(twin)):
        if _kind(twin, name) == "attribute":
            continue
        doc = _doc(twin, name)
        if name not in _public(sync):
            if not doc:
                bad.append(f"{name}: no docstring")
            continue
        want = _doc(sync, name)
        if not want:
            bad.append(f"{sync.__name__}.{name} has no docstring to copy")
        elif not doc.startswith(want):
            bad.append(f"{twin.__name__}.{name} does not carry {sync.__name__}.{name}'s docstring")
    assert not bad, "\n".join(bad)


def _privates_read_not_defined(src: str) -> list[str]:
    """``x._name`` reads in ``src`` of names ``src`` does not define itself
    (as ``def _name``, ``self._name =`` or a class attribute)."""
    import re
    own = set(re.findall(r"def (_[a-z]\w*)", src))
    own |= set(re.findall(r"self\.(_[a-z]\w*)\s*(?::[^=\n]*)?=(?!=)", src))
    own |= set(re.findall(r"^\s*(_[a-z]\w*)\s*[:=]", src, re.M))
    # Import lines name modules (``fastbus.client._session``), not attributes.
    code = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("from ", "import ")))
    used = set(re.findall(r"\.(_[a-z]\w*)\b", code))
    # Modules imported whole (``from fastbus.client import _client as ...``)
    # and named in docstrings (``fastbus._twins``).
    modules = set(re.findall(r"import (_[a-z]\w*)", src)) | set(re.findall(r"fastbus\.(_[a-z]\w*)", src))
    return sorted(used - own - modules)


def test_twins_use_only_public_hooks():
    """The twins read no private name of their sync classes: every
    ``x._name`` they touch is one they define themselves."""
    import fastbus.aio as aio
    assert _privates_read_not_defined(inspect.getsource(aio)) == []
    import fastbus.redis.publisher_aio as redis_aio
    assert _privates_read_not_defined(inspect.getsource(redis_aio)) == []
