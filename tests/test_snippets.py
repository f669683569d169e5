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
reader points the docs' URL at their own), a real local Spark for the
Spark snippets (one session, each snippet in a namespace of its own), and
a scratch directory for ``/data/...`` paths.  A snippet passes when it
exits 0 (a snippet that runs for ever, the README's first, passes when it
has printed what it says it prints).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from snippets import DOCS, SPARK_NAMES, prelude, python_snippets, reads

#: Snippets (by a line of them) with their own needs: ``broker`` (a broker
#: on 127.0.0.1:6464), ``until`` (it runs for ever: what it must print),
#: ``setup`` (shell commands first, in its directory).
NEEDS = {
    "for message in p.listen():": {"broker": True, "until": "'data': b'hello'"},
    'client = fastbus.Client(host="127.0.0.1", port=6464)': {"broker": True},
    'layer = ChannelLayer("tcp://127.0.0.1:6464")': {"broker": True, "until": "'text': 'hi'"},
    "fastbus.curve.client_keys": {"setup": ["keygen --name server", "keygen --dir clients --name client"]},
}
DEFAULT_PORT = 6464

# Several snippets take the README's port 6464, one after another: pyproject's
# --dist loadfile keeps this module's tests on one worker, and no other
# module uses that port.


def _snippets() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for line, code in python_snippets(doc, with_skipped=True):
            out.append((f"{doc.name}:{line}", code))
    return out


SNIPPETS = _snippets()
PLAIN = [(where, code) for where, code in SNIPPETS if not reads(code) & set(SPARK_NAMES)]
SPARK = [(where, code) for where, code in SNIPPETS if reads(code) & set(SPARK_NAMES)]


def for_this_machine(code: str, redis_url: str, scratch: Path) -> str:
    """The snippet pointed at this machine's Redis and scratch directory."""
    code = re.sub(r"redis://[\w.\-]+:\d+(?:/\d+)?", redis_url, code)
    return code.replace('"/data/', f'"{scratch}/data/')


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


SPARK_RUNNER = r'''
import json, os, sys, traceback
from pyspark.sql import SparkSession
import fastbus.spark
os.environ["PYSPARK_PYTHON"] = sys.executable
spark = (SparkSession.builder.master("local[2]").appName("fastbus-snippets")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
fastbus.spark.register(spark)                 # $FASTBUS_REDIS_URL: the test's server
rate = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
given = {"spark": spark, "df": spark.createDataFrame([("a", 1)], "k string, n long"),
         "totals": rate.selectExpr("value AS total"), "counts": rate.selectExpr("value AS count")}
failed = {}
for where, code in json.load(open(sys.argv[1])):
    ns = dict(given)
    try:
        exec(compile(code, where, "exec"), ns)
    except Exception:
        failed[where] = traceback.format_exc()
    for q in spark.streams.active:
        q.stop()
print("RESULT " + json.dumps(failed))
spark.stop()
'''


def test_spark_snippets_run(redis_url, tmp_path):
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[test,spark]')")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17+ (java is not on PATH and JAVA_HOME is unset; .ci/run installs it)")
    import json
    snippets = [(where, for_this_machine(prelude(code, leave_out=SPARK_NAMES) + code, redis_url, tmp_path))
                for where, code in SPARK]
    (tmp_path / "snippets.json").write_text(json.dumps(snippets))
    (tmp_path / "run.py").write_text(textwrap.dedent(SPARK_RUNNER))
    env = {**os.environ, "FASTBUS_REDIS_URL": redis_url, "PYTHONSAFEPATH": "1"}
    r = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "snippets.json")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    result = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert result, f"the Spark runner failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    failed = json.loads(result[-1][len("RESULT "):])
    assert not failed, "\n\n".join(f"{w}:\n{tb}" for w, tb in failed.items())
