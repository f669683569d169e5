"""A small HTTP server for monitoring: Prometheus ``/metrics``, JSON
endpoints in the NATS style, ``/healthz`` and a live web page at ``/``.

The server knows nothing of brokers or queues.  It serves a *source*: an
object that the thing being watched keeps up to date, and that the server's
threads only read.  The broker's source (fastbus.monitor.broker) is fed by
the broker loop, which publishes a snapshot about once a second; the HTTP
threads never touch the loop's state, so serving never slows the message
path.  A source has:

``kind: str``
    what is watched (``"broker"``, ``"queues"``), shown by the page.
``metrics() -> Iterable[prometheus_client.core.Metric]``
    the metric families for ``/metrics``, built from the latest snapshot
    (prometheus_client writes the exposition format; the server registers a
    collector that calls this, in its own registry, not the global one).
``health() -> tuple[bool, dict]``
    for ``/healthz``: True while the watched loop serves (its snapshot is
    fresh), and a JSON body saying why (200 or 503).
``endpoints() -> dict[str, Callable[[dict[str, str]], dict]]``
    the JSON endpoints by name (``"varz"``, ``"connz"``...): each is served
    at ``/<name>`` and called with the query string's parameters (last value
    of each); it returns a JSON-serialisable dict, or raises ``ValueError``
    for a bad parameter (answered 400).
``layout() -> dict``
    what the web page shows, served at ``/layout.json``:
    ``{"title": str, "poll": "/varz",
    "tiles": [{"key": "messages_in", "label": str, "unit": "bytes"|"s"|""}],
    "charts": [{"title": str, "unit": str, "series": [{"key": "messages_in", "label": str}]}],
    "tables": [{"title": str, "path": "/connz?limit=100", "rows": "connections",
    "id": "name", "columns": [{"key": "name", "label": str, "unit": str}]}]}``.
    Tile keys are dotted paths into the ``poll`` endpoint's JSON (e.g.
    ``drops.slow_consumer``), chart series keys into its ``rates`` dict
    (per second), and each table's rows are the list at ``rows`` of its
    path's JSON.  With a ``"history": "/varz?history=300"`` entry the page
    fills its charts from that endpoint's ``history`` (``{"t": [...],
    "rates": {key: [...]}}``) when it opens.  Or, for several sources
    (:class:`CompositeSource`): ``{"title": str, "sections": [layout,
    ...]}``, each section a layout as above with an ``"id"`` and its paths
    under ``/<id>/``; the page draws one block per section (element ids
    prefixed ``<id>/``) and each section's health from ``/healthz``'s
    ``sources``.

:class:`CounterRing` is the one ring of counter samples for rates and
history: a broker's source keeps one (through :class:`Snapshots`, which
adds the latest snapshot's data), the queue source one per series.

The page (fastbus/monitor/static/) is plain HTML, CSS and JavaScript
shipped in the package: no CDN, charts drawn on canvas.

The server binds loopback addresses only, unless ``allow_remote``
(``--allow-remote``): the endpoints have no authentication.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger("fastbus.monitor")

#: Files of the web page, by URL path.
_STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
           "/index.html": ("index.html", "text/html; charset=utf-8"),
           "/static/monitor.js": ("monitor.js", "text/javascript; charset=utf-8"),
           "/static/monitor.css": ("monitor.css", "text/css; charset=utf-8")}


class Source(Protocol):
    """What the server serves (see the module doc)."""

    kind: str

    def metrics(self) -> Iterable[Any]: ...

    def health(self) -> tuple[bool, dict]: ...

    def endpoints(self) -> dict[str, Callable[[dict[str, str]], dict]]: ...

    def layout(self) -> dict: ...


def parse_address(address: str, allow_remote: bool = False) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[::1]:8222"`` for IPv6; port 0: any free one) as
    ``(host, port)``; ValueError for a malformed one, or for a host that is
    not a loopback address unless ``allow_remote``."""
    text = address.strip()
    if text.startswith("http://"):
        text = text[len("http://"):].rstrip("/")
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"HTTP address {address!r} needs a host and a port, e.g. 127.0.0.1:8222")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"bad port in HTTP address {address!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"bad port in HTTP address {address!r}")
    if not allow_remote and not _is_loopback(host):
        raise ValueError(f"HTTP address {address!r} is not a loopback address; the monitoring endpoints "
                         f"have no authentication: pass --allow-remote (allow_remote=True) to serve "
                         f"them beyond this machine")
    return host, port


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class CounterRing:
    """Recent samples of cumulative counters, oldest first, at most
    ``keep``: the one ring both monitoring sources keep (a broker's
    snapshots, each queue's series).  A sample is ``(t, stamp, counters,
    data)``: ``t`` the time rates are taken over, ``stamp`` the time
    history reports (wall time), ``data`` whatever goes with it.

    One thread adds; any thread reads: each ``add`` replaces the whole
    tuple in one assignment, so a reader sees a consistent ring and never
    waits.  ``reset_on_fall``: a counter that fell (keys deleted, a server
    flushed) or a clock that went back starts the ring over, instead of
    reading as a negative rate (shown as 0 otherwise)."""

    def __init__(self, keep: int, reset_on_fall: bool = False) -> None:
        self.keep = keep
        self.reset_on_fall = reset_on_fall
        self._ring: tuple = ()

    def add(self, t: float, counters: dict[str, float], stamp: float | None = None, data: Any = None) -> None:
        """A new sample (the adding thread only)."""
        ring = self._ring
        if ring and self.reset_on_fall:
            last_t, _, last, _ = ring[-1]
            if t <= last_t or any(v < last.get(k, 0) for k, v in counters.items()):
                ring = ()
        if len(ring) >= self.keep:
            ring = ring[len(ring) - self.keep + 1:]
        self._ring = ring + ((t, t if stamp is None else stamp, counters, data),)

    @property
    def latest(self) -> tuple | None:
        """``(t, stamp, counters, data)`` of the newest sample."""
        ring = self._ring
        return ring[-1] if ring else None

    def rates(self, window: float) -> tuple[dict[str, float], float]:
        """Per-second rates of every counter over about the last ``window``
        seconds (the newest sample against the oldest one at most that old,
        or the one before the newest), and the seconds they cover (0 with
        fewer than two samples)."""
        ring = self._ring
        if len(ring) < 2:
            return ({k: 0.0 for k in ring[-1][2]} if ring else {}), 0.0
        new = ring[-1]
        old = ring[-2]
        for entry in reversed(ring[:-1]):
            if new[0] - entry[0] > window + 1e-6:
                break
            old = entry
        dt = new[0] - old[0]
        if dt <= 0:
            return dict.fromkeys(new[2], 0.0), 0.0
        return {k: max(0.0, (v - old[2].get(k, 0)) / dt) for k, v in new[2].items()}, dt

    def history(self, seconds: float | None = None, keys: Iterable[str] | None = None) -> dict:
        """Rates between consecutive samples over the last ``seconds`` (None:
        all kept): ``{"t": [stamps], "dt": [seconds each rate covers, up to
        its t], "rates": {key: [per second]}}``."""
        ring = self._ring
        if not ring:
            return {"t": [], "dt": [], "rates": {k: [] for k in keys or ()}}
        entries = list(ring)
        if seconds is not None:
            cut = ring[-1][0] - seconds
            start = next(i for i, e in enumerate(ring) if e[0] >= cut)
            entries = entries[max(0, start - 1):]
        keys = list(keys) if keys is not None else list(ring[-1][2])
        out: dict = {"t": [], "dt": [], "rates": {k: [] for k in keys}}
        for a, b in zip(entries, entries[1:]):
            dt = b[0] - a[0]
            if dt <= 0:
                continue
            out["t"].append(round(b[1], 3))
            out["dt"].append(round(dt, 6))
            for k in keys:
                out["rates"][k].append(round(max(0.0, (b[2].get(k, 0) - a[2].get(k, 0)) / dt), 3))
        return out


