"""An embedded Redis-compatible server: a child process on a free loopback port.

Every Redis-backed part of fastbus takes a URL.  When none is given,
:func:`resolve_url` decides, in one place for all of them:

1. ``$FASTBUS_REDIS_URL``, if set (and not empty): every process that sets it
   shares that server;
2. else the user's shared server (:mod:`fastbus.redis.shared`): the first
   process or command that needs it starts it, the others find it
   registered, so programs and commands given no URL meet on one server.

``fastbus redis-server`` runs one in the foreground (it prints the URL to
export).  :class:`EmbeddedServer` is the same server under the caller's
control (tests start, kill and restart it); :func:`default_server` one
private to this process.

The server binary is chosen by :func:`fastbus.redis.binary.find_server_binary`.

How the child is run
--------------------
``bind 127.0.0.1``, ``protected-mode yes``, persistence off (``save ""``,
``appendonly no``), its working directory a private temporary data dir
holding the config and the log (``fastbus-redis.log``), in a session of its
own (so a Ctrl-C at the terminal does not reach it before fastbus has
flushed).  Readiness is a PING answered by *this* process (``INFO``'s
``process_id``), polled, not a sleep.  A port chosen here that another
process takes first is replaced by another one.

No leftovers: :meth:`EmbeddedServer.stop` (SIGTERM, SIGKILL after a timeout)
removes the temporary dir, and an ``atexit`` hook stops every server still
running.  If the parent dies without running it (SIGTERM, SIGKILL, a crash,
``os._exit``):

* a watchdog ``/bin/sh`` per server blocks on a pipe whose only writer is
  the parent; when the parent dies, the read ends, and the watchdog
  SIGKILLs the server and removes its temporary data dir (a given
  ``data_dir`` is never removed);
* on Linux, the child also has ``PR_SET_PDEATHSIG`` = SIGKILL (``prctl``
  through ctypes), so it dies at once even if the watchdog was killed too.
  That signal follows the *thread* that forked, so servers are forked from
  one long-lived daemon thread, never from a caller's thread (which may be
  a short-lived worker).

A process that forks keeps the pipe open in its children: the watchdog then
waits for the last of them.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from fastbus.errors import EmbeddedServerError, InvalidURL, ServerNotFoundError
from fastbus.redis.binary import find_server_binary, server_version

if TYPE_CHECKING:
    import redis

__all__ = [
    "ENV_URL",
    "EmbeddedServer",
    "EmbeddedServerError",
    "ServerNotFoundError",
    "check_url",
    "configured_url",
    "default_server",
    "resolve_url",
]

#: Environment variable with the URL that "no URL" means (else the embedded server).
ENV_URL = "FASTBUS_REDIS_URL"

HOST = "127.0.0.1"
_CONF_NAME = "fastbus-redis.conf"
_LOG_NAME = "fastbus-redis.log"
_PORT_ATTEMPTS = 8

# --------------------------------------------------------------------------- spawning


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# How a child is tied to its parent's life: "prctl" (Linux: PR_SET_PDEATHSIG,
# and the watchdog) or "pipe" (the watchdog alone, used elsewhere; it also
# removes the temporary dir everywhere).  Module-level so the tests can
# exercise both.
_PARENT_WATCH = "prctl" if sys.platform.startswith("linux") else "pipe"

_prctl: Any = None


def _load_prctl() -> Any:
    # Loaded in the parent: the child, between fork and exec, only calls it.
    global _prctl
    if _prctl is None:
        import ctypes
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    return _prctl


class _Spawner:
    """Forks children from one long-lived daemon thread.

    PR_SET_PDEATHSIG fires when the thread that forked exits, not the
    process: a server started from a worker thread would die with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._queue = queue.SimpleQueue()
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, args=(self._queue,),
                                                name="fastbus-redis-spawner", daemon=True)
                self._thread.start()
            q = self._queue
        fut: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
        q.put((fut, argv, kwargs))
        return fut.result()

    @staticmethod
    def _run(q: queue.SimpleQueue[Any]) -> None:
        while True:
            fut, argv, kwargs = q.get()
            try:
                fut.set_result(subprocess.Popen(argv, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)


_spawner = _Spawner()


def _spawn_with_pdeathsig(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    prctl = _load_prctl()
    parent = os.getpid()

    def tie_to_parent() -> None:  # runs in the child, before exec
        prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl
            os.kill(os.getpid(), signal.SIGKILL)

    return _spawner.popen(argv, preexec_fn=tie_to_parent, **kwargs)


_WATCH_SCRIPT = ('read _line; [ -n "$1" ] && kill -KILL "$1" 2>/dev/null; '
                 '[ -n "$2" ] && rm -rf -- "$2"; exit 0')


def _spawn_watchdog(pid: int | None, directory: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """A /bin/sh that, when the pipe's write end (held only by this process;
    os.pipe fds are not inherited by exec) closes, SIGKILLs ``pid`` and
    removes ``directory`` (either may be None)."""
    r, w = os.pipe()
    try:
        watch = subprocess.Popen(
            ["/bin/sh", "-c", _WATCH_SCRIPT, "fastbus-redis-watch", "" if pid is None else str(pid),
             "" if directory is None else str(directory)],
            stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    return watch, w


# --------------------------------------------------------------------------- registry

_registry_lock = threading.Lock()
_registry: set[EmbeddedServer] = set()  # servers with a process or a temp dir


def _register(server: EmbeddedServer) -> None:
    with _registry_lock:
        _registry.add(server)


def _unregister(server: EmbeddedServer) -> None:
    with _registry_lock:
        _registry.discard(server)


@atexit.register
def _stop_all() -> None:
    with _registry_lock:
        servers = list(_registry)
    for server in servers:
        try:
            server.stop(timeout=3.0)
        except Exception:  # noqa: BLE001, S110 - best effort at exit
            pass


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# --------------------------------------------------------------------------- server


class EmbeddedServer:
    """A Redis-compatible server run as a child process on ``127.0.0.1``.

    ``binary``: the server to run (see :func:`find_server_binary`; resolved
    here, so a bad one fails at construction).  ``port``: None picks a free
    one at the first :meth:`start`; the port is then kept for the life of the
    object, so :meth:`restart` and :meth:`kill` + :meth:`start` come back on
    the same URL.  ``data_dir``: None makes a private temporary one, removed
    by :meth:`stop`; a given directory is created if needed and never removed.
    ``args``: extra command-line options for the server, e.g.
    ``("--maxmemory", "100mb")`` (do not change ``port`` or ``bind``).
    ``startup_timeout``: seconds to wait for the first PONG.

    Use as a context manager, or :meth:`start` / :meth:`stop`.  Methods are
    thread-safe.  Servers still running at interpreter exit are stopped."""

    def __init__(
        self,
        binary: str | os.PathLike[str] | None = None,
        port: int | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        args: Iterable[str] = (),
        startup_timeout: float = 10.0,
    ) -> None:
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                                 or not 0 < port < 65536):
            raise ValueError(f"port must be an int in 1..65535 or None, not {port!r}")
        if isinstance(args, (str, bytes)):
            raise TypeError("args must be a sequence of strings, not a single string")
        if not startup_timeout > 0:
            raise ValueError(f"startup_timeout must be > 0, not {startup_timeout!r}")
        self._binary = find_server_binary(binary)
        self._port = port
        self._port_pinned = port is not None  # never replaced by another port
        self._port_ours = False  # a server of ours has listened on it: wait for it if busy
        self._given_dir = Path(data_dir).resolve() if data_dir is not None else None
        self._args = tuple(str(a) for a in args)
        self.startup_timeout = float(startup_timeout)
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._watch: subprocess.Popen[bytes] | None = None
        self._watch_fd = -1
        self._owner = os.getpid()

    # -- properties

    @property
    def binary(self) -> str:
        """Absolute path of the server binary."""
        return self._binary

    @property
    def version(self) -> str:
        """The server's version, e.g. ``"9.1.2"`` (from ``binary --version``)."""
        return server_version(self._binary)[1]

    @property
    def server_name(self) -> str:
        """``"valkey"`` or ``"redis"`` (from ``binary --version``)."""
        return server_version(self._binary)[0]

    @property
    def port(self) -> int | None:
        """The TCP port, once chosen (at the first :meth:`start` unless given)."""
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT``; raises :class:`EmbeddedServerError` before the first start."""
        if self._port is None:
            raise EmbeddedServerError("the server has no port yet: call start() first")
        return f"redis://{HOST}:{self._port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else None."""
        with self._lock:
            return self._proc.pid if self._alive() else None

    @property
    def data_dir(self) -> Path | None:
        """The data dir in use (None after :meth:`stop` removed a temporary one)."""
        return self._dir

    @property
    def log_path(self) -> Path | None:
        """The server's log file (None when there is no data dir)."""
        return self._dir / _LOG_NAME if self._dir is not None else None

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's log ("" if none)."""
        path = self.log_path
        if path is None:
            return ""
        try:
            data = path.read_bytes()[-65536:]
        except OSError:
            return ""
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])

    def is_running(self) -> bool:
        """Whether the server process is alive."""
        with self._lock:
            return self._alive()

    def client(self, **kwargs: Any) -> redis.Redis:
        """A ``redis.Redis`` connected to this server (``kwargs`` go to it)."""
        import redis
        return redis.Redis.from_url(self.url, **kwargs)

    # -- lifecycle

    def start(self) -> Self:
        """Start the server and wait until it answers PING; return self.

        Does nothing if it is already running.  Raises
        :class:`EmbeddedServerError` with the tail of the server's log if it
        exits or does not answer within ``startup_timeout``."""
        with self._lock:
            if self._owner != os.getpid():
                raise EmbeddedServerError("this EmbeddedServer belongs to another process (fork)")
            if self._alive():
                return self
            self._reap()
            deadline = time.monotonic() + self.startup_timeout
            attempts = 0
            while True:
                attempts += 1
                if self._port is None or not self._port_pinned:
                    self._port = _free_port()
                try:
                    self._launch(deadline)
                except _PortInUse as exc:
                    if not self._port_pinned and attempts < _PORT_ATTEMPTS:
                        continue  # lost a race for the port: take another
                    if self._port_ours and time.monotonic() + 0.1 < deadline:
                        time.sleep(0.1)  # ours to reuse: wait for it to be freed
                        continue
                    self._cleanup_dir()
                    port = self._port
                    if not self._port_pinned:
                        self._port = None
                    raise EmbeddedServerError(
                        f"{self._binary} could not listen on {HOST}:{port} "
                        f"(address already in use); server log:\n{exc.log}") from None
                except BaseException:
                    self._cleanup_dir()
                    if not self._port_pinned:
                        self._port = None
                    raise
                self._port_pinned = self._port_ours = True
                return self

    def _launch(self, deadline: float) -> None:
        directory = self._ensure_dir()
        conf = directory / _CONF_NAME
        log = directory / _LOG_NAME
        conf.write_text(
            "# written by fastbus.redis.EmbeddedServer\n"
            f"bind {HOST}\n"
            "protected-mode yes\n"
            "daemonize no\n"
            f"dir {_quote(str(directory))}\n"
            f"logfile {_quote(str(log))}\n"
            'save ""\n'
            "appendonly no\n")
        argv = [self._binary, str(conf), "--port", str(self._port), *self._args]
        with open(log, "ab") as log_file:
            offset = log_file.tell()
            kwargs: dict[str, Any] = {
                "stdin": subprocess.DEVNULL, "stdout": log_file, "stderr": subprocess.STDOUT,
                "cwd": str(directory), "start_new_session": True}
            try:
                if _PARENT_WATCH == "prctl":
                    proc = _spawn_with_pdeathsig(argv, **kwargs)
                else:
                    proc = subprocess.Popen(argv, **kwargs)
            except OSError as exc:
                raise EmbeddedServerError(f"cannot run {self._binary}: {exc}") from exc
        self._proc = proc
        _register(self)
        try:
            self._stop_watchdog()                    # a dir-only one left by kill()
            self._watch, self._watch_fd = _spawn_watchdog(proc.pid, self._temp_dir())
        except BaseException:
            self._kill_proc()
            raise
        self._wait_ready(deadline, log, offset)

    def _log_since(self, log: Path, offset: int, lines: int = 30) -> str:
        try:
            with open(log, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return "(no log)"
        text = "\n".join(data.decode(errors="replace").splitlines()[-lines:])
        return text or "(empty log)"

    def _wait_ready(self, deadline: float, log: Path, offset: int) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        proc = self._proc
        assert proc is not None
        delay = 0.005
        last_error: BaseException | None = None
        while True:
            # Checked first and after every attempt: a server that failed to
            # bind exits, and the port may be answered by the process that won it.
            rc = proc.poll()
            if rc is not None:
                self._kill_proc()
                tail = self._log_since(log, offset)
                if "already in use" in tail.lower():
                    raise _PortInUse(tail)
                raise EmbeddedServerError(
                    f"{self._binary} exited with status {rc} during startup "
                    f"(port {self._port}); server log:\n{tail}")
            client = redis.Redis(host=HOST, port=self._port, socket_connect_timeout=0.5,
                                 socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
            try:
                if client.ping():
                    info = client.info("server")
                    if int(info.get("process_id", -1)) == proc.pid:
                        return
                    last_error = EmbeddedServerError(
                        f"port {self._port} is answered by another server (pid {info.get('process_id')})")
            except (redis.RedisError, OSError) as exc:
                last_error = exc
            finally:
                client.close()
            if time.monotonic() >= deadline and proc.poll() is None:
                self._kill_proc()
                raise EmbeddedServerError(
                    f"{self._binary} did not answer PING on {HOST}:{self._port} within "
                    f"{self.startup_timeout:g} s (last error: {last_error}); server log:\n"
                    f"{self._log_since(log, offset)}")
            if proc.poll() is None:
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout`` s) and remove
        its temporary data dir.  Safe to call more than once, or after :meth:`kill`."""
        with self._lock:
            if self._owner != os.getpid():
                return  # a forked child must not stop its parent's server
            self._stop_watchdog()
            proc = self._proc
            if proc is not None:
                if proc.poll() is None:
                    try:
                        proc.terminate()
                        proc.wait(timeout=timeout)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                    except ProcessLookupError:
                        proc.wait()
                self._proc = None
            self._cleanup_dir()

    def kill(self) -> None:
        """SIGKILL the server, as a crash would: the port and the data dir are
        kept, and :meth:`start` brings it back on the same port (empty)."""
        with self._lock:
            if self._owner != os.getpid():
                raise EmbeddedServerError("this EmbeddedServer belongs to another process (fork)")
            self._kill_proc()
            if self._temp_dir() is not None:
                # The dir stays until start() or stop(); if this process dies
                # meanwhile, a watchdog still removes it.
                try:
                    self._watch, self._watch_fd = _spawn_watchdog(None, self._temp_dir())
                except OSError:
                    pass

    def restart(self) -> Self:
        """:meth:`stop` then :meth:`start`, on the same port; return self."""
        with self._lock:
            self.stop()
            return self.start()

    # -- internals

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _reap(self) -> None:
        """Forget a process that has exited (and its watchdog)."""
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None
            self._stop_watchdog()

    def _kill_proc(self) -> None:
        self._stop_watchdog()
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
            proc.wait()
            self._proc = None

    def _stop_watchdog(self) -> None:
        # The watchdog dies first: once the server is reaped its pid may be reused.
        if self._watch is not None:
            if self._watch.poll() is None:
                try:
                    self._watch.kill()
                except ProcessLookupError:
                    pass
            self._watch.wait()
            self._watch = None
        if self._watch_fd >= 0:
            os.close(self._watch_fd)
            self._watch_fd = -1

    def _temp_dir(self) -> Path | None:
        """The data dir if it is a temporary one of ours (removed with the server)."""
        return self._dir if self._dir is not None and self._dir != self._given_dir else None

    def _ensure_dir(self) -> Path:
        if self._dir is None:
            if self._given_dir is not None:
                self._given_dir.mkdir(parents=True, exist_ok=True)
                self._dir = self._given_dir
            else:
                self._dir = Path(tempfile.mkdtemp(prefix="fastbus-redis-"))
            _register(self)
        return self._dir

    def _cleanup_dir(self) -> None:
        if self._proc is None:
            self._stop_watchdog()                    # a dir-only one left by kill()
        if self._dir is not None and self._dir != self._given_dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
        if self._proc is None:
            _unregister(self)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running pid={self._proc.pid}" if self._alive() and self._proc else "stopped"
        port = f" port={self._port}" if self._port else ""
        return f"<EmbeddedServer {self._binary}{port} {state}>"


class _PortInUse(Exception):
    def __init__(self, log: str) -> None:
        super().__init__(log)
        self.log = log


# --------------------------------------------------------------------------- shared server

_default_lock = threading.Lock()
_default: EmbeddedServer | None = None


def default_server() -> EmbeddedServer:
    """An embedded server private to this process, started on first use
    (thread-safe), stopped at exit; if it was killed, it is started again
    on the same port.  (Not what "no URL" means: that is the user's shared
    server, :func:`resolve_url`.)  The binary is chosen as by
    :func:`find_server_binary` with no argument."""
    global _default
    with _default_lock:
        server = _default
        if server is None:
            server = EmbeddedServer()
            server.start()
            _default = server
        elif server._owner == os.getpid() and not server.is_running():
            server.start()
        # In a forked child the parent's server is used as it is.
        return server


def started_default() -> EmbeddedServer | None:
    """The process-wide embedded server if it was started, else None (never
    starts one; for error messages that point at its log)."""
    return _default


def configured_url() -> str | None:
    """``$FASTBUS_REDIS_URL`` if set and not empty (checked to be a Redis
    URL), else None."""
    env = os.environ.get(ENV_URL, "").strip()
    return check_url(env, ENV_URL) if env else None


def resolve_url(url: str | None, origin: str = "url") -> str:
    """What a Redis URL argument means, for every part of fastbus and every
    ``fastbus`` command: ``url`` if given (checked; ``origin`` names it in
    errors, e.g. ``"--url"``); else ``$FASTBUS_REDIS_URL`` if set and not
    empty; else the user's shared server (:mod:`fastbus.redis.shared`:
    joined if one runs, else started; said at INFO), so that programs and
    commands given no URL meet on one server."""
    if url is None:
        configured = configured_url()
        if configured is not None:
            return configured
        from fastbus.redis.shared import shared_url
        return shared_url()
    if not isinstance(url, str):
        raise TypeError(f"{origin} must be a str or None, not {type(url).__name__}")
    if not url:
        raise InvalidURL(f"{origin} is empty: pass None for ${ENV_URL} or the shared server", url)
    return check_url(url, origin)


_SCHEMES = ("redis://", "rediss://", "unix://")


def check_url(url: str, origin: str = "url") -> str:
    """``url`` if it is a Redis URL (``redis://``, ``rediss://``, ``unix://``),
    else :class:`~fastbus.errors.InvalidURL` (a ValueError) naming where it
    came from (``origin``: ``"url"``, an option such as ``"--url"``, or
    ``ENV_URL``)."""
    if not isinstance(url, str):
        raise TypeError(f"{origin} must be a str, not {type(url).__name__}")
    if not url.startswith(_SCHEMES):
        where = f"${origin}" if origin == ENV_URL else origin
        raise InvalidURL(f"{where} is not a Redis URL: {url!r} (redis://host:port/db, rediss:// or "
                         f"unix:///path)", url)
    return url
