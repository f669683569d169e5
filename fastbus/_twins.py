"""The rule of the asyncio twins, as code: an async twin's public methods
carry their sync twin's docstrings (see docs/DEVELOPING.md, "Async twins"),
and a twin that waits for another thread's event waits with wait_event(),
set through event_setter().

``twin_of(SyncClass)`` decorates the async class: each public method,
property or coroutine defined in the async class whose name the sync class
also has gets the sync one's docstring.  A docstring the async method has
itself is kept as a note after it (what differs in how it waits), so the two
cannot drift apart.  tests/test_twins.py checks every pair.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", bound=type)

#: Put between the sync twin's docstring and the async twin's own note.
NOTE = "\n\n(asyncio) "


def _doc_target(value: object) -> object | None:
    """The object whose ``__doc__`` a class attribute's docstring lives on."""
    if isinstance(value, (staticmethod, classmethod)):
        return value.__func__
    if isinstance(value, property):
        return value
    if inspect.isroutine(value):
        return value                      # (a Cython method of a compiled base class too)
    return None


def twin_of(sync_cls: type) -> Callable[[T], T]:
    """Class decorator: copy ``sync_cls``'s docstrings onto the decorated
    async twin's public methods of the same names (see the module)."""

    def decorate(async_cls: T) -> T:
        done: set[int] = set()
        own = vars(async_cls)
        # Names the sync class has first, so an alias (``close = aclose``)
        # takes the docstring of the name the sync twin uses.
        names = sorted((n for n in own if not n.startswith("_")), key=lambda n: not hasattr(sync_cls, n))
        for name in names:
            target = _doc_target(own[name])
            if target is None or id(target) in done or not hasattr(sync_cls, name):
                continue
            source = _doc_target(inspect.getattr_static(sync_cls, name))
            sync_doc = inspect.cleandoc(source.__doc__) if source is not None and source.__doc__ else None
            if not sync_doc:
                continue
            note = inspect.cleandoc(target.__doc__) if target.__doc__ else ""
            if note.startswith(sync_doc):
                done.add(id(target))
                continue
            doc = sync_doc + NOTE + note if note else sync_doc
            if isinstance(target, property):
                # A property's docstring is read-only: make a new one.
                setattr(async_cls, name, property(target.fget, target.fset, target.fdel, doc))
            else:
                target.__doc__ = doc
            done.add(id(target))
        return async_cls

    return decorate


async def wait_event(event: asyncio.Event, deadline: float | None) -> bool:
    """Wait for ``event`` until ``deadline`` (time.monotonic); False on timeout.

    Not ``asyncio.wait_for``: on Python 3.11 it swallows a cancel that
    arrives while the event is set (its inner task done, the outer not yet
    resumed: CPython gh-86296), and a receiving loop such as
    ``PubSub.run()`` then never ends.  ``asyncio.timeout`` waits in the
    calling task itself, so a cancel always reaches it."""
    if deadline is None:
        await event.wait()
        return True
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    if event.is_set():
        # Event.wait() would return without letting the loop run: a caller
        # retrying (a publish waiting for room) would hold the loop.
        await asyncio.sleep(0)
        return True
    try:
        async with asyncio.timeout(left):
            await event.wait()
        return True
    except TimeoutError:
        return False


def event_setter(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Callable[[], None]:
    """A call that sets ``event`` of ``loop`` from any thread: at once in
    the loop's own (the thread that calls this), else through
    ``call_soon_threadsafe``; nothing once the loop is closed (nobody
    waits in it)."""
    owner = threading.get_ident()

    def set_event() -> None:
        if threading.get_ident() == owner:
            event.set()
            return
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:
            pass

    return set_event