class Snapshots:
    """The latest snapshot and a ring of counter samples, published by one
    thread (the loop) and read by others (the HTTP threads): a
    :class:`CounterRing` over monotonic time, stamped with wall time.

    ``publish(counters, data)`` adds a sample, so a reader always sees a
    consistent pair and never waits for the loop.  ``counters`` are the
    cumulative figures to take rates of; ``data`` whatever else the
    endpoints serve."""

    def __init__(self, keep: int = 600) -> None:
        self.keep = keep
        self._ring = CounterRing(keep)

    def publish(self, counters: dict[str, float], data: Any) -> None:
        """A new sample (the publishing thread only)."""
        self._ring.add(time.monotonic(), counters, stamp=time.time(), data=data)

    @property
    def latest(self) -> tuple | None:
        """(monotonic time, wall time, counters, data) of the newest sample."""
        return self._ring.latest

    def age(self) -> float | None:
        """Seconds since the newest sample, or None before the first."""
        last = self.latest
        return None if last is None else time.monotonic() - last[0]

    def rates(self, window: float = 5.0) -> tuple[dict[str, float], float]:
        """As :meth:`CounterRing.rates`."""
        return self._ring.rates(window)

    def history(self, seconds: float, keys: Iterable[str] | None = None) -> dict:
        """As :meth:`CounterRing.history`; ``t`` are wall times."""
        return self._ring.history(seconds, keys)


