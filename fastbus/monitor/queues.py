"""The queues of a Redis server as a monitoring source: every registered
work queue, topic (with each logical consumer) and inbox, sampled every
``interval`` seconds.

    src = QueueSource("redis://127.0.0.1:6379/0")
    src.start()                        # a thread samples every interval
    src.snapshot()                     # the latest sample as JSON-ready dict (/queuez)
    prometheus_client.REGISTRY.register(src)   # fastbus_queue_* families (collect())

A sample reads the registry (:func:`fastbus.queue.list_queues`), then each
name with one read-only script (``fastbus/queue/lua/monitor_*.lua``), all
pipelined in one round trip where the client allows (one call per name on
a cluster).  What the HTTP server serves is the last sample: a scrape never
reaches Redis.

Figures, per work queue and per logical consumer of a topic:

* ``ready``, ``failed`` (the dead-letter list), ``unacked`` (per consumer
  instance and summed), the age of the oldest ready message;
* the consumer instances: unacked, alive (heartbeat key present), the
  server time of the last heartbeat;
* running totals kept by the queue's scripts, named for operators:
  ``in`` (put, or published into the consumer's list), ``delivered`` (got),
  ``acked``, ``rejected`` (to failed by the consumer), ``requeued``,
  ``returned`` (given back by a consumer that closed or died),
  ``dead_lettered`` (to failed after max deliveries) and ``expired`` (a
  topic body gone before delivery);
* ``rates``: the same per second, over the last ``window`` seconds of
  samples (a ring of recent samples: the difference of the totals over the
  time between the samples).

Per topic: last id, messages published, body blocks held.  Per inbox: last
id (= messages sent), messages stored, members, each member's pending count
(the ``limit`` members furthest behind) and totals ``in`` (sent), ``acked``
(ids members acked, summed) and ``expired``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import redis

from fastbus.queue.common import Call, Many
from fastbus.queue.names import DEFAULT_PREFIX, check_prefix, namespace
from fastbus.queue.driver import sync_driver
from fastbus.queue.registry import read_names

from .http import CounterRing, Ticker

log = logging.getLogger("fastbus.monitor")
_NETWORK = (redis.ConnectionError, redis.TimeoutError, OSError)

__all__ = ["OPS", "QueueSource"]

# the scripts' counter names -> the names the monitor shows
OPS = {"put": "in", "get": "delivered", "ack": "acked", "reject": "rejected", "requeue": "requeued",
       "returned": "returned", "dead": "dead_lettered", "expired": "expired"}
QUEUE_OPS = tuple(OPS.values())
INBOX_OPS = ("in", "acked", "expired")
_INBOX_COUNTERS = {"ack": "acked", "expired": "expired"}


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _counters(flat: list, names: dict[str, str], ops: tuple) -> dict[str, int]:
    out = dict.fromkeys(ops, 0)
    for i in range(0, len(flat) - 1, 2):
        k = names.get(_text(flat[i]))
        if k is not None:
            out[k] = int(flat[i + 1])
    return out


def _instances(cons: list, now_ms: int) -> list[dict]:
    out = []
    for i in range(0, len(cons) - 3, 4):
        pttl, beat = int(cons[i + 2]), int(cons[i + 3])
        out.append({
            "tag": _text(cons[i]),
            "unacked": int(cons[i + 1]),
            "alive": pttl > 0,
            "heartbeat_expires_in_s": pttl / 1000 if pttl > 0 else 0.0,
            "last_heartbeat": beat / 1000 if beat else None,
            "last_heartbeat_age_s": max(0, now_ms - beat) / 1000 if beat else None,
        })
    out.sort(key=lambda c: c["tag"])
    return out


def _space(reply: list, now_ms: int) -> dict:
    ready, failed, stats, cons, oldest = reply
    inst = _instances(cons, now_ms)
    live = sum(c["alive"] for c in inst)
    return {
        "ready": int(ready),
        "failed": int(failed),
        "unacked": sum(c["unacked"] for c in inst),
        "oldest_ready_age_s": max(0, now_ms - int(oldest)) / 1000 if int(oldest) else None,
        "live": live,
        "dead": len(inst) - live,
        "instances": inst,
        "totals": _counters(stats, OPS, QUEUE_OPS),
    }


def _lanes(snap: dict) -> list[dict]:
    """One flat row per work queue, topic consumer and inbox (the web
    page's table): kind, name, consumer, ready, unacked, failed, live, dead,
    in_rate, acked_rate, oldest_ready_age_s."""
    rows = []

    def row(kind, name, consumer, s, ready=None):
        rows.append({"id": f"{kind}:{name}/{consumer}", "kind": kind, "name": name, "consumer": consumer,
                     "ready": s.get("ready") if ready is None else ready, "unacked": s.get("unacked"),
                     "failed": s.get("failed"), "live": s.get("live"), "dead": s.get("dead"),
                     "in_rate": round(s["rates"].get("in", 0.0), 3) if "rates" in s else None,
                     "acked_rate": round(s["rates"].get("acked", 0.0), 3) if "rates" in s else None,
                     "oldest_ready_age_s": s.get("oldest_ready_age_s", s.get("oldest_age_s"))})

    for q in snap["queues"]:
        row("queue", q["name"], "", q)
    for t in snap["topics"]:
        for c in t.get("consumers", ()):
            row("topic", t["name"], c["name"], c)
        if "error" in t:
            row("topic", t["name"], "", t)
    for b in snap["inboxes"]:
        row("inbox", b["name"], "", b, ready=sum(p["pending"] for p in b.get("pending", ())) if "pending" in b else None)
    return rows


class QueueSource:
    """The queues of one Redis server (and key prefix), sampled.

    ``redis``: a URL, ``redis.Redis``, ``RedisCluster`` or None (the
    embedded server).  ``interval``: seconds between samples of the thread
    :meth:`start` runs; ``window``: seconds the rates average over;
    ``history``: seconds of samples kept (the rates' ring, and the charts);
    ``members``: inbox members listed per inbox (those furthest behind).

    Thread-safe: :meth:`sample` may run in one thread while others read
    :meth:`snapshot` and :meth:`collect`."""

    name = "queues"
    kind = "queues"          # the source protocol's name (fastbus.monitor.http)

    def __init__(self, redis: Any = None, *, prefix: str = DEFAULT_PREFIX, interval: float = 1.0,
                 window: float = 10.0, history: float = 300.0, members: int = 100) -> None:
        for what, v in (("interval", interval), ("window", window), ("history", history)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{what} must be a number of seconds > 0, not {v!r}")
        if isinstance(members, bool) or not isinstance(members, int) or members <= 0:
            raise ValueError(f"members must be an int > 0, not {members!r}")
        self.prefix = check_prefix(prefix)
        self.interval = float(interval)
        self.window = float(window)
        self.members = members
        self._size = max(2, int(history / interval) + 1)
        self._driver, self._own = sync_driver(redis)
        from fastbus.redis.errors import address_of
        self.server = address_of(self._driver.client) or "?"
        self._lock = threading.Lock()           # one sample at a time; the snapshot swapped whole
        self._rings: dict[tuple, CounterRing] = {}
        self._snap: dict | None = None
        self._ok_at: float | None = None        # time.monotonic() of the last good sample
        self.samples = 0
        self.errors = 0
        self._ticker = Ticker(self.sample, self.interval, "fastbus-queue-monitor")

    # -- sampling

    def sample(self, now: float | None = None) -> dict:
        """Read every registered queue once and keep the result as the
        current snapshot (returned).  ``now``: the sample's time in seconds
        (default ``time.time()``; the rates are differences over it).  A
        failure to reach the server is kept in the snapshot (``ok`` false,
        ``error``) with the figures of the last good sample, and counted."""
        with self._lock:
            t = time.time() if now is None else float(now)
            started = time.perf_counter()
            try:
                snap = self._read(t)
            except Exception as e:  # noqa: BLE001 - a monitor reports what failed and goes on
                self.errors += 1
                log.warning("queue monitor: sample of %s failed: %s", self.server, e)
                old = self._snap or self._empty(t)
                snap = {**old, "ok": False, "error": f"{type(e).__name__}: {e}", "errors": self.errors}
            else:
                self._ok_at = time.monotonic()
            snap["sample_seconds"] = round(time.perf_counter() - started, 6)
            self.samples += 1
            snap["samples"] = self.samples
            self._snap = snap
            return snap

    def _empty(self, t: float) -> dict:
        return {"source": self.name, "server": self.server, "prefix": self.prefix, "time": t, "snapshot_time": t,
                "interval": self.interval, "window": self.window, "ok": True, "error": None,
                "samples": self.samples, "errors": self.errors,
                "counts": {"queues": 0, "topics": 0, "inboxes": 0},
                "sums": {"ready": 0, "unacked": 0, "failed": 0, "live": 0, "dead": 0},
                "totals": {}, "rates": {}, "queues": [], "topics": [], "inboxes": [], "lanes": []}

    def _read(self, t: float) -> dict:
        names = self._driver.run(read_names(self.prefix, None))
        calls = []
        for n in names:
            if n.kind == "queue":
                ns = namespace("q", self.prefix, n.name)
                calls.append(Call("MONITOR_QUEUE", ns + "ready", (ns,)))
            elif n.kind == "topic":
                ns = namespace("t", self.prefix, n.name)
                calls.append(Call("MONITOR_TOPIC", ns + "seq", (ns,)))
            else:
                ns = namespace("i", self.prefix, n.name)
                calls.append(Call("MONITOR_INBOX", ns + "members", (ns, self.members)))

        def many(op_calls):
            return (yield Many(op_calls, partial=True))

        replies = self._driver.run(many(calls)) if calls else []
        lost = next((r for r in replies if isinstance(r, _NETWORK)), None)
        if lost is not None:
            raise lost                               # the server went away: not one queue's fault
        snap = self._empty(t)
        seen: set[tuple] = set()
        failures = []
        for n, r in zip(names, replies):
            if isinstance(r, BaseException):
                # one queue unreadable (a key of another type, say): shown with its error, the others go on
                failures.append(f"{n.kind} {n.name}: {r}")
                snap[n.kind + ("es" if n.kind == "inbox" else "s")].append(
                    {"kind": n.kind, "name": n.name, "error": str(r)})
                continue
            if n.kind == "queue":
                q = {"kind": "queue", "name": n.name, **_space(r[0], int(r[1]))}
                q["rates"] = self._rate(("queue", n.name, ""), t, q["totals"], seen)
                snap["queues"].append(q)
            elif n.kind == "topic":
                snap["topics"].append(self._topic(n.name, r, t, seen))
            else:
                snap["inboxes"].append(self._inbox(n.name, r, t, seen))
        snap["counts"] = {k: len(snap[k]) for k in ("queues", "topics", "inboxes")}
        if failures:
            snap["error"] = "; ".join(failures[:5])
        snap["lanes"] = _lanes(snap)
        snap["sums"] = {k: sum(r[k] or 0 for r in snap["lanes"]) for k in ("ready", "unacked", "failed", "live", "dead")}
        totals = self._grand_totals(snap)
        snap["totals"] = totals
        snap["rates"] = self._rate(("all", "", ""), t, totals, seen)
        for key in list(self._rings):
            if key not in seen:
                del self._rings[key]                 # a name no longer registered
        return snap

    def _rate(self, key: tuple, t: float, totals: dict, seen: set) -> dict[str, float]:
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = CounterRing(self._size, reset_on_fall=True)
        ring.add(t, totals)
        seen.add(key)
        return ring.rates(self.window)[0]

    def _topic(self, name: str, r: list, t: float, seen: set) -> dict:
        last, stats, blocks, cs, now_ms = r
        published = _counters(stats, {"put": "in"}, ("in",))
        consumers = []
        for i in range(0, len(cs) - 1, 2):
            cname = _text(cs[i])
            c = {"name": cname, **_space(cs[i + 1], int(now_ms))}
            c["rates"] = self._rate(("topic", name, cname), t, c["totals"], seen)
            consumers.append(c)
        consumers.sort(key=lambda c: c["name"])
        return {"kind": "topic", "name": name, "last_id": int(last), "published": published["in"],
                "blocks": int(blocks), "totals": published,
                "rates": self._rate(("topic", name, ""), t, published, seen), "consumers": consumers}

    def _inbox(self, name: str, r: list, t: float, seen: set) -> dict:
        last, stored, stats, n_members, flat, oldest, now_ms = r
        totals = _counters(stats, _INBOX_COUNTERS, INBOX_OPS)
        totals["in"] = int(last)                     # ids are given one per message sent
        pending = [{"member": _text(flat[i]), "acked_upto": int(flat[i + 1]), "pending": int(flat[i + 2])}
                   for i in range(0, len(flat) - 2, 3)]
        return {"kind": "inbox", "name": name, "last_id": int(last), "stored": int(stored),
                "members": int(n_members), "pending": pending,
                "oldest_age_s": max(0, int(now_ms) - int(oldest)) / 1000 if int(oldest) else None,
                "totals": totals, "rates": self._rate(("inbox", name, ""), t, totals, seen)}

    @staticmethod
    def _grand_totals(snap: dict) -> dict[str, int]:
        """Summed over every work queue, topic consumer and inbox."""
        out = dict.fromkeys(QUEUE_OPS, 0)
        spaces = [q for q in snap["queues"] if "totals" in q]
        spaces += [c for tp in snap["topics"] for c in tp.get("consumers", ())]
        spaces += [b for b in snap["inboxes"] if "totals" in b]
        for s in spaces:
            for k, v in s["totals"].items():
                out[k] += v
        return out

    # -- reading

    def snapshot(self, *, history: float | None = None) -> dict:
        """The latest sample (taken now if there is none yet).  ``history``
        (seconds): add, for the sum of all and per queue, topic consumer and
        inbox, ``history``: the rates between consecutive samples over that
        much of the kept ring, ``{"t": [...], "dt": [...], "rates": {"in":
        [...], ...}}`` (for charts)."""
        snap = self._snap
        if snap is None:
            snap = self.sample()
        if history is None:
            return snap
        with self._lock:
            rings = {k: r.history(history) for k, r in self._rings.items()}
        empty = {"t": [], "dt": [], "rates": {}}
        out = {**snap, "history": rings.get(("all", "", ""), empty)}
        out["queues"] = [{**q, "history": rings.get(("queue", q["name"], ""), empty)} for q in snap["queues"]]
        out["topics"] = [{**tp, "history": rings.get(("topic", tp["name"], ""), empty),
                          "consumers": [{**c, "history": rings.get(("topic", tp["name"], c["name"]), empty)}
                                        for c in tp.get("consumers", ())]}
                         for tp in snap["topics"]]
        out["inboxes"] = [{**b, "history": rings.get(("inbox", b["name"], ""), empty)} for b in snap["inboxes"]]
        return out

    def healthy(self) -> bool:
        """True while samples succeed: the last one did, and (with the
        thread running) it is at most three intervals old."""
        return self.health()[0]

    def health(self) -> tuple[bool, dict]:
        """For /healthz: (ok, why)."""
        snap = self._snap
        age = None if self._ok_at is None else round(time.monotonic() - self._ok_at, 3)
        body = {"source": self.name, "server": self.server, "last_good_sample_age_s": age,
                "error": snap["error"] if snap else "no sample yet"}
        ok = snap is not None and snap["ok"] and age is not None
        if ok and self._ticker.running and age > 3 * self.interval + 1:
            ok = False
            body["error"] = f"the last good sample is {age:.1f} s old"
        body["status"] = "ok" if ok else "unavailable"
        return ok, body

    def endpoints(self) -> dict:
        """JSON endpoints by name: handler(query: dict[str, str]) -> dict
        (ValueError for a bad parameter).  ``varz`` and ``queuez``: the
        snapshot; ``?history=SECONDS`` adds the charts' series (at most the
        kept ring), ``?kind=queue|topic|inbox`` and ``?name=N`` keep those only."""
        return {"varz": self.varz, "queuez": self.varz}

    def varz(self, query: dict) -> dict:
        q = {k: (v[-1] if isinstance(v, list) else v) for k, v in (query or {}).items()}
        history = None
        if q.get("history") not in (None, ""):
            try:
                history = float(q["history"])
            except ValueError:
                raise ValueError(f"history must be a number of seconds, not {q['history']!r}") from None
            if not history > 0:
                raise ValueError(f"history must be > 0 seconds, not {q['history']!r}")
        kind, name = q.get("kind"), q.get("name")
        if kind not in (None, "", "queue", "topic", "inbox"):
            raise ValueError(f"kind must be queue, topic or inbox, not {kind!r}")
        snap = self.snapshot(history=history)
        if kind or name:
            snap = dict(snap)
            for k, plural in (("queue", "queues"), ("topic", "topics"), ("inbox", "inboxes")):
                if kind and kind != k:
                    snap[plural] = []
                elif name:
                    snap[plural] = [x for x in snap[plural] if x["name"] == name]
            snap["lanes"] = [r for r in snap["lanes"] if (not kind or r["kind"] == kind)
                             and (not name or r["name"] == name)]
        return snap

    def layout(self) -> dict:
        """What the web page (fastbus.monitor.http) shows of the queues."""
        return {
            "title": f"fastbus queues on {self.server}",
            "poll": "/varz",
            "history": "/varz?history=300",
            "tiles": [{"key": "sums.ready", "label": "ready", "unit": ""},
                      {"key": "sums.unacked", "label": "unacked", "unit": ""},
                      {"key": "sums.failed", "label": "failed", "unit": ""},
                      {"key": "sums.live", "label": "live consumers", "unit": ""},
                      {"key": "sums.dead", "label": "dead consumers", "unit": ""},
                      {"key": "counts.queues", "label": "queues", "unit": ""},
                      {"key": "counts.topics", "label": "topics", "unit": ""},
                      {"key": "counts.inboxes", "label": "inboxes", "unit": ""}],
            "charts": [{"title": "messages / s", "unit": "",
                        "series": [{"key": "in", "label": "in"}, {"key": "delivered", "label": "delivered"},
                                   {"key": "acked", "label": "acked"}]},
                       {"title": "failures / s", "unit": "",
                        "series": [{"key": "rejected", "label": "rejected"},
                                   {"key": "dead_lettered", "label": "dead-lettered"},
                                   {"key": "returned", "label": "returned"},
                                   {"key": "requeued", "label": "requeued"}]}],
            "tables": [{"title": "queues, topic consumers, inboxes", "path": "/varz", "rows": "lanes", "id": "id",
                        "columns": [{"key": "kind", "label": "kind", "unit": ""},
                                    {"key": "name", "label": "name", "unit": ""},
                                    {"key": "consumer", "label": "consumer", "unit": ""},
                                    {"key": "ready", "label": "ready", "unit": ""},
                                    {"key": "unacked", "label": "unacked", "unit": ""},
                                    {"key": "failed", "label": "failed", "unit": ""},
                                    {"key": "live", "label": "live", "unit": ""},
                                    {"key": "dead", "label": "dead", "unit": ""},
                                    {"key": "in_rate", "label": "in /s", "unit": ""},
                                    {"key": "acked_rate", "label": "acked /s", "unit": ""},
                                    {"key": "oldest_ready_age_s", "label": "oldest", "unit": "s"}]}],
        }

    # -- Prometheus

    def metrics(self) -> Iterator:
        """The metric families (the source protocol's name for :meth:`collect`)."""
        return self.collect()

    def describe(self) -> list:
        return []            # collect() reads only the last sample: nothing to ask at registration

    def collect(self) -> Iterator:
        """The fastbus_queue_* metric families of the latest sample (see
        docs/QUEUES.md, "Monitoring")."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        snap = self.snapshot()
        L = ["kind", "name", "consumer"]
        ready = GaugeMetricFamily("fastbus_queue_ready", "Messages waiting to be delivered (inbox: per member, "
                                  "not yet acked)", labels=L)
        failed = GaugeMetricFamily("fastbus_queue_failed", "Messages in the failed (dead-letter) list", labels=L)
        unacked = GaugeMetricFamily("fastbus_queue_unacked", "Messages delivered and not yet settled", labels=L)
        oldest = GaugeMetricFamily("fastbus_queue_oldest_ready_age_seconds",
                                   "Age of the oldest ready message (server time)", labels=L)
        consumers = GaugeMetricFamily("fastbus_queue_consumers", "Consumer instances by heartbeat state",
                                      labels=L + ["state"])
        inst_unacked = GaugeMetricFamily("fastbus_queue_consumer_unacked", "Messages one consumer instance holds",
                                         labels=L + ["tag"])
        inst_alive = GaugeMetricFamily("fastbus_queue_consumer_alive",
                                       "1 while the instance's heartbeat is current", labels=L + ["tag"])
        inst_beat = GaugeMetricFamily("fastbus_queue_consumer_last_heartbeat_timestamp_seconds",
                                      "Server time of the instance's last heartbeat", labels=L + ["tag"])
        messages = CounterMetricFamily("fastbus_queue_messages", "Messages by operation since the queue was made "
                                       "(in, delivered, acked, rejected, requeued, returned, dead_lettered, "
                                       "expired)", labels=L + ["op"])
        last_id = GaugeMetricFamily("fastbus_queue_last_id", "The newest message id (topics, inboxes)",
                                    labels=["kind", "name"])
        blocks = GaugeMetricFamily("fastbus_queue_topic_blocks", "Blocks of up to 1024 message bodies a topic "
                                   "holds", labels=["name"])
        stored = GaugeMetricFamily("fastbus_queue_inbox_stored", "Messages an inbox stores", labels=["name"])
        members = GaugeMetricFamily("fastbus_queue_inbox_members", "Members of an inbox", labels=["name"])

        def space(kind: str, name: str, consumer: str, s: dict) -> None:
            lab = [kind, name, consumer]
            ready.add_metric(lab, s["ready"])
            failed.add_metric(lab, s["failed"])
            unacked.add_metric(lab, s["unacked"])
            if s["oldest_ready_age_s"] is not None:
                oldest.add_metric(lab, s["oldest_ready_age_s"])
            consumers.add_metric(lab + ["live"], s["live"])
            consumers.add_metric(lab + ["dead"], s["dead"])
            for i in s["instances"]:
                inst_unacked.add_metric(lab + [i["tag"]], i["unacked"])
                inst_alive.add_metric(lab + [i["tag"]], 1 if i["alive"] else 0)
                if i["last_heartbeat"] is not None:
                    inst_beat.add_metric(lab + [i["tag"]], i["last_heartbeat"])
            for op, v in s["totals"].items():
                messages.add_metric(lab + [op], v)

        for q in snap["queues"]:
            if "totals" in q:
                space("queue", q["name"], "", q)
        for tp in snap["topics"]:
            if "totals" not in tp:
                continue
            messages.add_metric(["topic", tp["name"], "", "in"], tp["published"])
            last_id.add_metric(["topic", tp["name"]], tp["last_id"])
            blocks.add_metric([tp["name"]], tp["blocks"])
            for c in tp["consumers"]:
                space("topic", tp["name"], c["name"], c)
        for b in snap["inboxes"]:
            if "totals" not in b:
                continue
            last_id.add_metric(["inbox", b["name"]], b["last_id"])
            stored.add_metric([b["name"]], b["stored"])
            members.add_metric([b["name"]], b["members"])
            for op, v in b["totals"].items():
                messages.add_metric(["inbox", b["name"], "", op], v)
            for p in b["pending"]:
                ready.add_metric(["inbox", b["name"], p["member"]], p["pending"])
        registered = GaugeMetricFamily("fastbus_queue_registered", "Names in the registry by kind", labels=["kind"])
        for k in ("queue", "topic", "inbox"):
            registered.add_metric([k], snap["counts"][k + ("es" if k == "inbox" else "s")])
        up = GaugeMetricFamily("fastbus_queue_monitor_up", "1 if the last sample of the Redis server succeeded")
        up.add_metric([], 1 if snap["ok"] else 0)
        errors = CounterMetricFamily("fastbus_queue_monitor_errors", "Samples that failed")
        errors.add_metric([], self.errors)
        took = GaugeMetricFamily("fastbus_queue_monitor_sample_seconds", "How long the last sample took")
        took.add_metric([], snap.get("sample_seconds", 0.0))
        yield from (ready, failed, unacked, oldest, consumers, inst_unacked, inst_alive, inst_beat, messages,
                    last_id, blocks, stored, members, registered, up, errors, took)

    # -- the sampling thread

    def start(self) -> QueueSource:
        """Sample every ``interval`` seconds in a daemon thread (the first now)."""
        self._ticker.start()
        return self

    def stop(self) -> None:
        """Stop the thread (if running)."""
        self._ticker.stop()

    def close(self) -> None:
        """Stop the thread; close the client if this source made it."""
        self.stop()
        if self._own:
            self._driver.close()
        else:
            self._driver.release()

    def __enter__(self) -> QueueSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
