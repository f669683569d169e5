"""The client's own ZMTP connection (fastbus.client._engine.Stream,
csrc/fb_zmtp.h) against libzmq itself: a pyzmq ROUTER on loopback must see
an ordinary DEALER, and a broker an ordinary client.  (csrc/tests/test_zmtp.c
plays the peer byte by byte; this checks what libzmq really sends.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import zmq

import fastbus
from fastbus.client import _engine
from fastbus.endpoints import sockaddr

from brokers import BrokerProcess, wait_for

pytestmark = pytest.mark.skipif(not os.uname().sysname == "Linux",
                                reason="a Stream needs Linux")


def stream(endpoint: str, **options) -> _engine.Stream:
    s = _engine.Stream(sockaddr(endpoint))
    for name, value in options.items():
        setattr(s, name, value)
    s.connect(endpoint)
    return s


def router_recv(r: zmq.Socket, s: _engine.Stream, timeout: float = 5.0) -> list:
    """The router's next message, the Stream driven meanwhile (it moves,
    its handshake too, only when called: in a client its native reader
    thread, or the caller, does)."""
    deadline = time.monotonic() + timeout
    while not r.poll(0):
        assert time.monotonic() < deadline, "nothing reached the router"
        s.poll(5)
    return r.recv_multipart()


def recv(s: _engine.Stream, timeout: float = 5.0) -> list:
    assert s.poll(int(timeout * 1000)), "nothing arrived"
    return s.recv_multipart(zmq.NOBLOCK)


@pytest.fixture
def router():
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.linger = 0
    port = r.bind_to_random_port("tcp://127.0.0.1")
    yield r, f"tcp://127.0.0.1:{port}"
    r.close()
    ctx.term()


def test_a_router_sees_a_dealer_and_messages_go_both_ways_whole(router):
    r, endpoint = router
    s = stream(endpoint)
    try:
        big = os.urandom(1 << 20)                  # 8-byte frame sizes, many reads
        s.send_multipart([b"HELLO", b"{}"])
        s.send_multipart([b"P", big])
        ident, *frames = router_recv(r, s)
        assert frames == [b"HELLO", b"{}"]
        assert router_recv(r, s)[1:] == [b"P", big]
        assert s.connected
        for i in range(200):                     # more than one kernel read's worth
            r.send_multipart([ident, b"D", b"%d" % i, big[:i * 500]])
        for i in range(200):
            assert recv(s) == [b"D", b"%d" % i, big[:i * 500]]
        assert s.stats["protocol_errors"] == 0 and s.stats["connects"] == 1
    finally:
        s.close(0)
    assert s.closed
    with pytest.raises(zmq.ZMQError):
        s.send_multipart([b"x"], zmq.NOBLOCK)


def test_what_is_sent_before_the_broker_listens_goes_once_it_does(tmp_path):
    endpoint = f"ipc://{tmp_path}/b.sock"
    s = stream(endpoint, reconnect_ivl=10)
    try:
        s.send_multipart([b"HELLO", b"1"])
        s.send_multipart([b"PING", b""])
        assert not s.connected
        time.sleep(0.1)
        ctx = zmq.Context()
        r = ctx.socket(zmq.ROUTER)
        r.linger = 0
        r.bind(endpoint)
        assert router_recv(r, s)[1:] == [b"HELLO", b"1"]
        assert router_recv(r, s)[1:] == [b"PING", b""]
        r.close()
        ctx.term()
    finally:
        s.close(0)


def test_a_router_that_goes_and_comes_back(tmp_path):
    ctx = zmq.Context.instance()
    endpoint = f"ipc://{tmp_path}/b.sock"         # (a TCP port may be taken meanwhile)
    r = ctx.socket(zmq.ROUTER)
    r.linger = 0
    r.bind(endpoint)
    s = stream(endpoint, reconnect_ivl=10)
    try:
        s.send_multipart([b"HELLO"])
        ident = router_recv(r, s)[0]
        r.send_multipart([ident, b"D", b"before"])
        time.sleep(0.1)
        r.close()
        # What arrived whole before the broker went is still read.
        assert recv(s) == [b"D", b"before"]
        r2 = ctx.socket(zmq.ROUTER)
        r2.linger = 0
        r2.bind(endpoint)
        try:
            # (A message written before the end of the old connection is
            # read would be lost with it, as with libzmq: wait for that.)
            deadline = time.monotonic() + 5
            while not (s.connected and s.stats["disconnects"]) and time.monotonic() < deadline:
                s.poll(10)
            assert s.connected
            s.send_multipart([b"HELLO", b"again"])
            assert router_recv(r2, s)[1:] == [b"HELLO", b"again"]
            assert s.stats["connects"] == 2 and s.stats["disconnects"] == 1
        finally:
            r2.close()
    finally:
        s.close(0)


def test_its_descriptor_wakes_a_poller_for_input_and_is_quiet_once_read(router):
    r, endpoint = router
    s = stream(endpoint)
    try:
        s.send_multipart([b"HELLO"])
        ident = router_recv(r, s)[0]
        while _engine.recv_frames(s) is not None:
            pass
        assert zmq.zmq_poll([(s.FD, zmq.POLLIN)], 50) == []
        r.send_multipart([ident, b"D", b"x"])
        ready = zmq.zmq_poll([(s.FD, zmq.POLLIN)], 2000)
        assert ready == [(s.FD, zmq.POLLIN)]
        assert _engine.events(s) & zmq.POLLIN
        assert _engine.recv_frames(s) == [b"D", b"x"]
        assert _engine.recv_frames(s) is None
        assert zmq.zmq_poll([(s.FD, zmq.POLLIN)], 50) == []
    finally:
        s.close(0)


def test_a_peer_that_is_not_a_zmtp_router_is_dropped_not_believed():
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    endpoint = f"tcp://127.0.0.1:{lsock.getsockname()[1]}"
    s = stream(endpoint, reconnect_ivl=10, maxmsgsize=1000)
    conns = []

    def serve():
        for reply in (b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"." * 64,
                      # a ROUTER's greeting and READY, then a frame over maxmsgsize
                      bytes([0xFF] + [0] * 7 + [1, 0x7F, 3, 0]) + b"NULL".ljust(20, b"\0") + bytes(32)
                      + b"\x04\x1c\x05READY\x0bSocket-Type\x00\x00\x00\x06ROUTER"
                      + b"\x02" + (10**6).to_bytes(8, "big") + b"x" * 1000):
            c, _ = lsock.accept()
            conns.append(c)
            c.recv(4096)
            c.sendall(reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 5
        while s.stats["protocol_errors"] < 2 and time.monotonic() < deadline:
            assert not s.poll(10)                  # nothing of it is a message
        assert s.stats["protocol_errors"] == 2
        assert s.stats["connects"] == 1            # (the second one's handshake was fine)
    finally:
        s.close(0)
        t.join(5)
        for c in conns:
            c.close()
        lsock.close()


def test_sessions_use_it_and_libzmq_where_asked(monkeypatch):
    broker = BrokerProcess()
    try:
        with fastbus.Client(endpoint=broker.endpoint) as c:
            p = c.pubsub(ignore_subscribe_messages=True)
            p.subscribe("a")
            assert isinstance(p._session.sock, _engine.Stream)
            deadline = time.monotonic() + 10
            while not c.is_wanted("a") and time.monotonic() < deadline:
                c.publish("x", b"")
                time.sleep(0.01)
            c.publish("a", b"1")
            m = p.get_message(timeout=5)
            assert m is not None and m["data"] == b"1"
            p.close()
        monkeypatch.setenv("FASTBUS_CLIENT_TRANSPORT", "libzmq")
        with fastbus.Client(endpoint=broker.endpoint) as c:
            p = c.pubsub(ignore_subscribe_messages=True)
            p.subscribe("a")
            assert isinstance(p._session.sock, zmq.Socket)
            p.close()
    finally:
        broker.stop()


def test_sockaddr_of_the_endpoints_a_stream_takes():
    assert sockaddr("tcp://127.0.0.1:5555")[2:8] == b"\x15\xb3\x7f\x00\x00\x01"
    assert sockaddr("tcp://[::1]:5555")[2:4] == b"\x15\xb3"
    assert sockaddr("ipc:///tmp/x.sock")[2:] == b"/tmp/x.sock\0"
    assert sockaddr("ipc://@name")[2:] == b"\0name"
    for other in ("inproc://x", "tcp://*:5555", "tcp://eth0;127.0.0.1:5555", "ipc://" + "x" * 200):
        assert sockaddr(other) is None


@pytest.mark.parametrize("kind", ["path", "abstract", "ipv6"])
def test_ipc_paths_abstract_names_and_ipv6_reach_libzmq(tmp_path, kind):
    ctx = zmq.Context.instance()
    r = ctx.socket(zmq.ROUTER)
    r.linger = 0
    try:
        if kind == "ipv6":
            r.ipv6 = True
            try:
                port = r.bind_to_random_port("tcp://[::1]")
            except zmq.ZMQError:
                pytest.skip("no IPv6 loopback here")
            endpoint = f"tcp://[::1]:{port}"
        else:
            endpoint = f"ipc://{tmp_path}/r.sock" if kind == "path" else f"ipc://@fastbus-test-{os.getpid()}"
            r.bind(endpoint)
        s = stream(endpoint)
        try:
            s.send_multipart([b"HELLO", kind.encode()])
            ident, *frames = router_recv(r, s)
            assert frames == [b"HELLO", kind.encode()]
            r.send_multipart([ident, b"D", b"back"])
            assert recv(s) == [b"D", b"back"]
        finally:
            s.close(0)
    finally:
        r.close()


# A client that reads one channel and prints each message, run where
# /etc/hosts is a file the test writes (a mount namespace of its own).
_MOVING_READER = r"""
import sys, time
import fastbus
with fastbus.Client(sys.argv[1]) as c, c.pubsub(ignore_subscribe_messages=True) as p:
    p.subscribe("moves")
    print("subscribed", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = p.get_message(timeout=0.5)
        if m is not None and m["type"] == "message":
            print(m["data"].decode(), flush=True)
            if m["data"] == b"end":
                break
"""


def _own_hosts_file() -> str | None:
    """Why a process cannot have an /etc/hosts of its own here, or None."""
    if os.geteuid() != 0:
        return "a mount namespace of its own (unshare -m) needs root"
    try:
        r = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare: {exc}"
    return None if r.returncode == 0 else f"unshare -m: {r.stderr.decode(errors='replace').strip()}"


def test_a_host_name_is_looked_up_again_after_a_loss(tmp_path):
    """A broker reached by name moves to another address (as a container
    restarted elsewhere): after the old one goes, the client's connection
    looks the name up again and reaches the broker where it is now.  The
    client runs with an /etc/hosts of its own that the test rewrites."""
    why = _own_hosts_file()
    if why:
        pytest.skip(why)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 fastbus-moved.test\n")
    a = BrokerProcess()
    port = a.port
    reader = subprocess.Popen(
        ["unshare", "-m", "sh", "-c", f'mount --bind "{hosts}" /etc/hosts && exec "$0" -c "$1" "$2"',
         sys.executable, _MOVING_READER, f"tcp://fastbus-moved.test:{port}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=open(tmp_path / "reader.log", "w"), text=True)
    b = None
    try:
        assert reader.stdout.readline().strip() == "subscribed"
        with fastbus.Client(a.endpoint) as pub:
            assert pub.publish("moves", b"one") == 1
        assert reader.stdout.readline().strip() == "one"
        with open(hosts, "r+") as f:                # in place: the bind mount holds this inode
            f.write("127.0.0.2 fastbus-moved.test\n")
            f.truncate()
        a.kill()
        b = BrokerProcess(port=port, host="127.0.0.2")
        wait_for(lambda: b.stats()["subscriptions"] >= 1, timeout=20,
                 what="the client's subscription at the broker's new address")
        with fastbus.Client(b.endpoint) as pub:
            assert pub.publish("moves", b"two") == 1
            pub.publish("moves", b"end")
        assert reader.stdout.readline().strip() == "two", (tmp_path / "reader.log").read_text()
    finally:
        reader.kill()
        reader.wait(10)
        a.kill()
        if b is not None:
            b.kill()
