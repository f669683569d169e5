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

import logging
import os
from typing import TYPE_CHECKING, Any

# A library's loggers stay silent unless the application configures logging
# (without this, Python's last-resort handler prints their warnings).
logging.getLogger("fastbus").addHandler(logging.NullHandler())


def _source_tree_error(exc: ImportError) -> ImportError:
    """The error for ``import fastbus`` from a source checkout that was never
    built: say what happened and what to do, instead of "No module named
    'fastbus._core'" (``python -m ...``, ``python -c ...`` and the REPL put
    the current directory first on ``sys.path``, so a clone's root shadows
    the installed package)."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    is_checkout = (os.path.isfile(os.path.join(root, "setup.py")) and os.path.isdir(os.path.join(root, "csrc"))
                   and os.path.isfile(os.path.join(here, "_core.pyx")))
    if not (isinstance(exc, ModuleNotFoundError) and exc.name == "fastbus._core" and is_checkout):
        return exc
    try:
        where = " (the current directory)" if os.path.samefile(root, os.getcwd()) else ""
    except OSError:
        where = ""
    return ImportError(
        f"fastbus: you are importing the source tree at {root}{where}, which has no compiled extension "
        "(fastbus._core): run from another directory (or with `python -P`) to use the installed fastbus, "
        "or build the tree in place with `pip install -e .`", name="fastbus", path=here)


try:
    from fastbus._core import (
        BATCH_F_HEADERS,
        BATCH_F_HEADERS_AGAIN,
        BATCH_VERSION,
        CORE_VERSION,
        EXACT,
        PREFIX,
        SUBSCRIBE,
        UNSUBSCRIBE,
        Batch,
        Forwarder,
        Headers,
        Outbox,
        Router,
        Trie,
        batch_count,
        crc32c,
        decode,
        encode,
    )
    from fastbus._decoders import decode_messages
    from fastbus._publisher import Publisher
except ImportError as _exc:
    raise _source_tree_error(_exc) from None

from fastbus.errors import (AddressInUse, BatchError, BrokerTimeout, BrokerUnavailable, ConnectionClosed,
                            DurableNameInUse, FastbusError, FlushTimeout, ForwarderError, InvalidEndpoint, InvalidKey, KeyRefused,
                            ListenError,
                            MessagesRejected, MessageTooLarge, NotABroker, NotSubscribedError, NoResponders,
                            PublishTimeout, RequestTimeout, QueueFull, HoldRefused)
from fastbus.protocol import DEFAULT_ENDPOINT, DEFAULT_PORT, ProtocolError
from fastbus.client import Client, ClientOptions, PubSub
from fastbus._messages import GapInfo, PubSubMessage
from fastbus.broker import Broker, BrokerConfig
from fastbus.sharding import ShardedClient, ShardedPubSub

# fastbus.aio (asyncio) and __version__ (importlib.metadata) are a third of
# what importing fastbus cost, and most processes (a broker, a command, a
# synchronous client) use neither: they come on first use.
if TYPE_CHECKING:
    from fastbus import aio
    __version__: str


def __getattr__(name: str) -> Any:
    global __version__
    if name == "aio":
        import fastbus.aio
        return fastbus.aio
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version
        try:
            __version__ = version("fastbus")
        except PackageNotFoundError:  # running from a source tree that was never installed
            __version__ = "0+unknown"
        return __version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BATCH_F_HEADERS", "BATCH_F_HEADERS_AGAIN", "BATCH_VERSION", "CORE_VERSION", "EXACT", "PREFIX", "SUBSCRIBE", "UNSUBSCRIBE",
    "Batch", "Forwarder", "Headers", "Outbox", "Publisher", "Router", "Trie", "batch_count", "crc32c", "decode", "decode_messages", "encode",
    "BatchError", "FastbusError", "ForwarderError", "MessagesRejected", "MessageTooLarge", "NotSubscribedError", "ProtocolError",
    "PublishTimeout", "AddressInUse", "BrokerTimeout", "BrokerUnavailable", "FlushTimeout", "InvalidEndpoint",
    "InvalidKey", "KeyRefused", "DurableNameInUse", "ListenError", "NotABroker", "NoResponders", "RequestTimeout",
    "QueueFull", "HoldRefused", "ConnectionClosed", "Client", "ClientOptions", "PubSub", "PubSubMessage", "GapInfo", "Broker", "BrokerConfig",
    "DEFAULT_ENDPOINT", "DEFAULT_PORT",
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