def process_rss() -> int | None:
    """This process's resident memory in bytes (Linux: /proc/self/statm),
    or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class CompositeSource:
    """Several sources served by one MonitorServer (``fastbus monitor
    --redis URL --broker EP``): the queues and one or more brokers.

    ``sources``: ``{id: source}`` in the order the page shows them; an id is
    a short path segment (``"queues"``, ``"broker"``, ``"broker-2"``).

    * ``/metrics``: every source's families in one scrape.  Families of the
      same name are merged; when several sources have the same ``kind``
      (several brokers), each of their samples gets a label named after the
      kind (``broker``) whose value is the source's ``label`` attribute
      (a broker's endpoint), else its id.  A single broker's families carry
      no extra label: the names and labels the broker serves itself.
    * ``/varz``: ``{"healthy", "sources": {id: {"kind", "label"}}, id: the
      source's /varz...}``, one section per source (a source that cannot
      answer yet has ``{"error": ...}`` in its section).
    * ``/<id>/<endpoint>``: each source's own endpoints (``/broker/connz``,
      ``/queues/queuez``...); and unprefixed, each endpoint name of the
      first source that has it (``/connz``, ``/subsz``: the first broker;
      ``/queuez``: the queues).
    * ``/healthz``: 200 only while every source is healthy; the body says
      which are not (``unhealthy``) and each source's own answer.
    * ``/layout.json``: ``{"title", "sections": [each source's layout,
      with "id" and its paths under /<id>/]}``: the page draws a section
      per source.
    """

    kind = "composite"

    def __init__(self, sources: dict[str, Source], title: str = "fastbus monitor") -> None:
        if not sources:
            raise ValueError("a CompositeSource needs at least one source")
        for sid in sources:
            if not sid or "/" in sid or sid in ("static", "metrics", "healthz", "varz", "layout.json"):
                raise ValueError(f"bad source id {sid!r}: a path segment other than the server's own names")
        self.sources = dict(sources)
        self.title = title
        kinds: dict[str, int] = {}
        for src in self.sources.values():
            kinds[src.kind] = kinds.get(src.kind, 0) + 1
        #: id -> (label name, value) added to that source's metric samples
        self._labels = {sid: (src.kind, str(getattr(src, "label", sid)))
                        for sid, src in self.sources.items() if kinds[src.kind] > 1}

    def metrics(self) -> Iterable[Any]:
        from prometheus_client.metrics_core import Metric
        merged: dict[str, Any] = {}
        for sid, src in self.sources.items():
            extra = self._labels.get(sid)
            for fam in src.metrics():
                into = merged.get(fam.name)
                if into is None:
                    into = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                elif into.type != fam.type:
                    log.warning("metric family %s is a %s in one source and a %s in %s: left out there",
                                fam.name, into.type, fam.type, sid)
                    continue
                if extra is None:
                    into.samples.extend(fam.samples)
                else:
                    into.samples.extend(s._replace(labels={**s.labels, extra[0]: extra[1]}) for s in fam.samples)
        return list(merged.values())

    def health(self) -> tuple[bool, dict]:
        answers = {sid: src.health() for sid, src in self.sources.items()}
        bad = [sid for sid, (ok, _body) in answers.items() if not ok]
        body = {"status": "ok" if not bad else "unhealthy: " + ", ".join(bad), "unhealthy": bad,
                "sources": {sid: b for sid, (_ok, b) in answers.items()}}
        return not bad, body

    def endpoints(self) -> dict[str, Callable[[dict[str, str]], dict]]:
        out: dict[str, Callable[[dict[str, str]], dict]] = {"varz": self.varz}
        for sid, src in self.sources.items():
            for name, fn in src.endpoints().items():
                out[f"{sid}/{name}"] = fn
                out.setdefault(name, fn)
        return out

    def varz(self, query: dict[str, str]) -> dict:
        """One section per source (its own /varz), by id."""
        out: dict[str, Any] = {"server": "fastbus monitor", "now": round(time.time(), 3), "healthy": None,
                               "sources": {sid: {"kind": src.kind, "label": str(getattr(src, "label", sid))}
                                           for sid, src in self.sources.items()}}
        for sid, src in self.sources.items():
            fn = src.endpoints().get("varz")
            if fn is None:
                continue
            try:
                out[sid] = fn(query)
            except ValueError as exc:
                out[sid] = {"error": str(exc)}
        out["healthy"] = self.health()[0]          # after the sections: a first sample may be taken above
        return out

    def layout(self) -> dict:
        def under(sid: str, path: str | None) -> str | None:
            return None if path is None else f"/{sid}/{path.lstrip('/')}"

        sections = []
        for sid, src in self.sources.items():
            lay = dict(src.layout())
            lay.update(id=sid, kind=src.kind, poll=under(sid, lay.get("poll", "/varz")),
                       history=under(sid, lay.get("history")),
                       tables=[{**t, "path": under(sid, t["path"])} for t in lay.get("tables", ())])
            sections.append(lay)
        return {"title": self.title, "kind": self.kind, "sections": sections}


class _Collector:
    """prometheus_client collector of a source's metrics (registered in the
    server's own registry)."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def collect(self):
        return self.source.metrics()


