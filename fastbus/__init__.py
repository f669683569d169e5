"""fastbus: fast pub/sub and reliable messaging, with a C core.

* :class:`Client` / :class:`PubSub` - publish and subscribe through a
  fastbus broker, with redis-py's pub/sub API.
* :class:`Broker` / :class:`BrokerConfig` - the broker, embedded in a Python
  process (``fastbus broker`` runs one from the shell).

The core, implemented in C (``csrc/``) and exposed here:

* :class:`Trie` - who wants a topic: exact and prefix keys, reference-counted
  per subscriber, ``match`` / ``match_many`` / ``match_flat``.
* :class:`Forwarder` - the minimal upstream subscription diff for a broker.
* :class:`Outbox` / :class:`Batch` - batching with a flush policy, and the
  versioned batch wire format (:func:`encode`, :func:`decode`).
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

from fastbus._core import (
    BATCH_VERSION,
    CORE_VERSION,
    EXACT,
    PREFIX,
    SUBSCRIBE,
    UNSUBSCRIBE,
    Batch,
    Forwarder,
    Outbox,
    Publisher,
    Router,
    Trie,
    batch_count,
    crc32c,
    decode,
    decode_messages,
    encode,
)
from fastbus.errors import BatchError, FastbusError, ForwarderError, NotSubscribedError, PublishTimeout
from fastbus.protocol import DEFAULT_ENDPOINT, DEFAULT_PORT, ProtocolError
from fastbus.client import Client, ConnectionClosed, PubSub
from fastbus.broker import Broker, BrokerConfig
from fastbus.sharding import ShardedClient, ShardedPubSub
from fastbus import aio  # noqa: E402  (fastbus.aio.Client, fastbus.aio.PubSub)

try:
    __version__ = version("fastbus")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "BATCH_VERSION", "CORE_VERSION", "EXACT", "PREFIX", "SUBSCRIBE", "UNSUBSCRIBE",
    "Batch", "Forwarder", "Outbox", "Publisher", "Router", "Trie", "batch_count", "crc32c", "decode", "decode_messages", "encode",
    "BatchError", "FastbusError", "ForwarderError", "NotSubscribedError", "ProtocolError", "PublishTimeout",
    "ConnectionClosed", "Client", "PubSub", "Broker", "BrokerConfig", "DEFAULT_ENDPOINT", "DEFAULT_PORT",
    "ShardedClient", "ShardedPubSub", "aio",
    "get_include", "get_library_dirs",
]

_HERE = os.path.dirname(os.path.abspath(__file__))


def get_include() -> str:
    """Directory of the core's C headers (``fastbus.h`` and ``fb_*.h``), to
    pass as ``include_dirs`` when building an extension that uses the C API.
    The Cython declarations (``fastbus/_core.pxd``, ``fastbus/includes/*.pxd``)
    are found through ``sys.path`` like any installed package."""
    return os.path.join(_HERE, "includes")


def get_library_dirs() -> list[str]:
    """Directories holding the static core library; link with
    ``libraries=["fastbus"]``."""
    return [os.path.join(_HERE, "lib")]
