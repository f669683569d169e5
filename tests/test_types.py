"""The public API type-checks: ``mypy --strict`` on the README's Python
snippets, on examples/, and on small files that use the API as a user would
(one right, one wrong: mypy must report each wrong use, so that a stub or an
annotation that degrades to ``Any`` fails here).

mypy reads the installed fastbus (its ``.pyi`` stubs for the compiled
extensions and its ``py.typed``), never the source tree: it runs from a
temporary directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is in the test extra")

from snippets import README, SKIP, prelude, readme_snippets  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# pyspark is an optional extra: without it, examples/ cannot see its types.
MYPY_INI = '''\
[mypy]
strict = True
warn_unreachable = True
show_error_codes = True
show_column_numbers = False
pretty = False

[mypy-pyspark.*]
ignore_missing_imports = True
'''


def run_mypy(files: list[Path], workdir: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    ini = workdir / "mypy.ini"
    ini.write_text(MYPY_INI)
    env = dict(os.environ)
    env.pop("MYPYPATH", None)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ini), "--cache-dir", str(cache),
         *[str(f) for f in files]],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy-cache")


def test_stubs_are_installed() -> None:
    """The installed package (built as a wheel by pip) carries the stubs of
    its compiled extensions, next to them, and its py.typed marker."""
    import fastbus._core
    import fastbus.broker

    core = Path(fastbus._core.__file__).parent
    assert (core / "_core.pyi").is_file()
    assert (core / "py.typed").is_file()
    assert (Path(fastbus.broker.__file__).parent / "_relay.pyi").is_file()
    # Every public name of the extension is in its stub.
    stub = (core / "_core.pyi").read_text(encoding="utf-8")
    stubbed = set(re.findall(r"^(?:class|def) (\w+)|^(\w+):", stub, re.M))
    names = {a or b for a, b in stubbed}
    public = {n for n in dir(fastbus._core) if not n.startswith("_")} - {
        "array", "os",                                                  # modules it imports
        "BatchError", "FastbusError", "ForwarderError", "NotSubscribedError"}
    assert public <= names, sorted(public - names)


#: What stubtest may report and the stubs rightly leave out: Cython's own
#: module attributes, the C functions _core shares with the extensions that
#: cimport it (__pyx_capi__), constructors (a cdef class takes its arguments in
#: __cinit__, which stubtest cannot see), and the buffer protocol methods
#: that Python 3.12+ shows on Batch (the stub has them so that a Batch is a
#: Buffer on every version).
STUBTEST_ALLOW = """\
fastbus\\..*__reduce_cython__
fastbus\\..*__setstate_cython__
fastbus\\..*__test__
fastbus\\._core\\.\\w+\\.__init__
fastbus\\._core\\.__pyx_capi__
fastbus\\._publisher\\.\\w+\\.__init__
fastbus\\.queue\\._layout\\.\\w+\\.__init__
fastbus\\.broker\\._relay\\.(Relay|Listener)\\.__init__
fastbus\\._core\\.Batch\\.__buffer__
fastbus\\._core\\.Batch\\.__release_buffer__
"""


def test_stubs_match_the_extensions(tmp_path: Path) -> None:
    """mypy's stubtest compares the stubs with the compiled modules: every
    public name is stubbed, and functions' parameters (names, kinds,
    defaults) agree."""
    allow = tmp_path / "allow.txt"
    allow.write_text(STUBTEST_ALLOW)
    cmd = [sys.executable, "-m", "mypy.stubtest", "--allowlist", str(allow), "--ignore-unused-allowlist"]
    help_text = subprocess.run(cmd[:3] + ["--help"], capture_output=True, text=True, timeout=60).stdout
    if "--ignore-disjoint-bases" in help_text:     # PEP 800 markers: not needed by users' type checks
        cmd.append("--ignore-disjoint-bases")
    r = subprocess.run(cmd + ["fastbus._core", "fastbus._publisher", "fastbus._decoders", "fastbus.queue._layout",
                                 "fastbus.broker._relay"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_readme_finds_snippets() -> None:
    snippets = readme_snippets()
    # Most of the README's Python is checked; the markers stay rare.
    assert len(snippets) >= 8, snippets
    assert README.read_text(encoding="utf-8").count(SKIP) <= 3


def test_readme_snippets_and_examples_pass_mypy_strict(tmp_path: Path, mypy_cache: Path) -> None:
    files = []
    origin = {}
    for line, code in readme_snippets():
        f = tmp_path / f"readme_line_{line}.py"
        head = prelude(code) + "\n"
        f.write_text(head + code)
        files.append(f)
        origin[f.name] = (line, head.count("\n"))
    examples = sorted(EXAMPLES.glob("*.py"))
    assert examples, "examples/ has no Python file"
    for ex in examples:
        f = tmp_path / f"example_{ex.name}"
        f.write_text(ex.read_text(encoding="utf-8"))
        files.append(f)
    r = run_mypy(files, tmp_path, mypy_cache)
    report = r.stdout + r.stderr

    def where(m: re.Match[str]) -> str:      # an error's place in README.md
        name, n = m.group(1), int(m.group(2))
        if name in origin:
            first, skip = origin[name]
            return f"README.md:{first + n - skip - 1}"
        return m.group(0)

    report = re.sub(r"(readme_line_\d+\.py):(\d+)", where, report)
    assert r.returncode == 0, report


GOOD = '''\
from __future__ import annotations

import fastbus
import fastbus.errors
from fastbus.queue import AsyncWorkQueue, Consumer, Message, WorkQueue
from fastbus.redis import BufferedPublisher


def work(q: WorkQueue) -> bytes:
    with q.consumer("worker-1") as c:
        m: Message | None = c.get(timeout=1)
        if m is not None:                  # reachable: get() may return a message
            payload: bytes = m.payload
            ident: int = m.id
            print(ident, m.deliveries + 1, m.created_at / 2)
            m.ack()
            return payload
        batch: list[Message] = c.get_many(10, timeout=0.1)
        c.settle(ack=batch[:1], reject=batch[1:2], requeue=batch[2:])
    return b""


def route(t: fastbus.Trie, topics: list[bytes]) -> int:
    ids: list[int] = t.match(b"news")
    offsets, flat = t.match_flat(topics)
    return len(ids) + len(offsets) + sum(flat) + sum(t.stats().values())


def codec() -> list[tuple[bytes, bytes]]:
    batch: fastbus.Batch = fastbus.encode([(b"t", b"p"), ("s", "q", {"h": "v"})])
    view = memoryview(batch)
    triples: list[tuple[bytes, bytes, dict[str, bytes] | None]] = fastbus.decode(view, headers=True)
    either = fastbus.decode(view)              # pairs, and triples for records with headers
    return fastbus.decode(view, headers=False) + batch.records(headers=False)[:len(triples) - len(either)]


def publish(client: fastbus.Client, c: Consumer) -> int:
    client.flush(timeout=1.0)
    queued: int = client.stats()["queued"]
    return client.publish("news", "hello") + client.publish(b"news", 3.5) + queued


async def awork(q: AsyncWorkQueue) -> bytes:
    async with q.consumer("worker-1") as c:
        m = await c.get(timeout=1)
        if m is not None:
            await c.ack(m)
            return m.payload
    return b""


def redis_side(broker: fastbus.Broker) -> int:
    try:
        with BufferedPublisher(None) as pub:
            n: int = pub.publish("news", 1)
            counts: dict[str, int] = pub.stats()
    except fastbus.errors.ServerTimeout as exc:
        return len(str(exc))
    uptime: float = broker.stats()["uptime_s"]
    return n + counts["published"] + int(uptime)
'''

#: Each wrong use, with a fragment of what mypy must say about its line.
BAD = [
    ("m = c.get(timeout=1)\n    return m.payload", "union-attr"),
    ("ids: list[str] = t.match(b'news')\n    return b''", "assignment"),
    ("r: list[tuple[str, str]] = fastbus.decode(b'')\n    return b''", "assignment"),
    ("return client.stats()", "return-value"),
    ("client.publish('news', None)\n    return b''", "arg-type"),
    ("s: int = fastbus.Broker().stats()\n    return b''", "assignment"),
    ("client.flush(timeout='soon')\n    return b''", "arg-type"),
    ("e: int = fastbus.errors.ServerTimeout('x')\n    return b''", "assignment"),
    ("c.ack('not a message')\n    return b''", "arg-type"),
    ("t.add(b'k', 1, True)\n    return b''", "call-arg"),
    ("fastbus.Client(max_mesages=1)\n    return b''", "call-arg"),      # (redis-py's keywords are typed)
]


def test_typed_usage_checks(tmp_path: Path, mypy_cache: Path) -> None:
    good = tmp_path / "good_usage.py"
    good.write_text(GOOD)
    r = run_mypy([good], tmp_path, mypy_cache)
    assert r.returncode == 0, r.stdout + r.stderr


def test_wrong_usage_is_reported(tmp_path: Path, mypy_cache: Path) -> None:
    head = textwrap.dedent('''\
        import fastbus
        from fastbus.queue import Consumer


        ''')
    files = []
    for i, (body, _code) in enumerate(BAD):
        f = tmp_path / f"bad_{i}.py"
        f.write_text(head + "def f(c: Consumer, t: fastbus.Trie, client: fastbus.Client) -> bytes:\n"
                     "    " + body + "\n")
        files.append(f)
    r = run_mypy(files, tmp_path, mypy_cache)
    assert r.returncode == 1, r.stdout + r.stderr
    for f, (body, code) in zip(files, BAD):
        errors = [line for line in r.stdout.splitlines() if line.startswith(f.name + ":") and "error:" in line]
        assert errors, f"mypy accepted {body!r}:\n{r.stdout}"
        assert any(f"[{code}]" in e for e in errors), (body, errors)
