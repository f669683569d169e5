"""What a fastbus endpoint is, in one place: ``tcp://HOST:PORT``,
``ipc://PATH`` or ``inproc://NAME``.  ``check_connect`` is the rule for an
endpoint to connect to (a client, a downstream broker's upstream, the
monitor), ``check_listen`` the rule for one to listen on (a broker: port 0
picks a free one, and TCP stays on loopback unless allowed).  Both run
before ZeroMQ sees the endpoint, whose own error is a bare "Invalid
argument"; both raise :class:`~fastbus.errors.InvalidEndpoint`.
``sockaddr`` and ``endpoint_of`` translate an endpoint to and from the
struct sockaddr that fastbus's own transport (csrc/fb_zmtp*.h) takes.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import sys
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
    host, port, readable = _tcp(endpoint)
    if host and (not readable or port == 0):
        raise invalid(f"invalid endpoint {endpoint!r}: the port is a number from 1 to 65535, "
                      f"not {rest.rpartition(':')[2]!r}")
    if not host or port is None or rest != urlsplit(endpoint).netloc or "@" in rest:
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


def sockaddr(endpoint: str, listen: bool = False) -> bytes | None:
    """``endpoint`` (tcp://host:port, ipc://path, ipc://@abstract-name) as
    the struct sockaddr fastbus's own transport connects to (a client's
    Stream) or, with ``listen``, listens on (the broker's Listener: host
    ``*`` is every IPv4 interface, port 0 or ``*`` one the system picks).
    None where it cannot go (another transport or system, a name that does
    not resolve now): libzmq then tries, and says why."""
    if not sys.platform.startswith("linux"):
        return None
    scheme, _, rest = endpoint.partition("://")
    try:
        if scheme == "tcp":
            if ";" in rest:
                return None                       # (libzmq's "source;address" form: libzmq's)
            host, _, port_text = rest.rpartition(":")
            host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
            if listen and port_text == "*":
                port_text = "0"
            port = int(port_text)
            if not host or not 0 <= port <= 65535 or (port == 0 and not listen):
                return None
            if host == "*":
                if not listen:
                    return None
                host = "0.0.0.0"
            family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            if family == socket.AF_INET:
                return (struct.pack("=H", socket.AF_INET) + struct.pack("!H", port)
                        + socket.inet_pton(socket.AF_INET, addr[0]) + bytes(8))
            if family == socket.AF_INET6:
                return (struct.pack("=H", socket.AF_INET6) + struct.pack("!HI", port, addr[2])
                        + socket.inet_pton(socket.AF_INET6, addr[0]) + struct.pack("=I", addr[3]))
            return None
        if scheme == "ipc" and rest:
            path = os.fsencode(rest)
            if path.startswith(b"@"):
                path = b"\0" + path[1:]            # an abstract name
            if len(path) > 107:
                return None
            return struct.pack("=H", socket.AF_UNIX) + path + bytes(1 if path[:1] != b"\0" else 0)
    except (OSError, ValueError, UnicodeError):
        return None
    return None


def host_name(endpoint: str) -> str | None:
    """The host name of a tcp:// endpoint, where it is one to look up (not
    an IP address): what a client's connection looks up again after each
    loss, as libzmq does."""
    scheme, _, rest = endpoint.partition("://")
    if scheme != "tcp" or ";" in rest:
        return None
    host = rest.rpartition(":")[0]
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or host == "*":
        return None
    try:
        ipaddress.ip_address(host.partition("%")[0])
        return None
    except ValueError:
        return host


def endpoint_of(address: bytes) -> str:
    """The endpoint a struct sockaddr (as ``sockaddr`` makes them, or as
    the kernel gives a bound one) names: tcp://IP:PORT, tcp://[IP6]:PORT,
    ipc://PATH or ipc://@NAME."""
    family = struct.unpack_from("=H", address)[0]
    if family == socket.AF_INET:
        port = struct.unpack_from("!H", address, 2)[0]
        return f"tcp://{socket.inet_ntop(socket.AF_INET, address[4:8])}:{port}"
    if family == socket.AF_INET6:
        port = struct.unpack_from("!H", address, 2)[0]
        return f"tcp://[{socket.inet_ntop(socket.AF_INET6, address[8:24])}]:{port}"
    if family == socket.AF_UNIX:
        path = address[2:]
        if path[:1] == b"\0":
            return "ipc://@" + os.fsdecode(path[1:])
        return "ipc://" + os.fsdecode(path.split(b"\0", 1)[0])
    raise ValueError(f"not an address fastbus's transport takes (family {family})")
