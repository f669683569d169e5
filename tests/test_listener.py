"""The broker's own ROUTER end (fastbus.broker._relay.Listener,
csrc/fb_zmtp_server.h): by default a broker reads and writes its client
connections in its relay's thread, with no libzmq I/O thread.  Clients
must not tell the difference: fastbus's own (a Stream) and libzmq's DEALER
both talk to it, over TCP, IPv6, ipc paths and abstract names; bad input
closes only the connection that sent it.  (csrc/tests/test_zmtp_server.c
checks the C end with fb_zmtp clients; the whole suite runs against it.)"""

from __future__ import annotations

import contextlib
import os
import socket
import sys

import pytest
import zmq

import fastbus
from fastbus import protocol as P
from fastbus.broker._libzmq import listener

from brokers import collect, confirm, raw_dealer, wait_for

pytestmark = pytest.mark.skipif(listener() is None or not sys.platform.startswith("linux"),
                                reason="a Listener needs the extension, on Linux")


def _pubsub_round(endpoint: str, transport: str, monkeypatch) -> None:
    """A subscriber and a publisher, their connections of ``transport``,
    through the broker at ``endpoint``: 200 messages, in order."""
    monkeypatch.setenv("FASTBUS_CLIENT_TRANSPORT", transport)
    with fastbus.Client(endpoint) as c:
        p = c.pubsub()
        p.subscribe("ch")
        confirm(p, 1)
        for i in range(200):
            c.publish("ch", str(i))
        c.flush(timeout=10)
        got = collect(p, 200)
        assert [m["data"] for m in got] == [str(i).encode() for i in range(200)]
        p.close()


@pytest.mark.parametrize("transport", ["stream", "libzmq"])
def test_a_broker_listens_itself_and_both_kinds_of_client_talk_to_it(monkeypatch, transport):
    with fastbus.Broker(bind=["tcp://127.0.0.1:0"]) as b:
        assert b.transport == "fastbus"
        _pubsub_round(b.endpoints[0], transport, monkeypatch)
        wait_for(lambda: (b.stats()["connections"] or {}).get("accepted", 0) >= 2, what="the stats snapshot")
        st = b.stats()
        assert st["transport"] == "fastbus" and st["connections"]["protocol_errors"] == 0


@pytest.mark.parametrize("kind", ["path", "abstract", "ipv6"])
def test_ipc_paths_abstract_names_and_ipv6(tmp_path, monkeypatch, kind):
    if kind == "path":
        bind = f"ipc://{tmp_path}/fb.sock"
    elif kind == "abstract":
        bind = f"ipc://@fastbus-listener-test-{os.getpid()}"
    else:
        if not socket.has_ipv6:
            pytest.skip("no IPv6")
        bind = "tcp://[::1]:0"
    with fastbus.Broker(bind=[bind]) as b:
        assert b.transport == "fastbus"
        endpoint = b.endpoints[0]
        if kind == "ipv6":
            assert endpoint.startswith("tcp://[::1]:") and not endpoint.endswith(":0")
        else:
            assert endpoint == bind
        for transport in ("stream", "libzmq"):
            _pubsub_round(endpoint, transport, monkeypatch)


def test_libzmq_router_when_asked_or_needed(monkeypatch):
    with fastbus.Broker(bind=["tcp://127.0.0.1:0", "inproc://fastbus-listener-test"]) as b:
        assert b.transport == "libzmq"               # inproc:// is libzmq's alone
        assert b.stats()["connections"] is None
    monkeypatch.setenv("FASTBUS_BROKER_TRANSPORT", "libzmq")
    with fastbus.Broker(bind=["tcp://127.0.0.1:0"]) as b:
        assert b.transport == "libzmq"
        _pubsub_round(b.endpoints[0], "stream", monkeypatch)


