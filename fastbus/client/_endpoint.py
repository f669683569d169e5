"""Client endpoints: checked before ZeroMQ sees them (its own error is a bare
"Invalid argument"), and probed, where the transport allows, to tell at once
that nothing listens there."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from fastbus.errors import InvalidEndpoint

_FORMS = "tcp://HOST:PORT, ipc://PATH or inproc://NAME"


def check_endpoint(endpoint: object) -> str:
    """``endpoint`` if a client can connect to it, else InvalidEndpoint."""
    if not isinstance(endpoint, str):
        raise InvalidEndpoint(f"an endpoint is a str ({_FORMS}), not {type(endpoint).__name__}", repr(endpoint))
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        raise InvalidEndpoint(f"invalid endpoint {endpoint!r}: expected {_FORMS}", endpoint)
    if scheme in ("ipc", "inproc"):
        if not rest:
            raise InvalidEndpoint(f"invalid endpoint {endpoint!r}: {scheme}:// needs a "
                                  f"{'path' if scheme == 'ipc' else 'name'}", endpoint)
        return endpoint
    if scheme != "tcp":
        raise InvalidEndpoint(f"invalid endpoint {endpoint!r}: unsupported transport {scheme!r} "
                              f"(expected {_FORMS})", endpoint)
    parts = urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or port == 0:
        raise InvalidEndpoint(f"invalid endpoint {endpoint!r}: expected tcp://HOST:PORT, e.g. "
                              "tcp://127.0.0.1:6464", endpoint)
    return endpoint


def refused(endpoint: str, timeout: float = 1.0) -> bool:
    """True if nothing listens at ``endpoint`` (a TCP connection refused, an
    ipc:// path that is no socket or that nobody accepts on); False if
    something does, or if the transport or the network cannot say at once
    (a timeout, inproc://, an abstract ipc name)."""
    scheme, _, rest = endpoint.partition("://")
    try:
        if scheme == "tcp":
            parts = urlsplit(endpoint)
            host = parts.hostname
            if host == "*":
                return False
            with socket.create_connection((host, parts.port), timeout=timeout):
                return False
        if scheme == "ipc" and rest and not rest.startswith("@"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(rest)
            return False
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    except (OSError, ValueError):
        return False
    return False
