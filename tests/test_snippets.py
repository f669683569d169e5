"""Every Python snippet of README.md and docs/ runs, as a reader would run
it (issue 23 item 4: they were only type-checked, and several read names
nothing defined).

Each snippet runs in a fresh interpreter, from a scratch directory, after
the prelude of tests/snippets.py (the names a reader brings: a channel, a
Redis URL, ...).  What a snippet needs from this machine is given, never
faked: a broker on the README's default endpoint (127.0.0.1:6464) for the
snippets that use ``fastbus.Client()`` without one, key files made by
``fastbus keygen`` for the CURVE snippet, a real Redis-compatible server
(every ``redis://host:port`` URL in a snippet is pointed at it, as a
reader points the docs' URL at their own), and a scratch directory for
``/data/...`` paths.  The Spark snippets run in tests/test_spark.py's Spark
session (a JVM of their own cost 20-40 s of the run).  A snippet passes when it
exits 0 (a snippet that runs for ever, the README's first, passes when it
has printed what it says it prints).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from snippets import all_snippets, for_this_machine, is_spark, prelude

#: Snippets (by a line of them) with their own needs: ``broker`` (a broker
#: on 127.0.0.1:6464), ``until`` (it runs for ever: what it must print),
#: ``setup`` (shell commands first, in its directory).
NEEDS = {
    "for message in p.listen():": {"broker": True, "until": "'data': b'hello'"},
    'client = fastbus.Client(host="127.0.0.1", port=6464)': {"broker": True},
    'layer = ChannelLayer("tcp://127.0.0.1:6464")': {"broker": True, "until": "'text': 'hi'"},
    'durable="billing-worker"': {"broker": True},
    'headers={"content-type": "application/json", "id": "7"}': {"broker": True},
    'client.request("time.now", b"", timeout=5)': {"broker": True},
    'w.subscribe("jobs", queue="workers")': {"broker": True},
    'client.hold("thumbnails", queue="workers", expiry=60)': {"broker": True},
    'client.bind("uploads", "thumbnails", queue="workers", capacity=100)': {"broker": True,
                                                                          "until": "b'thumbnails' b'photo 4'"},
    "fastbus.curve.client_keys": {"setup": ["keygen --name server", "keygen --dir clients --name client"]},
}
DEFAULT_PORT = 6464

# Several snippets take the README's port 6464, one after another: pyproject's
# --dist loadfile keeps this module's tests on one worker, and no other
# module uses that port.


SNIPPETS = all_snippets()
PLAIN = [(where, code) for where, code in SNIPPETS if not is_spark(code)]
SPARK = [(where, code) for where, code in SNIPPETS if is_spark(code)]


def _needs(code: str) -> dict:
    found = [n for key, n in NEEDS.items() if key in code]
    return found[0] if found else {}


def _port_free(port: int) -> bool:
    """Nothing listens on it (a port a test's broker just left, in
    TIME_WAIT, is free for the next: brokers bind with SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_every_snippet_is_found():
    assert len(SNIPPETS) >= 17 and len(SPARK) >= 5, [w for w, _c in SNIPPETS]
    for key in NEEDS:                              # no stale entry
        assert any(key in code for _w, code in SNIPPETS), key


@pytest.mark.parametrize("where,code", PLAIN, ids=[w for w, _c in PLAIN])
def test_snippet_runs(where, code, brokers, redis_url, tmp_path):
    needs = _needs(code)
    broker = None
    if needs.get("broker"):
        if not _port_free(DEFAULT_PORT):
            pytest.skip(f"{where} needs the README's default endpoint, and port {DEFAULT_PORT} is in use here")
        broker = brokers(port=DEFAULT_PORT)
    for cmd in needs.get("setup", []):
        r = subprocess.run([sys.executable, "-m", "fastbus", *cmd.split()], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    script = tmp_path / "snippet.py"
    script.write_text(for_this_machine(prelude(code) + "\n" + code, redis_url, tmp_path))
    env = {**os.environ, "FASTBUS_REDIS_URL": redis_url, "PYTHONSAFEPATH": "1"}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        if "until" in needs:
            seen = []
            for line in proc.stdout:               # (bounded: the kill below ends it)
                seen.append(line)
                if needs["until"] in line:
                    break
                if len(seen) > 100:
                    break
            assert any(needs["until"] in s for s in seen), f"{where} printed:\n{''.join(seen)}"
        else:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"{where} failed:\n{out}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if broker is not None:
        assert broker.proc.poll() is None
