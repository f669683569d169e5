"""The wheel matrix promised in pyproject.toml's [tool.cibuildwheel]: checked
with cibuildwheel itself (--print-build-identifiers), since the containers
and runners that build the wheels are not available here.  And the package
data the wheel must carry (the queue's Lua scripts), checked in the
installed package the suite runs against."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tomllib
from importlib.resources import files

import pytest
from conftest import REPO

PYTHONS = ["cp311", "cp312", "cp313", "cp314"]


def identifiers(platform: str) -> set[str]:
    pytest.importorskip("cibuildwheel", reason="cibuildwheel is not installed (pip install '.[test]')")
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


LUA = REPO / "fastbus" / "queue" / "lua"


def test_the_installed_package_has_every_lua_file_of_the_source_tree():
    source = {p.name: p.read_bytes() for p in LUA.glob("*.lua")}
    assert len(source) > 30
    installed = {p.name: p.read_bytes() for p in files("fastbus.queue").joinpath("lua").iterdir()
                 if p.name.endswith(".lua")}
    assert installed == source


def test_every_script_is_loaded_from_its_file_and_linked():
    from fastbus.queue import _lua
    stems = {p.stem for p in LUA.glob("*.lua")}
    libraries = {"lib", "marks", "inbox_lib", "monitor_lib"}
    assert {name.lower() for name in _lua.SCRIPTS} == stems - libraries
    for name, source in _lua.SCRIPTS.items():
        assert source.endswith(_lua.load(name.lower())), name
        assert "lib.lua:" not in source and "KEYS[1]=" not in source, name      # files' headers stay home
    # only what a script uses: GET1 needs no batch marker, PUT does
    assert "local function record" in _lua.SCRIPTS["PUT"]
    assert "local function record" not in _lua.SCRIPTS["GET1"]
    assert "local function refuse" in _lua.SCRIPTS["INBOX_SEND"]
    assert "local function refuse" not in _lua.SCRIPTS["INBOX_JOIN"]
    assert "local function put" not in _lua.SCRIPTS["INBOX_SEND"]
    assert _lua.MARK_TTL_MS == 600_000


def test_the_wheel_and_the_sdist_are_told_to_ship_the_lua_files():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = data["fastbus.queue"]
    manifest = (REPO / "MANIFEST.in").read_text().splitlines()
    assert "recursive-include fastbus/queue/lua *.lua" in manifest
    for p in LUA.glob("*.lua"):
        assert any(fnmatch.fnmatch(f"lua/{p.name}", g) for g in globs), p.name


CORE = REPO / "fastbus" / "core"


def test_the_core_bindings_parts_ship_in_the_sdist_and_their_pxds_in_the_wheel():
    parts = sorted(CORE.glob("*.px[di]"))
    assert {p.suffix for p in parts} == {".pxd", ".pxi"}
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    manifest = (REPO / "MANIFEST.in").read_text().splitlines()
    rule = next(line for line in manifest if line.startswith("recursive-include fastbus "))
    for p in parts:
        assert any(fnmatch.fnmatch(f"core/{p.name}", g) for g in data["fastbus"]), p.name
        assert f"*{p.suffix}" in rule.split(), p.name
    # _core.pxd includes them: a downstream cimport needs them installed
    installed = {p.name for p in files("fastbus").joinpath("core").iterdir()}
    assert {p.name for p in parts if p.suffix == ".pxd"} <= installed
