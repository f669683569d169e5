"""The broker's data plane in C (``fastbus.broker._relay``), bound to the
libzmq that pyzmq loaded (``fastbus._libzmq`` finds its functions).

There is one data plane: the broker routes, sends and polls in C, and
Python drives it (sessions' lifecycles, control messages, queues, stats).
Where the extension or pyzmq's libzmq cannot be found the broker does not
start, and says why.
"""

from __future__ import annotations

import zmq

from fastbus._libzmq import functions
from fastbus.errors import DataPlaneUnavailable

_bound = False


def listener():
    """The broker's own ROUTER end (``fastbus.broker._relay.Listener``: its
    class, to be made with its options), or None where the extension is not
    built: the broker then uses libzmq's ROUTER (as it does for an endpoint
    ``Listener.supports`` refuses, every endpoint off Linux)."""
    try:
        from fastbus.broker._relay import Listener
    except ImportError:
        return None
    return Listener


def relay(router, sock):
    """The Relay for this router and ROUTER socket (a libzmq ROUTER or a
    Listener; see the module doc)."""
    global _bound
    try:
        from fastbus.broker import _relay
    except ImportError as exc:            # a build without the extension
        raise DataPlaneUnavailable(f"the broker's data plane (fastbus.broker._relay) is not built: {exc}; "
                               f"reinstall fastbus from its source or wheel") from None
    if not _bound:
        addresses = functions(_relay.FUNCTIONS)
        if addresses is None:
            raise DataPlaneUnavailable(
                f"the broker calls libzmq from C, through the library pyzmq loaded, and could not find it "
                f"(pyzmq {zmq.__version__}, libzmq {zmq.zmq_version()}, backend {getattr(zmq.backend.Socket, '__module__', '?')}); "
                f"install pyzmq's own wheel (pip install --force-reinstall pyzmq)")
        _relay.bind(addresses)
        _bound = True
    return _relay.Relay(router, sock)
