"""The Django Channels chat example (examples/chat) on fastbus's channel
layer, end to end: a real broker, the example served by two daphne
processes, and pages open at the same time in one headless Chromium, driven
over the DevTools protocol (on a pipe: no WebSocket client needed).  Two
pages of one room, on different app processes, each send a message through
the page's form; each must show both messages, once each, and a page of
another room neither.

"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from brokers import browser, free_port

pytest.importorskip("django")
pytest.importorskip("channels")
pytest.importorskip("daphne")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "chat"


def _stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL: this process only, by its own pid."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _tail(f, n: int = 4000) -> str:
    f.flush()
    f.seek(0)
    return f.read()[-n:]


class Chromium:
    """Headless Chromium with --remote-debugging-pipe: DevTools protocol
    messages are JSON ending in NUL, commands read from Chromium's fd 3,
    answers and events written to its fd 4."""

    def __init__(self, browser: str, profile: str, log) -> None:
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()
        # Above 9, so that moving them to 3 and 4 in the child clobbers neither.
        child_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(out_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(cmd_r)
        os.close(out_w)

        def fds_3_and_4():              # dup2's copies are inheritable
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        try:
            # close_fds=False keeps 3 and 4; Python's own fds are close-on-exec.
            self.proc = subprocess.Popen(
                [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-proxy-server", "--no-first-run", f"--user-data-dir={profile}",
                 "--remote-debugging-pipe", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                close_fds=False, preexec_fn=fds_3_and_4)
        finally:
            os.close(child_r)
            os.close(child_w)
        self._buf = b""
        self._id = 0

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 15.0) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self._cmd_w, data):]
        deadline = time.monotonic() + timeout
        while True:                     # events (no "id") are not needed here
            reply = self._next(deadline, method)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"DevTools {method}: {reply['error']}")
                return reply["result"]

    def _next(self, deadline: float, method: str) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from Chromium to {method}")
            if select.select([self._out_r], [], [], left)[0]:
                chunk = os.read(self._out_r, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"Chromium exited ({self.proc.poll()}) during {method}")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def open(self, url: str) -> str:
        """A new page at url; its DevTools session id."""
        # The first command waits for Chromium to start: a loaded machine is slow.
        target = self.call("Target.createTarget", {"url": url}, timeout=30)["targetId"]
        return self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def eval(self, session: str, expression: str):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression!r} raised in the page: {r['exceptionDetails']}")
        return r["result"].get("value")

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call("Browser.close", timeout=5)
                self.proc.wait(10)
        except (OSError, RuntimeError, TimeoutError, subprocess.TimeoutExpired):
            pass
        finally:
            _stop(self.proc)
            os.close(self._cmd_w)
            os.close(self._out_r)


def _get(url: str, timeout: float = 2.0) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # loopback: no proxy
    with opener.open(url, timeout=timeout) as r:
        return r.status


def _start_daphne(endpoint: str, port: int, log) -> subprocess.Popen:
    """The example under daphne, on loopback; returns once it serves a page."""
    env = dict(os.environ, FASTBUS_ENDPOINT=endpoint, DJANGO_SETTINGS_MODULE="chat.settings")
    env.pop("PYTHONPATH", None)
    # From the example's directory (so "chat" is importable, and the installed
    # fastbus rather than the source tree).
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                             "chat.asgi:application"],
                            cwd=EXAMPLE, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"daphne exited with {proc.returncode}:\n{_tail(log)}")
        try:
            if _get(f"http://127.0.0.1:{port}/chat/lobby/") == 200:
                return proc
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.1)
    _stop(proc)
    raise AssertionError(f"daphne did not serve the example within 30 s:\n{_tail(log)}")


LOG = "Array.from(document.querySelectorAll('#log li'), li => li.textContent)"
STATE = "document.body ? document.body.dataset.state : 'loading'"


def _say(text: str) -> str:
    """JS that sends text through the page's form, as a person would."""
    return (f"document.getElementById('message').value = {json.dumps(text)};"
            "document.getElementById('send').click()")


def test_pages_of_a_room_on_two_app_processes_see_each_others_messages(brokers, tmp_path):
    path = browser()
    if path is None:
        pytest.skip("no Chromium here (.ci/run installs Debian's chromium; apt-get install chromium)")
    b = brokers()
    # Two app processes on one broker: what one page says reaches the other
    # only through fastbus.  name: (app, room)
    pages = {"alice": (0, "lobby"), "bob": (1, "lobby"), "carol": (1, "elsewhere")}
    said = {"alice": "hello from alice", "bob": "hi alice, bob here"}
    expected = sorted(f"{n}: {t}" for n, t in said.items())
    apps: list[tuple[subprocess.Popen, object, str]] = []       # (daphne, its log, base URL)
    try:
        for i in range(2):
            log = open(tmp_path / f"daphne-{i}.log", "w+")
            try:
                port = free_port()
                apps.append((_start_daphne(b.endpoint, port, log), log, f"http://127.0.0.1:{port}"))
            except BaseException:
                log.close()
                raise
        with tempfile.TemporaryDirectory() as profile, open(tmp_path / "chromium.log", "w+") as clog:
            chrome = Chromium(path, profile, clog)
            try:
                sessions = {n: chrome.open(f"{apps[app][2]}/chat/{room}/?name={n}")
                            for n, (app, room) in pages.items()}

                def logs() -> dict:
                    return {n: chrome.eval(s, LOG) for n, s in sessions.items()}

                def why() -> str:
                    return f"pages: {logs()}" + "".join(f"\ndaphne {i}:\n{_tail(log)}"
                                                       for i, (_, log, _) in enumerate(apps))

                # Every page connected: each consumer has joined its group
                # (group_add comes before accept), before anyone speaks.
                deadline = time.monotonic() + 20
                while (states := {n: chrome.eval(s, STATE) for n, s in sessions.items()}) != \
                        dict.fromkeys(pages, "open"):
                    assert "closed" not in states.values(), f"a socket closed: {states}\n{why()}"
                    assert time.monotonic() < deadline, f"pages not connected in 20 s: {states}\n{why()}"
                    time.sleep(0.05)

                for n, text in said.items():
                    chrome.eval(sessions[n], _say(text))

                deadline = time.monotonic() + 15
                while not all(set(expected) <= set(lines) for n, lines in logs().items() if n in said):
                    assert time.monotonic() < deadline, \
                        f"each lobby page should show {expected} within 15 s\n{why()}"
                    time.sleep(0.05)
                time.sleep(0.5)         # then nothing more: no duplicates, nothing in another room
                assert {n: sorted(v) for n, v in logs().items()} == \
                    {"alice": expected, "bob": expected, "carol": []}, why()
            finally:
                chrome.close()
        for i, (proc, log, _) in enumerate(apps):     # a clean exit, and no error logged
            _stop(proc)
            assert proc.returncode in (0, -signal.SIGTERM), f"daphne {i}: {proc.returncode}\n{_tail(log)}"
            assert "Traceback" not in _tail(log, 10 ** 6), f"daphne {i}:\n{_tail(log)}"
    finally:
        for proc, log, _ in apps:
            _stop(proc)
            log.close()
