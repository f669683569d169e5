"""The user's shared Redis server: what "no URL" means when
``$FASTBUS_REDIS_URL`` is not set (:func:`fastbus.redis.resolve_url`).

Why one per user, not one per process: a producer script and a consumer
script, or ``fastbus queue put`` and a script, that were given no URL must
meet on the same server, or their messages silently never meet.  So the
first of them to need a server starts one (``fastbus redis-server
--shared``, in a session of its own: it outlives the process that started
it) and registers it in a file of the user's runtime directory; every
later one finds it there, checks that the server registered answers (its
``INFO`` names the same process), and uses it.  Each says at INFO
(logger ``fastbus.redis``) which server it started or joined.

- The runtime directory: ``$FASTBUS_RUNTIME_DIR``, else
  ``$XDG_RUNTIME_DIR/fastbus``, else ``$TMPDIR/fastbus-UID``; made private
  (0700) and refused if another user owns it or others may write it.
- Its data: ``$FASTBUS_STATE_DIR/redis``, else
  ``$XDG_STATE_HOME/fastbus/redis``, else ``~/.local/state/fastbus/redis``,
  with the append-only file on (fsync every second): what a process put
  is there for the next one even after the server stopped.
- It stops after ``$FASTBUS_REDIS_IDLE`` seconds (600) with no client
  connected and nobody joining, or at ``fastbus redis-server --stop``; the
  next process that needs it starts it again, on the data it kept.
- Starting and joining take a lock file, and the idle stop takes it too:
  two processes that start at once start one server, and a server never
  stops between a join and the joiner's first command (a join resets its
  idle clock).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastbus.errors import EmbeddedServerError

__all__ = ["IDLE_ENV", "RUNTIME_ENV", "STATE_ENV", "data_dir", "registered", "runtime_dir", "shared_url",
           "stop_shared"]

log = logging.getLogger("fastbus.redis")

RUNTIME_ENV = "FASTBUS_RUNTIME_DIR"
STATE_ENV = "FASTBUS_STATE_DIR"
IDLE_ENV = "FASTBUS_REDIS_IDLE"
DEFAULT_IDLE_S = 600.0
START_TIMEOUT_S = 30.0
#: Servers this process started (their runners: its children until they
#: end), reaped when they have: a long-lived program keeps no zombie.
_started: list[subprocess.Popen[bytes]] = []
_REGISTRY = "redis.json"
_LOCK = "redis.lock"
_LOG = "redis-server.log"


def runtime_dir() -> Path:
    """Where the shared server is registered (made if needed, private)."""
    given = os.environ.get(RUNTIME_ENV, "").strip()
    xdg = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    uid = os.getuid()
    d = Path(given) if given else Path(xdg) / "fastbus" if xdg else Path(tempfile.gettempdir()) / f"fastbus-{uid}"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.stat()
    if st.st_uid != uid or st.st_mode & 0o022:
        raise EmbeddedServerError(f"{d} is not this user's own directory (owner uid {st.st_uid}, mode "
                                  f"{st.st_mode & 0o777:o}): the shared Redis server is not registered there; "
                                  f"set ${RUNTIME_ENV} to a directory of yours, or $FASTBUS_REDIS_URL")
    return d


def data_dir() -> Path:
    """Where the shared server keeps its data (its append-only file)."""
    given = os.environ.get(STATE_ENV, "").strip()
    if given:
        return Path(given) / "redis"
    state = os.environ.get("XDG_STATE_HOME", "").strip()
    return (Path(state) if state else Path.home() / ".local" / "state") / "fastbus" / "redis"


def idle_seconds() -> float:
    """``$FASTBUS_REDIS_IDLE`` (seconds > 0), else 600."""
    text = os.environ.get(IDLE_ENV, "").strip()
    if not text:
        return DEFAULT_IDLE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"${IDLE_ENV} is a number of seconds > 0, not {text!r}")
    return value


@contextlib.contextmanager
def _locked(d: Path, timeout: float) -> Iterator[bool]:
    """The registry's lock, waited for up to ``timeout`` s: yields whether
    it was taken (0: one try)."""
    fd = os.open(d / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.02)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _answers(reg: dict[str, Any]) -> bool:
    """Does the registered server answer, and is it the one registered?"""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    try:
        c = redis.Redis.from_url(str(reg["url"]), socket_connect_timeout=1.0, socket_timeout=2.0,
                                 retry=Retry(NoBackoff(), 0))
    except (KeyError, ValueError):
        return False
    try:
        return int(c.info("server").get("process_id", -1)) == int(reg["server_pid"])
    except (redis.RedisError, OSError, KeyError, TypeError, ValueError):
        return False
    finally:
        c.close()


def registered(d: Path | None = None) -> dict[str, Any] | None:
    """The shared server as registered, if it answers; else None."""
    try:
        reg = json.loads(((d or runtime_dir()) / _REGISTRY).read_text())
    except (OSError, ValueError):
        return None
    return reg if isinstance(reg, dict) and _answers(reg) else None


def shared_url() -> str:
    """The URL of the user's shared server: the registered one, else one
    started now (and registered)."""
    _started[:] = [p for p in _started if p.poll() is None]
    d = runtime_dir()
    with _locked(d, START_TIMEOUT_S) as taken:
        if not taken:
            raise EmbeddedServerError(f"the shared Redis server's lock ({d / _LOCK}) was held for "
                                      f"{START_TIMEOUT_S:g} s: another process is stuck starting it")
        reg = registered(d)
        if reg is None:
            reg = _start(d)
            log.info("started the shared Redis server at %s (pid %s; data in %s; it stops after %g s without "
                     "a client, or at `fastbus redis-server --stop`)", reg["url"], reg["pid"], reg["data_dir"],
                     reg["idle_s"])
        else:
            log.info("using the shared Redis server at %s (pid %s)", reg["url"], reg["pid"])
        os.utime(d / _REGISTRY)                 # joined: the server's idle clock starts again
        return str(reg["url"])


def _start(d: Path) -> dict[str, Any]:
    """Run ``fastbus redis-server --shared`` in a session of its own and
    wait until it has registered itself."""
    idle_seconds()                               # a bad $FASTBUS_REDIS_IDLE is said here, not in its log
    with open(d / _LOG, "ab") as out:
        offset = out.tell()
        proc = subprocess.Popen([sys.executable, "-P", "-m", "fastbus", "redis-server", "--shared"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=str(d),
                                start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        reg = registered(d)
        if reg is not None and reg.get("pid") == proc.pid:
            _started.append(proc)
            return reg
        rc = proc.poll()
        if rc is not None or time.monotonic() > deadline:
            if rc is None:
                proc.kill()
                proc.wait()
            with open(d / _LOG, "rb") as f:
                f.seek(offset)
                tail = "\n".join(f.read().decode(errors="replace").splitlines()[-20:])
            why = f"exit status {rc}" if rc is not None else f"no answer in {START_TIMEOUT_S:g} s"
            raise EmbeddedServerError(f"the shared Redis server did not start ({why}); its log ({d / _LOG}):\n{tail}")
        time.sleep(0.05)


def register(url: str, server_pid: int, data: Path, idle_s: float) -> Path:
    """Said by the server's runner once it answers: this process's server
    is the shared one (written whole, then renamed into place)."""
    d = runtime_dir()
    tmp = d / f".{_REGISTRY}.{os.getpid()}"
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "server_pid": server_pid, "data_dir": str(data),
                               "idle_s": idle_s, "started": time.time()}))
    os.replace(tmp, d / _REGISTRY)
    return d


def unregister(d: Path) -> None:
    """The runner stops: its registration goes (if it is still its own)."""
    path = d / _REGISTRY
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


class IdleWatch:
    """Whether the shared server has had no client (but the watch's own
    connection) and no join for ``idle_s`` seconds."""

    def __init__(self, url: str, d: Path, idle_s: float) -> None:
        import redis
        self._client = redis.Redis.from_url(url, socket_timeout=2.0)
        self._d = d
        self.idle_s = idle_s
        self._busy_at = time.monotonic()

    def _clients(self) -> int:
        try:
            return int(self._client.info("clients").get("connected_clients", 0))
        except Exception:  # noqa: BLE001 - a server that does not answer is not idle; its death is seen apart
            return 2

    def _joined_ago(self) -> float:
        try:
            return max(0.0, time.time() - (self._d / _REGISTRY).stat().st_mtime)
        except OSError:
            return 0.0

    def idle(self) -> bool:
        now = time.monotonic()
        if self._clients() > 1:
            self._busy_at = now
        return min(now - self._busy_at, self._joined_ago()) >= self.idle_s

    def stop_if_idle(self) -> bool:
        """Idle, with nobody joining now: unregistered (True; the caller
        stops the server).  The registry's lock makes a join and this stop
        one after the other."""
        if not self.idle():
            return False
        with _locked(self._d, 0) as taken:
            if not taken or not self.idle():
                return False
            unregister(self._d)
            return True

    def close(self) -> None:
        self._client.close()


def stop_shared(timeout: float = 15.0) -> dict[str, Any] | None:
    """Stop the user's shared server (its runner: SIGTERM); what was
    registered, or None if none runs.  Its data stays for the next one."""
    d = runtime_dir()
    reg = registered(d)
    if reg is None:
        return None
    pid = int(reg["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return reg
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return reg
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:   # (our own child, if this process started it)
                return reg
        time.sleep(0.05)
    raise EmbeddedServerError(f"the shared Redis server (pid {pid}) did not stop within {timeout:g} s")
