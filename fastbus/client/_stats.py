"""A broker's counters over a short-lived connection (``fastbus stats``, the
demo and tests use it; a running client has ``Client.broker_stats()``)."""

from __future__ import annotations

import zmq

from fastbus import protocol as P
from fastbus.client._endpoint import refused
from fastbus.endpoints import check_connect
from fastbus.errors import BrokerTimeout, BrokerUnavailable, InvalidKey


def query_stats(endpoint: str, timeout: float = 5.0, curve: tuple[str, str, str] | None = None, *,
                clients: bool = False) -> dict:
    """A broker's counters, over a short-lived connection.  ``curve``:
    (broker public key, client public key, client secret key), Z85.
    ``clients``: also one entry per connected peer, under ``"connz"`` (as
    the HTTP endpoint /connz: name, role, address, subscriptions, messages
    and bytes in and out, queued bytes, slow...; a broker older than this
    option leaves it out).  BrokerUnavailable at once if nothing listens
    there (TCP refused, no ipc socket), BrokerTimeout (a TimeoutError) if
    no broker answers within ``timeout`` seconds; InvalidEndpoint,
    InvalidKey for bad arguments."""
    check_connect(endpoint)
    if refused(endpoint, min(timeout, 1.0)):
        raise BrokerUnavailable(f"no broker answered at {endpoint}: connection refused (nothing listens there)",
                                endpoint)
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.ipv6 = True
    try:
        if curve:
            for name, key in zip(("curve_serverkey", "curve_publickey", "curve_secretkey"), curve):
                try:
                    setattr(s, name, key.encode())
                except zmq.ZMQError:
                    raise InvalidKey(f"{key!r} is not a CURVE key (40 Z85 characters)") from None
        s.connect(endpoint)
        if clients:
            s.send_multipart([P.STATS, P.dump_json({"clients": True})])
        else:
            s.send(P.STATS)
        if not s.poll(int(timeout * 1000)):
            hint = " (a CURVE broker that refused these keys answers nothing)" if curve else ""
            raise BrokerTimeout(f"no broker answered at {endpoint} within {timeout:g} s{hint}", endpoint)
        frames = s.recv_multipart()
        if frames[0] != P.STATS_REPLY or len(frames) != 2:
            raise P.ProtocolError(f"unexpected answer from {endpoint}: not a fastbus broker?")
        return P.load_json(frames[1], limit=16 << 20)
    finally:
        s.close()
