"""Client endpoints probed, where the transport allows, to tell at once that
nothing listens there (``refused``, ``AbsenceProbe``).  What an endpoint
is: fastbus.endpoints."""

from __future__ import annotations

import math
import socket
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from fastbus import protocol as P
from fastbus.errors import BrokerUnavailable, KeyRefused, NotABroker

if TYPE_CHECKING:
    from fastbus.client._session import Session


def _connect(endpoint: str, timeout: float) -> socket.socket | None:
    """A connection to a tcp:// or ipc:// (path) endpoint, or None for a
    transport that has none to make (inproc://, an abstract ipc name)."""
    scheme, _, rest = endpoint.partition("://")
    if scheme == "tcp":
        parts = urlsplit(endpoint)
        if parts.hostname in (None, "*"):
            return None
        return socket.create_connection((parts.hostname, parts.port), timeout=timeout)
    if scheme == "ipc" and rest and not rest.startswith("@"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(rest)
        except OSError:
            s.close()
            raise
        return s
    return None


def refused(endpoint: str, timeout: float = 1.0) -> bool:
    """True if nothing listens at ``endpoint`` (a TCP connection refused, an
    ipc:// path that is no socket or that nobody accepts on); False if
    something does, or if the transport or the network cannot say at once
    (a timeout, inproc://, an abstract ipc name)."""
    try:
        s = _connect(endpoint, timeout)
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    except (OSError, ValueError):
        return False
    if s is not None:
        s.close()
    return False


def identify(endpoint: str, timeout: float = 0.15) -> str | None:
    """What listens at ``endpoint``, when it can be told that it is not a
    ZeroMQ peer: "a Redis server" (it answers a Redis PING), "an HTTP
    server", or something that spoke first and not ZeroMQ.  None when it
    may be a broker (it sent a ZeroMQ greeting, or nothing: a broker that
    is busy), or nothing can be told (the transport, a timeout).  A ZeroMQ
    peer greets first, so what greets with anything else, or answers the
    line ``PING``, is not one."""
    try:
        s = _connect(endpoint, timeout)
    except (OSError, ValueError):
        return None
    if s is None:
        return None
    with s:
        s.settimeout(timeout)
        try:
            first = s.recv(64)
            if first:
                if first[0] == 0xFF:
                    return None                  # a ZeroMQ greeting
                return f"something that does not speak ZeroMQ (it said {first[:40]!r} first)"
            return None                          # closed at once: it cannot be told
        except TimeoutError:
            pass                                 # silent: it waits for us to speak
        except OSError:
            return None
        try:
            s.sendall(b"PING\r\n")
            reply = s.recv(64)
        except OSError:
            return None
    line = reply.split(b"\r\n", 1)[0][:60]
    if reply[:1] in (b"+", b"-", b"$", b"*", b":"):
        return f"a Redis server (it answered PING with {line.decode('latin-1')!r})"
    if reply.startswith(b"HTTP/"):
        return f"an HTTP server (it answered {line.decode('latin-1')!r})"
    if reply.lstrip()[:1] == b"<" and b"html" in reply.lower():
        return "an HTTP server (it answered with an HTML page)"   # (PING read as an HTTP/0.9 request)
    if reply:
        return f"something that does not speak ZeroMQ (it answered {line!r})"
    return None


#: flush() of a client that has never reached its broker probes the broker's
#: address from PROBE_AFTER seconds on, every PROBE_EVERY; nothing listening
#: there for REFUSED_FOR seconds is BrokerUnavailable, said before the timeout.
PROBE_AFTER = 0.5
PROBE_EVERY = 0.5
REFUSED_FOR = 1.0


class AbsenceProbe:
    """Whether a client that never heard from its broker is talking to no
    one: nothing listening at the address (TCP connection refused, no ipc
    socket) for REFUSED_FOR seconds.  A broker that is starting up, or that
    answered once and is restarting, is waited for as before."""

    def __init__(self, endpoint: str, start: float) -> None:
        self.endpoint = endpoint
        self.start = start
        self.next = start + PROBE_AFTER
        self.refused_since: float | None = None
        self.identified = False                   # what listens there was looked at

    def wake_by(self, session: Session, deadline: float | None) -> float | None:
        """When the flush loop must look again: the deadline, or the next
        probe while the broker was never heard from."""
        if session.instance:                      # it answered: no more probing in this flush
            self.next = math.inf
        if self.next == math.inf:
            return deadline
        return self.next if deadline is None else min(deadline, self.next)

    def check_handshake(self, session: Session) -> None:
        """KeyRefused if the broker refused this CURVE client (the lock held)."""
        if not session.instance:
            why = session.handshake_failure()
            if why:
                raise KeyRefused(f"the broker at {self.endpoint} {why}", self.endpoint)

    def check(self, session: Session, queued: int) -> None:
        """Raise BrokerUnavailable when the time has come."""
        now = time.monotonic()
        if session.instance or now < self.next:
            return
        self.next = now + PROBE_EVERY
        if not refused(self.endpoint, 0.2):
            self.refused_since = None
            if not self.identified:
                self.identified = True
                what = identify(self.endpoint)
                if what is not None:
                    raise NotABroker(f"{self.endpoint} is {what}, not a fastbus broker: fastbus clients talk to "
                                     f"a broker's --bind endpoint ({P.DEFAULT_ENDPOINT} by default: "
                                     f"`fastbus broker`), or its --resp endpoint, where Redis clients "
                                     f"connect too (`fastbus broker --resp tcp://127.0.0.1:6379` in place "
                                     f"of the Redis server)", self.endpoint, what)
            return
        if self.refused_since is None:
            self.refused_since = now
        elif now - self.refused_since >= REFUSED_FOR:
            left = f" ({queued} message(s) stay queued for it)" if queued else ""
            raise BrokerUnavailable(
                f"no broker at {self.endpoint}: connection refused for {now - self.start:.1f} s{left}",
                self.endpoint)
