"""Helpers for tests that run real brokers in subprocesses, on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from fastbus.cli import query_stats


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProcess:
    """`fastbus broker` in a subprocess; stop() or kill() it by its own pid."""

    def __init__(self, *args: str, port: int | None = None, curve: tuple | None = None) -> None:
        self.curve = curve          # (broker public, client public, client secret) for stats
        self.port = port or free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.args = ["--bind", self.endpoint, "--log-level", "WARNING", "--stats-interval", "0", *args]
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self, timeout: float = 20.0) -> None:
        self._cwd = tempfile.TemporaryDirectory()
        self._log = open(os.path.join(self._cwd.name, "broker.log"), "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "fastbus", "broker", *self.args],
                                     cwd=self._cwd.name, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            try:
                query_stats(self.endpoint, timeout=0.3, curve=self.curve)
                return
            except TimeoutError:
                continue
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


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def python_process(script: str, *args: str, **kw) -> subprocess.Popen:
    """`python -c script args` from a neutral directory (so the installed
    fastbus is imported, not the source tree)."""
    cwd = tempfile.mkdtemp()
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=cwd, **kw)