class Ticker:
    """Calls ``fn()`` every ``interval`` seconds in a daemon thread, the
    first call at once; a call slower than the interval delays the next
    (no burst to catch up).  What the polled sources (queues, a remote
    broker) sample with."""

    def __init__(self, fn: Callable[[], object], interval: float, name: str) -> None:
        self.fn, self.interval, self.name = fn, interval, name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.fn()
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at, delay = time.monotonic(), 0
            self._stop.wait(delay)

    def stop(self, timeout: float | None = None) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout)


class MonitorServer:
    """The monitoring HTTP server of one source (several: a
    :class:`CompositeSource`), in daemon threads.

    ``MonitorServer(source, "127.0.0.1:8222").start()``; ``url`` is where it
    listens (the real port if 0 was asked); ``stop()`` closes it."""

    def __init__(self, source: Source, address: str, allow_remote: bool = False) -> None:
        self.source = source
        self.host, self.port = parse_address(address, allow_remote)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(source))
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._static: dict[str, bytes] = {}

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> MonitorServer:
        """Bind and serve; OSError (as ``MonitorBindError``) if the address
        cannot be bound."""
        files = resources.files("fastbus.monitor") / "static"
        for name, _ctype in _STATIC.values():
            if name not in self._static:
                self._static[name] = (files / name).read_bytes()
        handler = type("Handler", (_Handler,), {"server_obj": self})
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server_cls = type("Server", (_Server,), {"address_family": family})
        try:
            self._httpd = server_cls((self.host, self.port), handler)
        except OSError as exc:
            from fastbus.errors import MonitorBindError
            err = MonitorBindError(f"cannot serve HTTP on {self.host}:{self.port}: {exc.strerror or exc}")
            err.errno = exc.errno
            raise err from exc
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="fastbus-monitor-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    # -- requests (HTTP threads) ---------------------------------------------

    def handle(self, path: str, query: dict[str, str]) -> tuple[int, str, bytes]:
        """(status, content type, body) of a GET."""
        if path in _STATIC:
            name, ctype = _STATIC[path]
            return 200, ctype, self._static[name]
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/healthz":
            ok, body = self.source.health()
            return (200 if ok else 503), "application/json", _json(body)
        if path == "/layout.json":
            return 200, "application/json", _json(self.source.layout())
        fn = self.source.endpoints().get(path.lstrip("/"))
        if fn is None:
            names = ", ".join(["/", "/metrics", "/healthz", *(f"/{n}" for n in self.source.endpoints())])
            return 404, "application/json", _json({"error": f"no such endpoint {path!r}; try {names}"})
        try:
            return 200, "application/json", _json(fn(query))
        except ValueError as exc:
            return 400, "application/json", _json({"error": str(exc)})


def _json(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # A client that went away mid-answer; socketserver would print a
        # traceback to stderr (which must never block this thread).
        log.debug("monitoring connection from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server_obj: MonitorServer
    protocol_version = "HTTP/1.1"
    server_version = "fastbus-monitor"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._respond(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._respond(head=True)

    def _respond(self, head: bool) -> None:
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query))
        try:
            status, ctype, body = self.server_obj.handle(parts.path, query)
        except Exception as exc:  # a bug: answer 500, keep serving
            log.exception("monitoring request %s failed", self.path)
            status, ctype, body = 500, "application/json", _json({"error": f"internal error: {exc}"})
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        # Never write to stderr from here: a stuck log pipe must not stop
        # the monitoring that would show it (see /healthz).
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s", self.address_string(), format % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        body = _json({"error": message or HTTPStatus(code).phrase})
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
