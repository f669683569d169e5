"""What a fastbus endpoint is, in one place: ``tcp://HOST:PORT``,
``ipc://PATH`` or ``inproc://NAME``.  ``check_connect`` is the rule for an
endpoint to connect to (a client, a downstream broker's upstream, the
monitor), ``check_listen`` the rule for one to listen on (a broker: port 0
picks a free one, and TCP stays on loopback unless allowed).  Both run
before ZeroMQ sees the endpoint, whose own error is a bare "Invalid
argument"; both raise :class:`~fastbus.errors.InvalidEndpoint`.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from fastbus.errors import InvalidEndpoint

FORMS = "tcp://HOST:PORT, ipc://PATH or inproc://NAME"


def _local_part(endpoint: object, invalid) -> tuple[str, str]:
    """``(scheme, rest)``; a non-str and an empty ipc/inproc name are
    ``invalid(why)``, the same for both rules."""
    if not isinstance(endpoint, str):
        raise invalid(f"an endpoint is a str ({FORMS}), not {type(endpoint).__name__}")
    scheme, sep, rest = endpoint.partition("://")
    if sep and scheme in ("ipc", "inproc") and not rest:
        raise invalid(f"invalid endpoint {endpoint!r}: {scheme}:// needs a "
                      f"{'path' if scheme == 'ipc' else 'name'}")
    return (scheme if sep else ""), rest


def _tcp(endpoint: str) -> tuple[str | None, int | None, bool]:
    """A tcp:// endpoint's host and port (None where missing), and whether
    its port could be read at all."""
    parts = urlsplit(endpoint)
    try:
        return parts.hostname, parts.port, True
    except ValueError:
        return parts.hostname, None, False


def check_connect(endpoint: object) -> str:
    """``endpoint`` if a client can connect to it, else InvalidEndpoint."""
    def invalid(why: str) -> InvalidEndpoint:
        return InvalidEndpoint(why, endpoint if isinstance(endpoint, str) else repr(endpoint))
    scheme, rest = _local_part(endpoint, invalid)
    assert isinstance(endpoint, str)
    if not scheme:
        raise invalid(f"invalid endpoint {endpoint!r}: expected {FORMS}")
    if scheme in ("ipc", "inproc"):
        return endpoint
    if scheme != "tcp":
        raise invalid(f"invalid endpoint {endpoint!r}: unsupported transport {scheme!r} (expected {FORMS})")
    host, port, _ = _tcp(endpoint)
    if not host or port is None or port == 0 or rest != urlsplit(endpoint).netloc or "@" in rest:
        raise invalid(f"invalid endpoint {endpoint!r}: expected tcp://HOST:PORT (nothing after the "
                      "port), e.g. tcp://127.0.0.1:6464")
    return endpoint


def check_listen(endpoint: object, allow_remote: bool, setting: str = "bind") -> None:
    """Reject a malformed endpoint to listen on, or a non-loopback TCP one
    unless allowed: InvalidEndpoint, its message starting with ``setting``
    (the BrokerConfig field)."""
    def invalid(why: str) -> InvalidEndpoint:
        return InvalidEndpoint(f"{setting}: {why}", str(endpoint), setting=setting)
    scheme, _rest = _local_part(endpoint, invalid)
    assert isinstance(endpoint, str)
    if scheme in ("ipc", "inproc"):
        return
    if scheme != "tcp":
        raise invalid(f"unsupported endpoint {endpoint!r}: use {FORMS}")
    host, port, readable = _tcp(endpoint)
    if not readable:
        raise invalid(f"bad port in {endpoint!r}")
    if not host or port is None:
        raise invalid(f"endpoint {endpoint!r} needs a host and a port, e.g. tcp://127.0.0.1:6464")
    if allow_remote or host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise invalid(f"{endpoint!r} is not a loopback address; pass allow_remote=True "
                  f"(--allow-remote) to listen beyond this machine")
