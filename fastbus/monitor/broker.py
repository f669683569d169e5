"""What the broker's HTTP endpoints serve (``fastbus broker --http``): a
:class:`BrokerSource` (the source interface of fastbus.monitor.http) fed
by the broker loop.

The loop calls :meth:`BrokerSource.publish` from its maintenance, about
once a second, with the counters it builds anyway (``Broker.stats_dict``)
and one tuple per peer (``Broker.peer_rows``); that is all the loop does
for monitoring.  Everything else (rates, JSON, the Prometheus text, the
subscription ranking) happens in the HTTP threads, on that snapshot.
The one exception is ``/subsz?limit=N``: it walks the subscription trie
(thread-safe; routing waits for the walk, so it is bounded and cached, see
:data:`SUBSZ_MAX_KEYS` and :data:`SUBSZ_CACHE_S`).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

import fastbus
from fastbus.broker.links import peer_dicts

from .http import Snapshots, process_rss

#: Counters whose rates /varz gives and the page charts.
RATE_KEYS = ("messages_in", "messages_out", "bytes_in", "bytes_out", "batches_in", "batches_out",
             "deliveries", "dropped", "control_in", "subscribe_ops", "unsubscribe_ops", "peers_joined",
             "peers_left", "flow_pauses", "gap_notices", "sessions_resumed", "messages_replayed")
#: /subsz ranks keys by subscribers only while the trie holds at most this
#: many keys (the walk holds the trie's lock, and routing waits for it: about
#: 10 ms per 100,000 keys on the 2-core dev machine) ...
SUBSZ_MAX_KEYS = 200_000
#: ... and at most once per this many seconds (a cached answer meanwhile).
SUBSZ_CACHE_S = 5.0
#: The most rows /connz and /subsz return in one answer.
MAX_LIMIT = 10_000

#: Counter metrics: (key in stats_dict, also the metric's name, help).
_COUNTER_METRICS = (
    ("messages_in", "Messages (records) received from publishers and routed."),
    ("bytes_in", "Bytes of PUB batches received (batch encoding included)."),
    ("batches_in", "PUB batches received."),
    ("messages_out", "Messages (records) sent to peers; one message to n subscribers counts n."),
    ("bytes_out", "Bytes of DATA batches sent to peers."),
    ("batches_out", "DATA batches sent to peers."),
    ("deliveries", "Records put into a peer's outbox by routing."),
    ("flow_pauses", "Times publishers were asked to pause (flow control: a subscriber's queue went over the "
                    "pause threshold)."),
    ("flow_timeouts", "Subscribers that kept publishers paused longer than flow_max_pause and stopped "
                      "holding them back."),
    ("gap_notices", "GAP notices sent: a subscriber told how many messages for it were dropped."),
    ("ack_timeouts", "Acknowledgements a confirmation stopped waiting for: a publisher or broker that did "
                     "not apply a subscription change within its lease (then it sends everything), or an "
                     "upstream broker that did not confirm within upstream_confirm_timeout."),
    ("sessions_detached", "Resumable sessions whose connection was lost: each lingered for its client."),
    ("sessions_resumed", "Lingering sessions their client resumed on a new connection."),
    ("sessions_expired", "Lingering sessions that ran out of --session-linger or --durable-linger (what "
                         "waited for them is drops{reason=\"session_expired\"})."),
    ("messages_replayed", "Messages sent again to a resumed session: what its lost connection had in flight."),
    ("resume_lost", "Messages a resumed session was told (GAP) it lost: past what the broker kept for it."),
    ("durable_taken_over", "Durable subscribers' sessions a new process took over (it presented the name; "
                           "the stream went on from where the last process stopped taking)."),
    ("no_responders", "Requests from clients that reached no subscriber, answered at once (NoResponders)."),
    ("queue_group_handed_over", "Messages a queue group member whose session ran out was given and never "
                                "took, handed to the group's other members."),
    ("held_kept", "Messages a held group kept for want of a member (Client.enqueue; a Channels layer's "
                  "named channel nobody received)."),
    ("held_given", "Messages held groups kept and gave to a member that joined since."),
    ("held_purged", "Messages held groups kept and dropped when the group was released (Client.release, "
                    "a Channels layer's flush())."),
    ("peers_joined", "Peers that joined (HELLO; also the upstream and plain-ZeroMQ links)."),
    ("peers_left", "Peers that left (BYE, disconnected, dropped)."),
    ("subscribe_ops", "Subscribe operations applied."),
    ("unsubscribe_ops", "Unsubscribe operations applied."),
    ("control_in", "Control messages received (HELLO, SUB, PING, STATS, BYE)."),
)


class BrokerSource:
    """The broker's figures for fastbus.monitor.http.MonitorServer."""

    kind = "broker"

    def __init__(self, broker, max_age: float = 3.0) -> None:
        self.broker = broker
        self.max_age = max_age
        #: How often the loop publishes (its maintenance runs at least this often).
        self.interval = min(1.0, max_age / 3)
        self.snapshots = Snapshots(keep=int(600 / self.interval) + 1)   # ten minutes of history
        self._stopped = False
        self._subsz_lock = threading.Lock()
        self._subsz_cache: tuple | None = None     # (monotonic, how many, top keys, wall time)

    # -- the loop's side ------------------------------------------------------

    def publish(self, stats: dict, peer_rows: list[tuple]) -> None:
        """A snapshot (the broker loop, in maintenance)."""
        counters = {k: stats.get(k, 0) for k in RATE_KEYS if k != "dropped"}
        counters["dropped"] = sum(stats["drops"].values())
        self.snapshots.publish(counters, (stats, peer_rows))

    def stopped(self) -> None:
        """The loop has ended: /healthz answers 503 from now on."""
        self._stopped = True

    # -- the HTTP threads' side ----------------------------------------------------

    def _latest(self) -> tuple:
        latest = self.snapshots.latest
        if latest is None:          # the loop publishes one before it serves
            raise ValueError("the broker has not published a snapshot yet")
        return latest

    def health(self) -> tuple[bool, dict]:
        age = self.snapshots.age()
        if self._stopped:
            return False, {"status": "stopped", "snapshot_age_s": age}
        if age is None or age > self.max_age:
            return False, {"status": "stale", "snapshot_age_s": None if age is None else round(age, 3),
                           "max_age_s": self.max_age,
                           "reason": "the broker loop has not published a snapshot within max_age: "
                                     "it is stuck or not serving"}
        return True, {"status": "ok", "snapshot_age_s": round(age, 3), "max_age_s": self.max_age}

    def endpoints(self) -> dict[str, Callable[[dict[str, str]], dict]]:
        return {"varz": self.varz, "connz": self.connz, "subsz": self.subsz}

    def varz(self, query: dict[str, str]) -> dict:
        """Counters, gauges and rates per second over the last ``window``
        seconds (default 5); ``history=S``: also the rates between
        snapshots over the last S seconds (at most 600)."""
        mono, wall, _counters, (stats, _rows) = self._latest()
        window = _number(query, "window", 5.0, 0.5, 600.0)
        rates, span = self.snapshots.rates(window)
        ok, _health = self.health()
        out = {"server": "fastbus broker", "kind": self.kind, "version": fastbus.__version__,
               "now": round(time.time(), 3), "snapshot_time": round(wall, 3),
               "snapshot_age_s": round(time.monotonic() - mono, 3), "healthy": ok,
               "rss_bytes": self._rss(stats), "http": self._http_url(),
               **stats, "dropped": sum(stats["drops"].values()),
               "rates": {k: round(v, 3) for k, v in rates.items()}, "rate_window_s": round(span, 3)}
        if "history" in query:
            out["history"] = self.snapshots.history(_number(query, "history", 300.0, 1.0, 600.0), RATE_KEYS)
        return out

    def connz(self, query: dict[str, str]) -> dict:
        """One entry per peer (link): ``limit`` (default 1000), ``offset``,
        ``sort`` by one of the numeric fields, largest first (default: by link id)."""
        mono, wall, _counters, (_stats, rows) = self._latest()
        peers = peer_dicts(rows)
        sort = query.get("sort")
        if sort:
            if not peers or sort not in peers[0] or not isinstance(peers[0][sort], (int, float)):
                numeric = [k for k, v in (peers[0] if peers else {}).items() if isinstance(v, (int, float))]
                raise ValueError(f"cannot sort by {sort!r}; sort by one of: {', '.join(numeric)}")
            peers.sort(key=lambda p: p[sort], reverse=True)
        offset = int(_number(query, "offset", 0, 0, 1e12))
        limit = int(_number(query, "limit", 1000, 0, MAX_LIMIT))
        return {"now": round(time.time(), 3), "snapshot_time": round(wall, 3), "total": len(peers),
                "offset": offset, "limit": limit, "connections": peers[offset:offset + limit]}

    def subsz(self, query: dict[str, str]) -> dict:
        """Subscription counts; ``limit=N``: also the N keys with the most
        subscribers (computed from the trie, bounded and cached)."""
        _mono, wall, _counters, (stats, _rows) = self._latest()
        out = {"now": round(time.time(), 3), "snapshot_time": round(wall, 3),
               "subscriptions": stats["subscriptions"], "keys": stats["keys"]}
        if "limit" not in query:
            return out
        limit = int(_number(query, "limit", 10, 1, MAX_LIMIT))
        top, computed, note = self._top_keys(limit)
        out.update(limit=limit, top=top, top_computed_at=computed)
        if note:
            out["note"] = note
        return out

    # -- what differs for a broker watched from elsewhere (fastbus.monitor.remote)

    def _rss(self, stats: dict) -> int | None:
        """The broker process's resident memory: this process's."""
        return process_rss()

    def _http_url(self) -> str | None:
        return self.broker.http_url

    def _title(self) -> str:
        return f"fastbus broker {self.broker.config.name}"

    def _top_keys(self, limit: int) -> tuple[list | None, float | None, str | None]:
        trie = self.broker.trie
        with self._subsz_lock:
            now = time.monotonic()
            cache = self._subsz_cache
            if cache is None or now - cache[0] > SUBSZ_CACHE_S or cache[1] < limit:
                nkeys = trie.stats()["keys"]
                if nkeys > SUBSZ_MAX_KEYS:
                    return None, None, (f"{nkeys:,} keys: the ranking is computed only up to "
                                        f"{SUBSZ_MAX_KEYS:,} keys (it walks the whole table)")
                keys = trie.keys()
                best = heapq.nlargest(max(limit, 100), keys, key=lambda e: e[2])
                cache = self._subsz_cache = (now, max(limit, 100), best, time.time())
        top = [{"key": k.decode("utf-8", "replace"), "prefix": p, "subscribers": n} for k, p, n in cache[2][:limit]]
        return top, round(cache[3], 3), None

    def metrics(self) -> Iterable:
        latest = self.snapshots.latest
        if latest is None:
            return
        mono, _wall, _counters, (stats, _rows) = latest
        p = "fastbus_broker_"
        info = GaugeMetricFamily(p + "info", "The broker: its name, instance id (changes at each start) and "
                                             "fastbus version; always 1.",
                                 labels=["name", "instance", "version"])
        info.add_metric([stats["name"], stats["instance"], fastbus.__version__], 1)
        yield info
        for key, text in _COUNTER_METRICS:
            yield CounterMetricFamily(p + key, text, value=stats.get(key, 0))
        drops = CounterMetricFamily(p + "drops", "What the broker dropped, by reason (README: Monitoring "
                                                 "says what each reason counts).", labels=["reason"])
        for reason, n in stats["drops"].items():
            drops.add_metric([reason], n)
        yield drops
        peers = GaugeMetricFamily(p + "peers", "Connected peers (links) by role.", labels=["role"])
        for role in ("client", "redis", "broker", "upstream", "zmq-pub"):
            peers.add_metric([role], stats["links"].get(role, 0))
        yield peers
        yield GaugeMetricFamily(p + "sessions", "Sessions on the client endpoints (clients and downstream "
                                                "brokers).", value=stats["peers"])
        yield GaugeMetricFamily(p + "publishers", "Publishing clients (they get WANT filters and FLOW).",
                                value=stats["publishers"])
        yield GaugeMetricFamily(p + "subscriptions", "Subscriptions held (each key of each peer).",
                                value=stats["subscriptions"])
        yield GaugeMetricFamily(p + "subscription_keys", "Distinct subscription keys.", value=stats["keys"])
        yield GaugeMetricFamily(p + "queued_bytes", "Bytes queued for peers whose sockets did not take them "
                                                    "yet (slow subscribers).", value=stats["queued_bytes"])
        yield GaugeMetricFamily(p + "flow_paused", "1 while publishers are asked to pause (flow control).",
                                value=1 if stats.get("flow_paused") else 0)
        yield GaugeMetricFamily(p + "sessions_lingering", "Sessions whose connection is gone, kept for their "
                                                          "client to resume.", value=stats.get("sessions_lingering", 0))
        yield GaugeMetricFamily(p + "queue_groups", "Queue groups held (subscribe(..., queue=)).",
                                value=stats.get("queue_groups", 0))
        yield GaugeMetricFamily(p + "queue_group_members", "Members of the queue groups held (a broker link is "
                                                           "one for the members behind it).",
                                value=stats.get("queue_group_members", 0))
        yield GaugeMetricFamily(p + "held_groups", "Held queue groups (Client.hold: they keep what no member "
                                                   "can take).", value=stats.get("held_groups", 0))
        yield GaugeMetricFamily(p + "held_messages", "Messages the held groups keep now, for a member to come.",
                                value=stats.get("held_messages", 0))
        yield GaugeMetricFamily(p + "held_bytes", "What the held groups keep now costs (bytes; bound: "
                                                  "--max-held-bytes).", value=stats.get("held_bytes", 0))
        yield GaugeMetricFamily(p + "held_bindings", "Channels bound to held groups (Client.bind: the groups "
                                                     "take what they get).", value=stats.get("held_bindings", 0))
        conns = stats.get("connections")
        if conns:                                   # the broker's own transport (None: libzmq's)
            yield CounterMetricFamily(p + "connections_accepted", "Client connections accepted.",
                                      value=conns["accepted"])
            yield CounterMetricFamily(p + "connections_refused_input", "Client connections closed for what "
                                      "they sent (not ZMTP, a message over max_message_bytes).",
                                      value=conns["protocol_errors"])
        journal = stats.get("journal")
        if journal:                                 # --journal
            yield GaugeMetricFamily(p + "journal_bytes", "Bytes of the journal's segments on disk (its bound: "
                                    "--journal-bytes).", value=journal["bytes"])
            yield GaugeMetricFamily(p + "journal_segments", "Segment files of the journal on disk.",
                                    value=journal["segments"])
            yield CounterMetricFamily(p + "journal_commits", "Group commits written (one write each).",
                                      value=journal["commits"])
            yield CounterMetricFamily(p + "journal_fsyncs", "Syncs of the journal to disk (--fsync).",
                                      value=journal["fsyncs"])
            yield CounterMetricFamily(p + "journal_fsync_seconds", "Time the journal's syncs took, in all.",
                                      value=journal["fsync_seconds"])
            yield CounterMetricFamily(p + "journal_write_errors", "Commits that could not be written (a full "
                                      "disk): tried again, no acknowledgement meanwhile.",
                                      value=journal["write_errors"])
        yield GaugeMetricFamily(p + "uptime_seconds", "Seconds since the broker started.",
                                value=stats["uptime_s"])
        yield GaugeMetricFamily(p + "snapshot_age_seconds", "Age of the snapshot these figures come from "
                                                            "(the loop publishes one about every second).",
                                value=round(time.monotonic() - mono, 3))
        rss = self._rss(stats)
        if rss is not None:
            yield GaugeMetricFamily(p + "resident_memory_bytes", "Resident memory of the broker process.",
                                    value=rss)

    def layout(self) -> dict:
        return {
            "title": self._title(), "kind": self.kind, "poll": "/varz",
            "history": "/varz?history=300",
            "tiles": [{"key": "peers", "label": "sessions"}, {"key": "subscriptions", "label": "subscriptions"},
                      {"key": "messages_in", "label": "messages in"},
                      {"key": "messages_out", "label": "messages out"},
                      {"key": "bytes_in", "label": "bytes in", "unit": "bytes"},
                      {"key": "bytes_out", "label": "bytes out", "unit": "bytes"},
                      {"key": "queued_bytes", "label": "queued", "unit": "bytes"},
                      {"key": "dropped", "label": "dropped"},
                      {"key": "drops.slow_consumer", "label": "slow-consumer drops"},
                      {"key": "flow_pauses", "label": "flow pauses"},
                      {"key": "gap_notices", "label": "gap notices"},
                      {"key": "sessions_lingering", "label": "sessions lingering"},
                      {"key": "sessions_resumed", "label": "sessions resumed"},
                      {"key": "messages_replayed", "label": "messages sent again"},
                      {"key": "journal.bytes", "label": "journal", "unit": "bytes"},
                      {"key": "rss_bytes", "label": "memory (RSS)", "unit": "bytes"},
                      {"key": "uptime_s", "label": "uptime", "unit": "s"}],
            "charts": [{"title": "messages / s", "series": [{"key": "messages_in", "label": "in"},
                                                            {"key": "messages_out", "label": "out"}]},
                       {"title": "bytes / s", "unit": "bytes", "series": [{"key": "bytes_in", "label": "in"},
                                                                         {"key": "bytes_out", "label": "out"}]},
                       {"title": "batches / s", "series": [{"key": "batches_in", "label": "in"},
                                                           {"key": "batches_out", "label": "out"}]},
                       {"title": "dropped / s", "series": [{"key": "dropped", "label": "dropped"},
                                                           {"key": "gap_notices", "label": "gap notices"}]}],
            "tables": [{"title": "peers", "path": "/connz?limit=200&sort=messages_out", "rows": "connections",
                        "id": "link",
                        # A Client has a publishing and a subscribing session: one row each.
                        "columns": [{"key": "name", "label": "name"}, {"key": "role", "label": "role"},
                                    {"key": "publisher", "label": "publishes"},
                                    {"key": "address", "label": "address"},
                                    {"key": "subscriptions", "label": "subs"},
                                    {"key": "messages_in", "label": "msgs in"},
                                    {"key": "messages_out", "label": "msgs out"},
                                    {"key": "bytes_in", "label": "bytes in", "unit": "bytes"},
                                    {"key": "bytes_out", "label": "bytes out", "unit": "bytes"},
                                    {"key": "queued_bytes", "label": "queued", "unit": "bytes"},
                                    {"key": "slow", "label": "slow"},
                                    {"key": "connected_since", "label": "since", "unit": "time"}]},
                       {"title": "top subscriptions", "path": "/subsz?limit=20", "rows": "top", "id": "key",
                        "columns": [{"key": "key", "label": "key"}, {"key": "prefix", "label": "prefix"},
                                    {"key": "subscribers", "label": "subscribers"}]}],
        }


def _number(query: dict[str, str], name: str, default: float, lo: float, hi: float) -> float:
    text = query.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, not {text!r}") from None
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be between {lo:g} and {hi:g}, not {text}")
    return value
