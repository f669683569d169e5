"""A TCP forwarder on loopback that can cut its connections, for fault tests
and benchmarks (bench/fault_bench.py).

    python tests/forwarder.py --listen PORT --target 127.0.0.1:PORT

relays bytes both ways, one outgoing connection per accepted one.  It prints
``ready PORT`` once listening (``--listen 0``: the caller learns the port)
and reads commands on stdin, one a line:

  ``cut S``  closes every live connection, both sides, with SO_LINGER 0 (a
             reset: what is in flight is lost, as in a real network cut);
             connections arriving in the next S seconds are accepted and
             reset at once.  Answers ``cut`` when the sockets are closed and
             ``restored`` when the cut ends (a cut during a cut extends it).
  ``quit``   exits; so does end of file on stdin, so that a forwarder never
             outlives the process that drives it.

Why a process and not a thread of the test: a forwarder in the test's own
interpreter would share its GIL with the clients it measures.  Why one
selectors loop: no threads to coordinate when a cut closes everything, and
with 256 KiB reads straight into one buffer (no copy unless a peer is slow)
it relays well over 100k small messages/s on loopback.  A side whose peer
has bytes waiting is not read (back-pressure, as TCP's): memory stays bounded.

``Forwarder`` starts the script with ``sys.executable`` and drives it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time

BUF = 256 * 1024
RST = struct.pack("ii", 1, 0)                # SO_LINGER on, 0 s: close() sends a reset


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RST)
    sock.close()


def _cut_seconds(line: bytes) -> float | None:
    """S of a line ``cut S`` (0 < S <= 3600), else None."""
    words = line.split()
    try:
        seconds = float(words[1]) if len(words) == 2 and words[0] == b"cut" else 0.0
    except ValueError:
        return None
    return seconds if 0 < seconds <= 3600 else None


class _Side:
    """One socket of a relayed pair; ``out``: bytes read from the peer that
    this socket did not take yet."""
    __slots__ = ("sock", "peer", "out", "events", "eof")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.peer, self.out, self.events, self.eof = sock, None, bytearray(), 0, False


def serve(listen_port: int, target: tuple[str, int]) -> None:
    sel = selectors.DefaultSelector()
    lsock = socket.create_server(("127.0.0.1", listen_port), backlog=512)
    lsock.setblocking(False)
    sel.register(lsock, selectors.EVENT_READ, "listen")
    stdin = sys.stdin.fileno()
    sel.register(stdin, selectors.EVENT_READ, "stdin")
    sides: set[_Side] = set()
    buf = bytearray(BUF)
    view = memoryview(buf)
    cut_until = 0.0
    pending = b""

    def update(s: _Side) -> None:
        """Read s unless its peer has bytes waiting; write s while it has."""
        ev = (0 if s.peer.out or s.eof else selectors.EVENT_READ) | (selectors.EVENT_WRITE if s.out else 0)
        if ev != s.events:
            if not s.events:
                sel.register(s.sock, ev, s)
            elif not ev:
                sel.unregister(s.sock)
            else:
                sel.modify(s.sock, ev, s)
            s.events = ev

    def drop(s: _Side, abrupt: bool) -> None:
        for x in (s, s.peer):
            if x in sides:
                sides.discard(x)
                if x.events:
                    sel.unregister(x.sock)
                _reset(x.sock) if abrupt else x.sock.close()

    def accept() -> None:
        try:
            a, _ = lsock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        if time.monotonic() < cut_until:
            return _reset(a)
        try:                                 # (on loopback a connect is done at once, or refused)
            b = socket.create_connection(target, timeout=2.0)
        except OSError:                      # the target is down: as if it refused
            return _reset(a)
        x, y = _Side(a), _Side(b)
        x.peer, y.peer = y, x
        for s in (x, y):
            s.sock.setblocking(False)
            s.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sides.add(s)
        update(x)
        update(y)

    def relay(s: _Side, ev: int) -> None:
        p = s.peer
        if ev & selectors.EVENT_WRITE and s.out:
            try:
                n = s.sock.send(s.out)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                return drop(s, True)
            del s.out[:n]
            if not s.out and p.eof:
                return drop(s, False)        # the peer closed and all it sent is delivered
        if ev & selectors.EVENT_READ and not p.out:
            try:
                n = s.sock.recv_into(buf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return drop(s, True)
            if not n:
                s.eof = True
                if not p.out:
                    return drop(s, False)
            else:
                try:
                    m = p.sock.send(view[:n])
                except (BlockingIOError, InterruptedError):
                    m = 0
                except OSError:
                    return drop(s, True)
                if m < n:
                    p.out += view[m:n]
        update(s)
        update(p)

    print(f"ready {lsock.getsockname()[1]}", flush=True)
    while True:
        timeout = None if not cut_until else max(0.0, cut_until - time.monotonic())
        for key, ev in sel.select(timeout):
            if key.data == "listen":
                accept()
            elif key.data == "stdin":
                data = os.read(stdin, 4096)
                if not data:
                    return
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip() == b"quit":
                        return
                    if (seconds := _cut_seconds(line)) is None:
                        print(f"error unknown command {line!r}", flush=True)
                        continue
                    for s in list(sides):
                        drop(s, True)
                    cut_until = max(cut_until, time.monotonic() + seconds)
                    print("cut", flush=True)
            elif key.data in sides:          # (not dropped earlier in this round)
                relay(key.data, ev)
        if cut_until and time.monotonic() >= cut_until:
            cut_until = 0.0
            print("restored", flush=True)


class Forwarder:
    """The forwarder script in a subprocess, listening on ``.port`` and
    relaying to ``127.0.0.1:target_port``; ``cut(seconds)``, ``close()``.
    ``cut_at`` / ``restored_at``: time.monotonic() when its last cut began
    and ended (as this process heard of it, within a pipe's delay)."""

    def __init__(self, target_port: int, listen_port: int = 0, target_host: str = "127.0.0.1") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--listen", str(listen_port),
             "--target", f"{target_host}:{target_port}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self._lines: queue.Queue = queue.Queue()
        self.cut_at = self.restored_at = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            word, _, port = self._next(10.0)[1].partition(" ")
            if word != "ready":
                raise RuntimeError(f"forwarder did not start: {word!r}")
        except BaseException:
            self.close()
            raise
        self.port = int(port)

    def _read(self) -> None:
        """A thread: each line of the script's stdout, stamped when it came."""
        for line in self.proc.stdout:
            now = time.monotonic()
            if line.strip() == "restored":
                self.restored_at = now
            self._lines.put((now, line.strip()))
        self._lines.put((time.monotonic(), "exited"))

    def _next(self, timeout: float) -> tuple[float, str]:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("the forwarder did not answer") from None

    def cut(self, seconds: float, timeout: float = 10.0) -> None:
        """Cut every connection for ``seconds``; returns once they are closed."""
        self.restored_at = None
        self.proc.stdin.write(f"cut {seconds}\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            at, line = self._next(max(0.0, deadline - time.monotonic()))
            if line == "cut":
                self.cut_at = at
                return
            if line.startswith("error") or line == "exited":
                raise RuntimeError(f"forwarder: {line}")

    def close(self) -> None:
        """Terminate the script by its pid and wait for it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._reader.join(5)                 # (it reads stdout until the end)
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()

    def __enter__(self) -> Forwarder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", type=int, required=True, help="port on 127.0.0.1 (0: any free one)")
    ap.add_argument("--target", required=True, help="127.0.0.1:PORT")
    args = ap.parse_args()
    host, _, port = args.target.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit("forwarder: loopback targets only (127.0.0.1:PORT)")
    try:
        serve(args.listen, ("127.0.0.1", int(port)))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
