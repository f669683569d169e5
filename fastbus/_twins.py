"""The rule of the asyncio twins, as code: an async twin's public methods
carry their sync twin's docstrings (see docs/DEVELOPING.md, "Async twins").

``twin_of(SyncClass)`` decorates the async class: each public method,
property or coroutine defined in the async class whose name the sync class
also has gets the sync one's docstring.  A docstring the async method has
itself is kept as a note after it (what differs in how it waits), so the two
cannot drift apart.  tests/test_twins.py checks every pair.
"""

from __future__ import annotations

import inspect
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
    if inspect.isfunction(value):
        return value
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
