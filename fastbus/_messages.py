"""The subscriber-side message model, in one place: how channels, patterns
and payloads become bytes, the kinds of messages a subscriber reads, the
functions that build them, and the buffer that ``get_message()`` /
``get_batch()`` take them from.

Used by :class:`fastbus.PubSub` (and its asyncio twin),
:class:`fastbus.ShardedPubSub` and :class:`fastbus.redis.Subscriber`.

Messages are dicts shaped as redis-py's (:class:`PubSubMessage`):
``type``, ``pattern``, ``channel``, ``data``; a data message published with
headers also has ``headers`` (a :class:`fastbus.Headers`, a read-only dict
of str to bytes; with ``decode_responses`` to str where a value is UTF-8;
messages with the same headers share one), so ``message.get("headers")``
is None for one without.  Kinds:

* ``message`` / ``pmessage``: data (``pattern`` set for ``pmessage``);
* ``subscribe`` / ``psubscribe`` / ``unsubscribe`` / ``punsubscribe``:
  confirmations, ``data`` the number of subscriptions then held;
* ``pong``: the answer to ``ping()``, ``data`` its argument (or ``b""``);
* ``gap``: messages were lost; ``data`` is a :class:`GapInfo` dict
  ``{"lost": int | None, "down_s": float | None}`` (a broker counts what it
  dropped: ``lost``; Redis keeps nothing for an absent subscriber, so its
  subscriber says how long it was away: ``down_s``);
* ``disconnected``: the connection to the broker was lost, said at once
  (``data`` what follows: the resumed stream, or a ``reconnect``);
* ``reconnect``: the subscriptions were resent to a restarted broker
  (``data`` why);
* ``refused``: the broker refused a subscription (``data`` its reason).

The batch decoders that build data-message dicts many at a time live in
the C bindings (``fastbus._core.decode_messages`` for broker batches,
``fastbus._core.resp_pubsub_decode`` for Redis replies): they are called
from here, never from the subscribers directly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Literal, NotRequired, TypedDict, Union

from fastbus._core import Headers, decode, glob_match, glob_prefix
from fastbus._decoders import decode_matching, decode_messages, resp_pubsub_decode

__all__ = [
    "CONFIRM_KINDS", "DATA_KINDS", "GLOB_SPECIALS", "GapInfo", "MessageBuffer", "PubSubMessage", "Request",
    "confirmation", "decode", "decode_matching", "decode_messages", "gap", "glob_match", "glob_prefix",
    "headers_as_text", "item_as_text", "message", "notice", "pattern_prefix", "pong", "resp_pubsub_decode", "to_bytes", "to_text",
]

#: Confirmations of (un)subscribe calls: what ``ignore_subscribe_messages`` drops.
CONFIRM_KINDS = frozenset(("subscribe", "psubscribe", "unsubscribe", "punsubscribe"))
#: Messages that carry published data (what ``get_batch()`` returns as tuples).
DATA_KINDS = frozenset(("message", "pmessage"))
#: Characters that make a name a glob pattern (Redis's: ``*``, ``?``,
#: ``[...]``, and ``\\`` escaping the next character).
GLOB_SPECIALS = frozenset("*?[\\")

Kind = Literal["message", "pmessage", "subscribe", "psubscribe", "unsubscribe", "punsubscribe",
               "pong", "gap", "disconnected", "reconnect", "refused"]


class GapInfo(TypedDict):
    """``data`` of a ``gap`` notice: what was lost, as far as it is known."""
    lost: int | None        # messages dropped (a fastbus broker counts them)
    down_s: float | None    # seconds without a subscription (Redis: nothing is counted)


class PubSubMessage(TypedDict):
    """One message or notice, as redis-py's ``get_message()`` returns it."""
    type: Kind
    pattern: Union[bytes, str, None]
    channel: Union[bytes, str, None]
    data: Any               # bytes/str payload; int count; GapInfo for ``gap``
    headers: NotRequired[Headers]          # a data message published with headers (read-only)
    reply_to: NotRequired[Union[bytes, str]]   # a request (Client.request): the channel its reply goes to


# -- values as bytes ---------------------------------------------------------

