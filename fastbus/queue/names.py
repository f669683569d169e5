"""The names of queues, topics, inboxes and their members, and the key
namespace each one's keys share.  Plain text rules with no Redis in them:
the command-line parser checks names with these before anything imports
redis-py (fastbus._lazy says why that matters)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["DEFAULT_PREFIX", "check_name", "check_prefix", "namespace"]

DEFAULT_PREFIX = "fastbus"
_NAME = re.compile(r"[^\s{}:]{1,200}\Z")


def check_name(what: str, value: Any) -> str:
    """A queue, topic, inbox, consumer or tag name: 1-200 characters, no
    whitespace, no ``{ } :`` (they delimit the keys' hash tag and fields)."""
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            raise ValueError(f"{what} must be text, not {value!r}") from None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not _NAME.match(value):
        raise ValueError(f"{what} must be 1-200 characters without whitespace, '{{', '}}' or ':', not {value!r}")
    return value


def check_prefix(prefix: Any) -> str:
    if not isinstance(prefix, str) or not prefix or any(c in prefix for c in "{} \t\r\n"):
        raise ValueError(f"prefix must be a non-empty str without braces or whitespace, not {prefix!r}")
    return prefix


def namespace(kind: str, prefix: str, name: str) -> str:
    """``prefix:kind:{name}:``, the start of every key of one queue ("q"),
    topic ("t"), inbox ("i") or staged writer's channel ("c"): the braces
    make them one Redis Cluster hash slot.  ``name`` is checked by the caller."""
    return f"{check_prefix(prefix)}:{kind}:{{{name}}}:"
