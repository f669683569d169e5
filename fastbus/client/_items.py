"""What a subscriber's connection hands its PubSub: one typed item for each
thing the broker said that the PubSub reads, in the order it was read.

``SubSession`` makes them (``deliver(item)``, the session's lock held);
``PubSub._take_item`` turns each into what the application reads: a batch
into messages, the rest into confirmations and notices.  An item is read
by its fields, never by position, and told apart by its class
(``type(item) is Batch``: one comparison on the path of every batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(slots=True)
class Batch:
    """A DATA batch (docs/BATCH_FORMAT.md), routed under the subscriptions
    of every SUB up to seq ``acked``."""

    acked: int
    batch: bytes


@dataclass(slots=True)
class Confirmed:
    """CONFIRM: every SUB up to seq ``seq`` is in effect."""

    seq: int


@dataclass(slots=True)
class Refused:
    """REFUSED (or refused here, for a broker too old to hold them): the
    subscriptions ``refused`` (``(key, prefix)`` pairs) of SUB ``seq``."""

    seq: int
    refused: set
    reason: str


@dataclass(slots=True)
class Gap:
    """GAP: ``lost`` records the broker dropped for this connection."""

    lost: int


@dataclass(slots=True)
class Notice:
    """The connection was lost (``disconnected``), or its session was not
    resumed (``reconnect``); ``why`` is what the application is told."""

    kind: Literal["disconnected", "reconnect"]
    why: bytes


@dataclass(slots=True)
class Replied:
    """A client's inbox: the reading thread's own reply has arrived (its
    read ends; nothing for the application)."""


InboxItem = Batch | Confirmed | Refused | Gap | Notice | Replied