def test_address_in_use_and_a_stale_ipc_file(tmp_path):
    with fastbus.Broker(bind=["tcp://127.0.0.1:0"]) as b:
        with pytest.raises(fastbus.errors.AddressInUse):
            fastbus.Broker(bind=b.endpoints).start()
    path = tmp_path / "fb.sock"
    with fastbus.Broker(bind=[f"ipc://{path}"]):
        # A live broker's socket file is not taken over (libzmq's ROUTER
        # would unlink it and leave the first broker unreachable).
        with pytest.raises(fastbus.errors.AddressInUse):
            fastbus.Broker(bind=[f"ipc://{path}"]).start()
    # A file a dead broker left is replaced.
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    assert path.exists()
    with fastbus.Broker(bind=[f"ipc://{path}"]) as b:
        with fastbus.Client(b.endpoints[0]) as c:
            c.publish("x", "y")
            c.flush(timeout=10)


def _raw(endpoint: str, data: bytes) -> socket.socket:
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(data)
    return s


def _closed(s: socket.socket, timeout: float = 5.0) -> bool:
    s.settimeout(timeout)
    try:
        while True:
            if not s.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


@contextlib.contextmanager
def _still_serving(endpoint: str):
    """A client subscribed to "ch" through the broker at ``endpoint``;
    after the block, a message it publishes still reaches it (the broker
    served on through what the block did)."""
    with fastbus.Client(endpoint) as c:
        p = c.pubsub()
        p.subscribe("ch")
        confirm(p, 1)
        yield
        c.publish("ch", "still here")
        c.flush(timeout=10)
        assert [m["data"] for m in collect(p, 1)] == [b"still here"]
        p.close()


GREETING = bytes([0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 3, 0]) + b"NULL" + bytes(48)
READY = b"\x04\x1c\x05READY\x0bSocket-Type\x00\x00\x00\x06DEALER"


def test_bad_input_closes_only_that_connection_and_is_counted():
    with fastbus.Broker(bind=["tcp://127.0.0.1:0"], max_message_bytes=4096, max_payload=1024, max_topic=1024) as b:
        ep = b.endpoints[0]
        with _still_serving(ep):
            bad = [
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(40),          # not ZMTP
                GREETING + b"\x00\x01x",                                   # data before READY
                GREETING + READY + b"\x02" + (1 << 20).to_bytes(8, "big"),  # over max_message_bytes
                GREETING + READY + b"\x04\xff" + b"\x04PING" + bytes(250),  # (a 255-byte command is fine)
            ]
            socks = [_raw(ep, data) for data in bad]
            assert [_closed(s, 5 if i < 3 else 0.5) for i, s in enumerate(socks)] == [True, True, True, False]
            for s in socks:
                s.close()
        wait_for(lambda: b.stats()["connections"]["protocol_errors"] == 3, what="3 protocol errors counted")


def test_a_raw_libzmq_dealer_gets_routing_ids_it_never_sees(monkeypatch):
    """A DEALER that names itself (ZMQ_ROUTING_ID) is still a client: the
    Listener's routing ids are its own, which the peer never sees."""
    with fastbus.Broker(bind=["tcp://127.0.0.1:0"]) as b:
        d = raw_dealer(b.endpoints[0])
        d2 = d.context.socket(zmq.DEALER)
        d2.setsockopt(zmq.ROUTING_ID, b"me")
        d2.linger = 0
        d2.connect(b.endpoints[0])
        for s in (d, d2):
            s.send_multipart([P.HELLO, P.dump_json({"v": 1, "role": "client", "pub": False, "name": "raw"})])
        for s in (d, d2):
            assert s.poll(5000), "no WELCOME"
            frames = s.recv_multipart()
            assert frames[0] == P.WELCOME
        d2.close()
        d.close()


def test_a_connection_that_never_finishes_its_handshake_is_closed(monkeypatch):
    """As libzmq's ROUTER does after ZMQ_HANDSHAKE_IVL (30 s; here 0.3 s):
    a peer that connects and says nothing does not hold a descriptor for
    good, and a client that did finish its handshake stays."""
    from fastbus.broker import loop
    monkeypatch.setattr(loop, "HANDSHAKE_TIMEOUT", 0.3)
    with fastbus.Broker(bind=["tcp://127.0.0.1:0"], probe_interval=0.1) as b:
        ep = b.endpoints[0]
        with _still_serving(ep):
            silent = _raw(ep, b"")
            half = _raw(ep, GREETING[:20])
            assert _closed(silent) and _closed(half)
            silent.close()
            half.close()
            wait_for(lambda: b.stats()["connections"]["handshake_timeouts"] == 2, what="2 handshake timeouts")
