"""Helpers for tests that run real brokers in subprocesses, on loopback."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import json
import tempfile
import time

import zmq

from fastbus import protocol as P
from fastbus.client import query_stats


#: Broker arguments for a test that asserts what a publisher's filter kept
#: back (``publish(...) == 0``, exact counts): a lease long enough that a
#: loaded machine delaying one lease ping by 0.1 s (the default lease) does
#: not make the publisher stop filtering mid-test.  Tests of the lease
#: itself set their own.
STEADY_FILTER = ("--filter-lease", "5")


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A loopback port free now, chosen below the kernel's ephemeral range:
    a port the kernel handed out (bind to 0) can be handed out again to any
    outgoing connection of a parallel test before the broker binds it, and a
    broker restarted on the same port would meet the same race."""
    low, _ = _ephemeral_range()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(10001, low))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProcess:
    """`fastbus broker` in a subprocess; stop() or kill() it by its own pid."""

    def __init__(self, *args: str, port: int | None = None, curve: tuple | None = None,
                 env: dict | None = None, host: str = "127.0.0.1") -> None:
        self.curve = curve          # (broker public, client public, client secret) for stats
        self.env = env              # the broker process's environment (None: this one's)
        self.proc: subprocess.Popen | None = None
        for attempt in range(5):
            self.port = port or free_port()
            self.endpoint = f"tcp://{host}:{self.port}"
            self.args = ["--bind", self.endpoint, "--log-level", "WARNING", "--stats-interval", "0", *args]
            try:
                self.start()
                return
            except RuntimeError as exc:   # another test took the port we chose: choose again
                if port is not None or "address already in use" not in str(exc) or attempt == 4:
                    raise

    def start(self, timeout: float = 20.0) -> None:
        self._cwd = tempfile.TemporaryDirectory()
        self._log = open(os.path.join(self._cwd.name, "broker.log"), "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "fastbus", "broker", *self.args],
                                     cwd=self._cwd.name, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            try:
                query_stats(self.endpoint, timeout=0.3, curve=self.curve)
                return
            except TimeoutError:             # refused at once while it starts: not a busy loop
                time.sleep(0.05)
        self.kill()        # never leave a broker behind
        raise RuntimeError(f"broker did not start:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def stats(self) -> dict:
        try:
            return query_stats(self.endpoint, timeout=5, curve=self.curve)
        except TimeoutError as exc:
            state = "running" if self.proc.poll() is None else f"exited with {self.proc.returncode}"
            raise TimeoutError(f"{exc} (broker {state}); its log:\n{self.log()[-5000:]}") from None

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode if self.proc else 0


def browser() -> str | None:
    """A Chromium (or Chrome) on PATH, for the tests that open a page in it
    (.ci/run installs Debian's chromium)."""
    import shutil
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02, what="condition"):
    """predicate()'s first true value, polled every `interval` s; past
    `timeout` an AssertionError naming `what` (a str, or a callable giving
    one then: where things stood, for a failure that is hard to reproduce)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")


def python_process(script: str, *args: str, **kw) -> subprocess.Popen:
    """`python -c script args` from a neutral directory (so the installed
    fastbus is imported, not the source tree)."""
    cwd = tempfile.mkdtemp()
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=cwd, **kw)


# -- clients and raw sockets -------------------------------------------------

def confirm(p, n: int, kind: str = None) -> list:
    got = []
    while len(got) < n:
        m = p.get_message(timeout=5)
        assert m is not None, f"only {len(got)} of {n} confirmations"
        if kind is None or m["type"] == kind:
            got.append(m)
    return got


def wait_wanted(client, *channels, timeout: float = 10.0) -> None:
    """Until the publisher's filter is active and wants every channel (the
    view follows confirmations by a moment; docs/PROTOCOL.md)."""
    wait_for(lambda: client.stats()["filter_active"] and all(client.is_wanted(c) for c in channels),
             timeout=timeout, what=f"the publisher to want {channels}")


def collect(p, n: int, timeout: float = 10.0) -> list:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        m = p.get_message(timeout=0.1)
        if m is not None and m["type"] in ("message", "pmessage"):
            out.append(m)
    return out


def quiet(p, seconds: float = 0.3) -> list:
    """Data messages arriving within `seconds` (expected: none)."""
    return collect(p, 10 ** 9, timeout=seconds)


def raw_dealer(endpoint: str) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger = 0
    s.connect(endpoint)
    return s


def expect_kick(s: zmq.Socket, timeout: float = 10.0) -> str:
    """The reason of the next KICK (other messages, pings included, skipped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if s.poll(500):
            frames = s.recv_multipart()
            if frames[0] == P.KICK:
                return json.loads(frames[1])["reason"]
    raise AssertionError(f"no KICK from the broker within {timeout} s")