def to_bytes(value: object) -> bytes:
    """A channel, pattern or payload as bytes, by redis-py's rule: bytes as
    they are; str as UTF-8; another bytes-like object copied; an int or a
    float as its decimal text.  A bool (ambiguous: ``b"True"`` or ``b"1"``?)
    and anything else raise TypeError."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, bool):
        raise TypeError("a bool is not a channel or a message: convert it to bytes, str or a number first")
    if isinstance(value, (int, float)):
        return repr(value).encode()
    raise TypeError(f"channels, patterns and messages are bytes, str or numbers, not {type(value).__name__}")


def names_given(args: tuple) -> tuple:
    """The channels or patterns a (p)(un)subscribe call was given, by
    redis-py's rule (its ``list_or_args``): the first argument may be a
    list, tuple, set or other iterable of names, followed by more names;
    a str, bytes or bytes-like object is one name, as is anything that is
    not iterable (a number) and a ``Subscription(name, handler)``."""
    if not args:
        return args
    first, rest = args[0], args[1:]
    if isinstance(first, (str, bytes, bytearray, memoryview)) or \
            (hasattr(first, "name") and hasattr(first, "handler")):
        return args
    try:
        names = tuple(first)
    except TypeError:
        return args
    return names + rest


def to_text(value: bytes, decode_responses: bool) -> bytes | str:
    """``value`` as the caller reads it: str with ``decode_responses``."""
    return value.decode("utf-8") if decode_responses else value


def pattern_prefix(pattern: object) -> bytes:
    """The literal prefix of a glob pattern (Redis's syntax): the bytes
    every channel it matches starts with, which a broker holds it under
    (``b"news."`` for ``"news.*"`` and for ``"news.*.sports"``)."""
    return glob_prefix(to_bytes(pattern))[0]


# -- builders ----------------------------------------------------------------

def message(channel: bytes | str, data: bytes | str, pattern: bytes | str | None = None,
            headers: Headers | None = None) -> PubSubMessage:
    """A data message: ``pmessage`` when a pattern matched, else ``message``
    (with ``headers`` if it has any)."""
    m: PubSubMessage = {"type": "pmessage" if pattern is not None else "message", "pattern": pattern,
                        "channel": channel, "data": data}
    if headers is not None:
        m["headers"] = headers
    return m


def headers_as_text(headers: Mapping[str, Any]) -> Headers:
    """Header values as decode_responses reads them: str where a value is
    UTF-8, bytes where it is not (binary headers are not lost)."""
    out = {}
    for k, v in headers.items():
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError:
                pass
        out[k] = v
    return Headers(out)


def item_as_text(item: tuple) -> tuple:
    """A ``(channel, data)`` or ``(channel, data, headers)`` tuple of bytes
    as decode_responses reads it."""
    if len(item) == 2:
        return item[0].decode("utf-8"), item[1].decode("utf-8")
    return item[0].decode("utf-8"), item[1].decode("utf-8"), headers_as_text(item[2])


def confirmation(kind: str, name: bytes | str, count: int) -> PubSubMessage:
    """The confirmation of one (un)subscription; ``count`` subscriptions held."""
    return {"type": kind, "pattern": None, "channel": name, "data": count}  # type: ignore[typeddict-item]


def gap(lost: int | None = None, down_s: float | None = None) -> PubSubMessage:
    """A ``gap`` notice: ``lost`` messages dropped, or ``down_s`` seconds away."""
    info: GapInfo = {"lost": lost, "down_s": down_s}
    return {"type": "gap", "pattern": None, "channel": None, "data": info}


def notice(kind: Literal["disconnected", "reconnect", "refused"], data: bytes | str,
           channel: bytes | str | None = None) -> PubSubMessage:
    """A ``disconnected``, ``reconnect`` or ``refused`` notice."""
    return {"type": kind, "pattern": None, "channel": channel, "data": data}


def pong(data: bytes | str) -> PubSubMessage:
    """The answer to ``ping()``."""
    return {"type": "pong", "pattern": None, "channel": None, "data": data}


# -- buffering ---------------------------------------------------------------

class MessageBuffer:
    """What a subscriber decoded and nobody took yet, in three queues that
    keep arrival order between the two ways of reading:

    * ``notices``: message dicts that are not data (confirmations, gaps...);
      ``get_message()`` returns them first;
    * ``pairs``: data as ``(channel, data)`` tuples, ``(channel, data,
      headers)`` for a message with headers (``get_batch()``'s form, or left
      over by it);
    * ``dicts``: decoded message dicts (``get_message()``'s form).

    A subscriber appends what it reads to one of them; :meth:`next_message`
    and :meth:`next_batch` hand it out.  Not thread-safe: one reader."""

    __slots__ = ("notices", "pairs", "dicts")

    def __init__(self) -> None:
        self.notices: deque[PubSubMessage] = deque()
        self.pairs: deque[tuple[Any, Any]] = deque()
        self.dicts: deque[PubSubMessage] = deque()

    def __bool__(self) -> bool:
        return bool(self.notices or self.pairs or self.dicts)

    def clear(self) -> None:
        self.notices.clear()
        self.pairs.clear()
        self.dicts.clear()

    def next_message(self, ignore_confirms: bool,
                     as_message: Callable[[Any, Any], PubSubMessage | None]) -> PubSubMessage | None:
        """The next message, or None when all three queues are empty.
        ``as_message(channel, data[, headers])`` turns a pair into its dict
        (None: drop it); confirmations are skipped with ``ignore_confirms``."""
        notices, pairs, dicts = self.notices, self.pairs, self.dicts
        while notices:
            m = notices.popleft()
            if not (ignore_confirms and m["type"] in CONFIRM_KINDS):
                return m
        while pairs:                                  # left by get_batch(): keep the order
            m = as_message(*pairs.popleft())
            if m is not None:
                return m
        while dicts:
            m = dicts.popleft()
            if not (ignore_confirms and m["type"] in CONFIRM_KINDS):
                return m
        return None

    def batch_from_dicts(self, limit: int | None) -> list[tuple[Any, Any]]:
        """Data messages left as dicts by get_message(), as ``(channel,
        data)`` tuples in the form they have (up to ``limit``); the notices
        among them move to ``notices``.  [] when none are left."""
        dicts = self.dicts
        if not dicts:
            return []
        out: list[tuple[Any, Any]] = []
        while dicts and (limit is None or len(out) < limit):
            m = dicts.popleft()
            if m["type"] in DATA_KINDS:
                out.append((m["channel"], m["data"], m["headers"]) if "headers" in m else (m["channel"], m["data"]))
            else:
                self.notices.append(m)
        return out

    def batch_from_pairs(self, limit: int | None) -> list[tuple[Any, Any]]:
        """Up to ``limit`` of the buffered ``(channel, data)`` tuples (all with None)."""
        pairs = self.pairs
        if not pairs:
            return []
        if limit is None or len(pairs) <= limit:
            out = list(pairs)
            pairs.clear()
            return out
        return [pairs.popleft() for _ in range(limit)]

    def next_batch(self, limit: int | None) -> list[tuple[Any, Any]]:
        """Up to ``limit`` buffered data messages as ``(channel, data)``:
        those left as dicts first, then the tuples."""
        return self.batch_from_dicts(limit) or self.batch_from_pairs(limit)


# -- requests (request/reply: fastbus/client/_requests.py) --------------------------


class Request(dict):
    """A received message that asks for a reply (its ``"reply_to"`` is the
    channel to answer on): the dict a PubSub gives, with :meth:`respond`."""

    __slots__ = ("_client",)

    def respond(self, data: Any, headers: dict | None = None) -> int:
        """Answer the request: publish ``data`` on its reply channel with
        the client that made this message's PubSub (as
        ``client.publish(message["reply_to"], data)``)."""
        client = getattr(self, "_client", None)
        if client is None:
            raise RuntimeError("this request came through a PubSub made without a client "
                               "(Client.pubsub() gives one): publish to message['reply_to'] instead")
        return client.publish(self["reply_to"], data, headers)

    @classmethod
    def answered_by(cls, client: Any) -> Callable[[dict], Request]:
        """What makes a decoded request's dict a Request answered through
        ``client`` (``decode_messages``'s ``request``)."""
        def make(d: dict) -> Request:
            r = cls(d)
            r._client = client
            return r
        return make
