"""A broker watched from another process (``fastbus monitor --broker EP``):
a :class:`RemoteBrokerSource` polls the broker over its own protocol (a
STATS request with the ``clients`` option, :func:`fastbus.client.query_stats`)
every ``interval`` seconds in a thread, and feeds what it gets to the same
snapshot and rate machinery the broker's own ``--http`` uses
(:class:`fastbus.monitor.broker.BrokerSource`).  So ``/metrics``
(``fastbus_broker_*``), ``/varz`` and ``/connz`` have the names and shape
the broker serves itself.

What differs from the broker's own endpoints:

* ``/subsz`` gives the counts only: the ranking of keys by subscribers
  (``?limit=N``) walks the broker's subscription table, which only the
  broker's own ``--http`` does (the answer says so in ``note``).
* ``/healthz`` answers 503 when the broker has not answered a poll within
  ``max_age`` seconds (it is down, stuck, or unreachable), saying why.
* ``/metrics``: while the broker does not answer, only
  ``fastbus_broker_monitor_up`` (0), ``fastbus_broker_monitor_errors`` and
  ``fastbus_broker_monitor_last_answer_age_seconds`` are served: a stale
  figure is never shown as a current one.
* Rates are over the times the answers arrived here, and start again when
  the broker restarts (its instance id changes).
* Each poll is a short-lived connection: the broker counts one
  ``control_in`` per poll.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from fastbus.broker.links import PEER_FIELDS

from .broker import BrokerSource
from .http import Snapshots, Ticker

log = logging.getLogger("fastbus.monitor")

__all__ = ["RemoteBrokerSource"]


class RemoteBrokerSource(BrokerSource):
    """A broker's figures, polled over its protocol, for
    fastbus.monitor.http.MonitorServer (alone, or in a CompositeSource).

    ``endpoint``: the broker's client endpoint (``tcp://host:6464``).
    ``interval``: seconds between polls.  ``timeout``: seconds one poll
    waits for the answer (default: the interval, at most 2).  ``max_age``:
    /healthz answers 503 once the last answer is older than this (default
    3 intervals + the timeout, at least 3 s).  ``curve``: (broker public
    key, client public key, client secret key), Z85, for a CURVE broker
    (as :func:`fastbus.client.query_stats`).

    ``start()`` polls in a daemon thread (the first poll at once);
    ``poll()`` polls once in the caller's thread; ``close()`` stops."""

    kind = "broker"

    def __init__(self, endpoint: str, *, interval: float = 1.0, timeout: float | None = None,
                 max_age: float | None = None, curve: tuple[str, str, str] | None = None) -> None:
        for what, v in (("interval", interval), ("timeout", timeout), ("max_age", max_age)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
                raise ValueError(f"{what} must be a number of seconds > 0, not {v!r}")
        from fastbus.endpoints import check_connect
        check_connect(endpoint)                 # InvalidEndpoint, as fastbus.Client says it
        if curve is not None and (len(curve) != 3 or not all(isinstance(k, str) and k for k in curve)):
            raise ValueError("curve must be (broker public key, client public key, client secret key), Z85 text")
        self.endpoint = endpoint
        self.curve = curve
        timeout = float(timeout) if timeout is not None else min(float(interval), 2.0)
        max_age = float(max_age) if max_age is not None else max(3.0, 3 * float(interval) + timeout)
        super().__init__(None, max_age=max_age)
        self.interval = float(interval)
        self.timeout = timeout
        self.snapshots = Snapshots(keep=int(600 / self.interval) + 1)     # ten minutes of history
        #: Polls answered and not answered, and why the last one failed.
        self.polls = 0
        self.errors = 0
        self.last_error: str | None = None
        self._instance: str | None = None
        self._ticker = Ticker(self.poll, self.interval, "fastbus-broker-monitor")

    @property
    def label(self) -> str:
        """How /metrics names this broker when several are watched (its
        ``broker`` label): the endpoint."""
        return self.endpoint

    # -- polling (one thread)

    def poll(self) -> bool:
        """Ask the broker once; publish its answer as the new snapshot.
        False (and counted in ``errors``, the reason in ``last_error``) if it
        did not answer within ``timeout`` or answered nonsense."""
        from fastbus.client import query_stats
        try:
            stats = query_stats(self.endpoint, self.timeout, self.curve, clients=True)
            rows = [tuple(peer.get(f) for f in PEER_FIELDS) for peer in stats.pop("connz", None) or ()]
            self._check(stats)
        except Exception as exc:  # noqa: BLE001 - a monitor reports what failed and goes on
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.debug("broker monitor: poll of %s failed: %s", self.endpoint, exc)
            return False
        if stats["instance"] != self._instance:
            if self._instance is not None:      # restarted: its counters start again, so do the rates
                log.info("broker monitor: %s restarted (instance %s)", self.endpoint, stats["instance"])
                self.snapshots = Snapshots(keep=self.snapshots.keep)
            self._instance = stats["instance"]
        self.polls += 1
        self.last_error = None
        self.publish(stats, rows)
        return True

    @staticmethod
    def _check(stats: object) -> None:
        if not isinstance(stats, dict):
            raise ValueError("the STATS answer is not an object")
        missing = [k for k in ("name", "instance", "uptime_s", "drops", "links", "peers", "publishers",
                               "subscriptions", "keys", "queued_bytes") if k not in stats]
        if missing:
            raise ValueError(f"the STATS answer lacks {', '.join(missing)}")

    def start(self) -> RemoteBrokerSource:
        """Poll every ``interval`` seconds in a daemon thread (the first now)."""
        if not self._ticker.running:
            self._stopped = False
            self._ticker.start()
        return self

    def close(self) -> None:
        """Stop polling (/healthz answers 503 from now on)."""
        self._ticker.stop(self.timeout + 5)
        self.stopped()

    stop = close

    # -- what differs from the broker's own endpoints

    def _rss(self, stats: dict) -> int | None:
        return stats.get("rss_bytes")        # the broker's (None from a broker older than that field)

    def _http_url(self) -> str | None:
        return None

    def _title(self) -> str:
        latest = self.snapshots.latest
        name = latest[3][0]["name"] if latest is not None else "?"
        return f"fastbus broker {name} at {self.endpoint}"

    def _top_keys(self, limit: int) -> tuple[list | None, float | None, str | None]:
        return None, None, ("the keys with the most subscribers are ranked only by the broker's own HTTP "
                            "endpoint (fastbus broker --http); fastbus monitor --broker gives the counts")

    def layout(self) -> dict:
        lay = super().layout()
        lay["tables"] = [t for t in lay["tables"] if not t["path"].startswith("/subsz")]   # no ranking here
        return lay

    def _latest(self) -> tuple:
        latest = self.snapshots.latest
        if latest is None:
            raise ValueError(f"the broker at {self.endpoint} has not answered yet"
                             + (f" ({self.last_error})" if self.last_error else ""))
        return latest

    def health(self) -> tuple[bool, dict]:
        ok, body = super().health()
        body = {"source": "broker", "endpoint": self.endpoint, **body}
        if not ok and body.get("status") == "stale":
            body["reason"] = (f"the broker at {self.endpoint} has not answered within max_age"
                              + (f": {self.last_error}" if self.last_error else ""))
        return ok, body

    def varz(self, query: dict[str, str]) -> dict:
        out = super().varz(query)
        out.update(endpoint=self.endpoint, polls=self.polls, poll_errors=self.errors,
                   last_error=self.last_error)
        return out

    def metrics(self) -> Iterable:
        p = "fastbus_broker_monitor_"
        age = self.snapshots.age()
        fresh = age is not None and age <= self.max_age
        yield GaugeMetricFamily(p + "up", "1 while the broker answers fastbus monitor's polls (its last answer "
                                          "is at most max_age old); the other fastbus_broker_* figures are "
                                          "served only then.", value=1 if fresh else 0)
        yield CounterMetricFamily(p + "errors", "Polls of the broker that got no (or no valid) answer.",
                                  value=self.errors)
        if age is not None:
            yield GaugeMetricFamily(p + "last_answer_age_seconds", "Seconds since the broker last answered.",
                                    value=round(age, 3))
        if fresh:
            yield from super().metrics()
