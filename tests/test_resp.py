"""RESP pipelines in the core, without a server: commands from an Outbox in
RESP mode, replies counted by resp_scan and streamed by RespPump over a real
socket pair."""

from __future__ import annotations

import socket
import threading

import pytest
from fastbus._core import RespPump, resp_scan
from hypothesis import given
from hypothesis import strategies as st

from fastbus import Outbox
from fastbus.errors import BatchError


def pipeline(records, command="PUBLISH") -> bytes:
    box = Outbox(max_messages=0, max_bytes=0, max_delay=None, command=command)
    box.extend(records)
    return bytes(box.take())


def test_commands_are_resp_arrays():
    data = pipeline([(b"news", b"hi"), ("", ""), (b"b", b"\r\n\x00")])
    assert data == (b"*3\r\n$7\r\nPUBLISH\r\n$4\r\nnews\r\n$2\r\nhi\r\n"
                    b"*3\r\n$7\r\nPUBLISH\r\n$0\r\n\r\n$0\r\n\r\n"
                    b"*3\r\n$7\r\nPUBLISH\r\n$1\r\nb\r\n$3\r\n\r\n\x00\r\n")
    assert resp_scan(data)[:2] == (3, len(data))
    with pytest.raises(ValueError, match="Redis command"):
        Outbox(command="PUB LISH")


def test_scan_counts_errors_and_integers():
    replies = b":1\r\n-ERR no\r\n:2\r\n+OK\r\n-WRONGTYPE x\r\n:3"
    n, used, isum, errs, first = resp_scan(replies)
    assert (n, isum, errs, first) == (5, 3, [1, 4], b"ERR no")
    assert used == len(replies) - 2                 # ":3" is not complete yet
    assert resp_scan(replies, max_replies=2)[0] == 2
    many = b"-E\r\n" * 200                          # more errors than one C call reports
    assert resp_scan(many)[3] == list(range(200))


@given(st.binary(max_size=200))
def test_scan_never_crashes_on_garbage(data):
    try:
        n, used, _s, errs, _f = resp_scan(data)
    except BatchError:
        return
    assert used <= len(data) and len(errs) <= n


def test_pump_streams_a_pipeline_through_a_socket():
    """A fake server thread answers each command; the pump writes 50k
    commands (more than the socket buffers hold) while reading replies, and
    leaves the replies it was not asked for in place for the next call."""
    n = 50_000
    data = pipeline([(b"ch", b"%d" % i) for i in range(n)])
    a, b = socket.socketpair()

    def server():
        pending = b""
        answered = 0
        while answered < n:
            chunk = b.recv(65536)
            if not chunk:
                return
            pending += chunk
            k, used, *_ = resp_scan(pending)
            pending = pending[used:]
            b.sendall(b"".join(b":1\r\n" if (answered + i) % 1000 else b"-ERR odd\r\n" for i in range(k)))
            answered += k

    t = threading.Thread(target=server)
    t.start()
    pump = RespPump()
    got, isum, errs, first = pump.pump(a.fileno(), data, n // 2, 10.0)
    assert got == n // 2 and pump.last == (got, isum, errs, first)
    rest = pump.pump(a.fileno(), None, n - got, 10.0)
    assert got + rest[0] == n
    assert first == b"ERR odd"
    assert errs + [e + got for e in rest[2]] == list(range(0, n, 1000))
    assert isum + rest[1] == n - n // 1000
    t.join()
    a.close()
    b.close()


def test_pump_reports_timeouts_closed_peers_and_garbage():
    a, b = socket.socketpair()
    pump = RespPump()
    with pytest.raises(TimeoutError):
        pump.pump(a.fileno(), b"x", 1, 0.05)
    assert pump.last[0] == 0
    b.sendall(b":1\r\n?bad\r\n")
    with pytest.raises(BatchError):
        pump.pump(a.fileno(), None, 2, 1.0)
    assert pump.last[0] == 1 and pump.last[1] == 1      # the reply before the garbage counts
    pump.reset()
    b.close()
    with pytest.raises(ConnectionError):
        pump.pump(a.fileno(), None, 1, 1.0)
    assert pump.last[0] == 0
    a.close()
