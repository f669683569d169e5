"""What the tests that run other projects' own suites against fastbus share
(tests/test_redis_py_suite.py, tests/test_channels_redis_suite.py): the
list of expected outcomes, pip into a scratch directory, and a junit
report read back as outcomes."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest


def read_expected(path: Path, outcomes: tuple[str, ...] = ("pass", "n/a", "differs")) -> dict[str, tuple[str, str]]:
    """{test id: (outcome, why)} from a list of ``## outcome: why`` heads,
    each followed by the test ids it covers."""
    out: dict[str, tuple[str, str]] = {}
    outcome = why = None
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            head = line[3:]
            outcome, _, why = head.partition(": ")
            assert outcome in outcomes, f"{path}: unknown outcome {head!r}"
            continue
        if not line.strip() or line.startswith("#"):
            continue
        assert outcome is not None, f"{path}: a test before any '## outcome' line: {line!r}"
        assert line not in out, f"{path}: {line} listed twice"
        out[line] = (outcome, why)
    return out


def pip(*args: str, cwd: Path) -> None:
    """pip, in a test: a failure fails it in CI, and skips it elsewhere
    (no package index here?)."""
    r = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], cwd=cwd,
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        why = f"pip {' '.join(args[:2])} failed: {r.stderr.strip().splitlines()[-1:] or r.stdout[-300:]}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(f"{why} (no package index here?)")


def junit_outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """{test id: (passed | failed | skipped, first line of why)} from a
    junit XML report."""
    out = {}
    for case in ET.parse(junit).iter("testcase"):
        parts = case.get("classname").split(".")
        if parts[-1][:1].isupper():          # a test class's method
            test = f"{'/'.join(parts[:-1])}.py::{parts[-1]}::{case.get('name')}"
        else:                                # a module's function
            test = f"{'/'.join(parts)}.py::{case.get('name')}"
        state, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                state = "skipped" if child.tag == "skipped" else "failed"
                why = (child.get("message") or "").strip().splitlines()[0][:200] if child.get("message") else ""
        out[test] = (state, why)
    return out


def mismatches(got: dict[str, tuple[str, str]], expected: dict[str, tuple[str, str]], listing: str) -> list[str]:
    """Every test whose outcome is not what the list says (a ``pass`` must
    have passed; ``either`` may do anything; anything else must not have
    passed), every test the list does not name, and every listed test that
    did not run."""
    wrong = []
    for test, (state, why) in sorted(got.items()):
        want = expected.get(test)
        if want is None:
            wrong.append(f"{test}: {state}, and not in {listing}")
        elif want[0] == "either":         # a race the test does not control: run, not judged
            continue
        elif (want[0] == "pass") != (state == "passed"):
            wrong.append(f"{test}: {state} ({why}), listed as {want[0]}{': ' + want[1] if want[1] else ''}")
    wrong += [f"{test}: listed in {listing}, not run" for test in sorted(set(expected) - set(got))]
    return wrong


def fetch_suite(root: Path, project: str, version: str, settings: str, plugins: list[str]) -> Path:
    """A project's own tests: its source distribution's ``tests/``,
    ``settings`` (where its pytest configuration is) and LICENSE, from the
    package index, in ``root/src/``; the release itself (never its source
    tree: the suite imports the installed one) and ``plugins`` installed in
    ``root/site`` (for PYTHONPATH).  Returns the source directory."""
    pip("download", "--quiet", "--no-deps", "--no-binary", ":all:", f"{project}=={version}", "-d", "dl", cwd=root)
    pip("install", "--quiet", "--no-deps", "--target", "site", f"{project}=={version}", *plugins, cwd=root)
    (sdist,) = (root / "dl").glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        top = tar.getmembers()[0].name.split("/")[0] + "/"
        members = [m for m in tar.getmembers()
                   if m.name.startswith(top + "tests/") or m.name in (top + settings, top + "LICENSE")]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}   # (Python 3.11.4+)
        tar.extractall(root / "src", members=members, **safe)
    src = root / "src" / top.rstrip("/")
    assert (src / "tests").is_dir() and not (src / project.replace("-", "_")).exists()
    return src
