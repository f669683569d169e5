"""The wheel matrix promised in pyproject.toml's [tool.cibuildwheel]: checked
with cibuildwheel itself (--print-build-identifiers), since the containers
and runners that build the wheels are not available here."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from conftest import REPO

pytest.importorskip("cibuildwheel", reason="cibuildwheel is not installed (pip install '.[test]')")

PYTHONS = ["cp311", "cp312", "cp313", "cp314"]


def identifiers(platform: str) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "cibuildwheel", "--platform", platform,
                          "--print-build-identifiers"], cwd=REPO, capture_output=True, text=True,
                         check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_linux_wheels_are_manylinux_2_28_and_musllinux_on_x86_64_and_aarch64():
    want = {f"{py}-{libc}_{arch}" for py in PYTHONS for libc in ("manylinux", "musllinux")
            for arch in ("x86_64", "aarch64")}
    assert identifiers("linux") == want
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    assert {config[f"manylinux-{a}-image"] for a in ("x86_64", "aarch64")} == {"manylinux_2_28"}
    assert {config[f"musllinux-{a}-image"] for a in ("x86_64", "aarch64")} == {"musllinux_1_2"}
    assert "auditwheel show" in config["linux"]["repair-wheel-command"]


def test_macos_wheels_for_intel_and_apple_silicon():
    assert identifiers("macos") == {f"{py}-macosx_{arch}" for py in PYTHONS for arch in ("x86_64", "arm64")}


def test_no_windows_wheels_until_the_core_builds_with_msvc():
    assert identifiers("windows") == set()
