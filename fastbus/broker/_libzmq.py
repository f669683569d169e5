"""The broker's C data plane, where it can run: ``relay()`` (see
``fastbus.broker._relay``; the libzmq functions it calls are found by
``fastbus._libzmq``).  Where the extension or pyzmq's libzmq is not found,
``relay()`` returns None and the broker does the same work in Python.
``FASTBUS_BROKER_RELAY=0`` turns the relay off (to compare, or to test the
Python path).
"""

from __future__ import annotations

import logging
import os

from fastbus._libzmq import functions

log = logging.getLogger("fastbus.broker")

_bound: bool | None = None


def relay(router, sock):
    """A Relay for this router and ROUTER socket, or None (see the module doc)."""
    global _bound
    if os.environ.get("FASTBUS_BROKER_RELAY", "1") == "0":
        return None
    try:
        from fastbus.broker import _relay
    except ImportError as exc:            # a build without the extension
        log.info("the broker's C data plane is not built (%s): routing in Python", exc)
        return None
    if _bound is None:
        addresses = functions(_relay.FUNCTIONS)
        _bound = addresses is not None
        if _bound:
            _relay.bind(addresses)
        else:
            log.info("the libzmq that pyzmq loaded was not found: the broker routes in Python")
    return _relay.Relay(router, sock) if _bound else None
