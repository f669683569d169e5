"""Exactly-once publishing of numbered batches, for engines that retry them.

A batch engine (Spark Structured Streaming's sink, say) runs the tasks of
batch *b* anywhere, may run a task twice, may die after publishing half a
batch, and replays an uncommitted batch after a restart with the same rows.
Publishing straight from the tasks would then publish some rows twice.
Instead:

    w = StagedWriter("topic", "orders", url, writer_id="daily-report")
    key = w.stage(rows)                  # in each task: rows into a staging list
    w.commit(batch_id, [key, ...])       # once, on the driver, keys in task order

``commit`` publishes the staged rows to the target with a script, 10,000 rows
a call, and records in the writer's state hash how far it got; the last call
marks the batch done and deletes the staging lists.  So:

* a batch at or below the last one done publishes nothing (a replay);
* a commit that died half way is finished by the next commit of the same
  batch, which skips the rows already published (counted in row order, so
  the replayed batch must stage the same rows in the same task order: Spark
  guarantees this for deterministic queries over replayable sources);
* rows staged by a task whose batch never commits expire with their list
  (``stage_ttl``, one day) or are dropped by :meth:`discard`.

Targets: ``"topic"`` (a :class:`~fastbus.queue.Topic`), ``"queue"`` (a
:class:`~fastbus.queue.WorkQueue`) or ``"channel"`` (Redis pub/sub ``PUBLISH``:
exactly once into the server; pub/sub itself delivers only to who listens).
The staging lists and the state hash share the target's hash slot, so this
works on Redis Cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from fastbus.queue.common import Call, Cmd, Many, Op, chunks, payload_list, positive_int, positive_seconds
from fastbus.queue.names import DEFAULT_PREFIX, check_name, namespace
from fastbus.queue.driver import SyncHandle
from fastbus.queue.registry import Listing

__all__ = ["StagedWriter"]

KINDS = {"topic": "t", "queue": "q", "channel": "c"}
STEP = 10000


class _StagedOps:
    def __init__(self, kind: str, name: str, prefix: str, writer_id: str, ttl: float,
                 stage_ttl: float) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        self.kind = KINDS[kind]
        if self.kind == "c":
            # a Redis channel's name is free-form ("news:sports"); only the
            # braces would break the hash tag of the keys named after it
            if isinstance(name, bytes):
                name = name.decode()
            if not isinstance(name, str) or not name or len(name) > 200 or "{" in name or "}" in name:
                raise ValueError(f"channel name must be 1-200 characters without '{{' or '}}', not {name!r}")
            self.name = name
        else:
            self.name = check_name(f"{kind} name", name)
        self.writer_id = check_name("writer id", writer_id)
        # the target's namespace, as the queue objects compute it
        self.ns = namespace(self.kind, prefix, self.name)
        self.target = self.name if self.kind == "c" else self.ns
        self.state = f"{self.ns}sink:{self.writer_id}"
        self.ttl_ms = max(1, int(positive_seconds("ttl", ttl) * 1000))
        self.stage_ttl_ms = max(1, int(positive_seconds("stage_ttl", stage_ttl) * 1000))
        self.names = Listing(self.ns)     # a queue's or topic's name in the registry (none for a channel)

    def stage(self, rows: Iterable[Any]) -> Op:
        key = f"{self.ns}stage:{self.writer_id}:{uuid.uuid4().hex}"
        payloads = payload_list(rows, "rows")
        cmds = [Cmd(("RPUSH", key, *part)) for part in chunks(payloads)]
        cmds.append(Cmd(("PEXPIRE", key, self.stage_ttl_ms)))
        yield Many(cmds)
        return key, len(payloads)

    def commit(self, batch_id: int, keys: list[str], step: int = STEP) -> Op:
        positive_int("step", step)
        if not isinstance(batch_id, int) or batch_id < 0:
            raise ValueError(f"batch_id must be an int >= 0, not {batch_id!r}")
        for k in keys:
            if not k.startswith(f"{self.ns}stage:"):
                raise ValueError(f"{k!r} is not a staging list of this writer's target")
        if not self.names.listed:
            yield from self.names.listing()
        total = 0
        while True:
            n, done = yield Call("COMMIT_STAGED", self.state,
                                 (self.kind, self.target, self.ttl_ms, self.state, batch_id, step, *keys))
            total += n
            if done:
                return total

    def discard(self, keys: list[str]) -> Op:
        if keys:
            yield Cmd(("DEL", *keys))
        return None

    def last_done(self) -> Op:
        v = yield Cmd(("HGET", self.state, "done"))
        return None if v is None else int(v)


class StagedWriter(SyncHandle):
    """Stage rows from tasks, publish each numbered batch once (module docs).

    ``kind``: ``"topic"``, ``"queue"`` or ``"channel"``; ``name``: the
    target; ``redis``: a URL, client or None (embedded server); ``writer_id``
    names this writer's progress: one per logical writer (say, per streaming
    query), since a second writer with the same id would see the first one's
    batches as done.  ``ttl``: a topic's body TTL (as :class:`Topic`)."""

    def __init__(self, kind: str, name: str, redis: Any = None, *, writer_id: str,
                 prefix: str = DEFAULT_PREFIX, ttl: float = 86400.0, stage_ttl: float = 86400.0) -> None:
        self._ops = _StagedOps(kind, name, prefix, writer_id, ttl, stage_ttl)
        super().__init__(redis)

    def stage(self, rows: Iterable[Any]) -> tuple[str, int]:
        """Rows (bytes, str or numbers) into a new staging list; returns its
        key and how many rows it holds (pass the key to :meth:`commit`)."""
        return self._driver.run(self._ops.stage(rows))

    def commit(self, batch_id: int, keys: list[str], *, step: int = STEP) -> int:
        """Publish batch ``batch_id`` from its staging lists (in task order),
        unless it was published before; returns the rows this call published
        (0 for a replay).  ``step``: rows per script call (each call is
        atomic and records its progress)."""
        return self._driver.run(self._ops.commit(batch_id, list(keys), step))

    def discard(self, keys: list[str]) -> None:
        """Drop staging lists of a batch that will not be committed."""
        self._driver.run(self._ops.discard(list(keys)))

    def last_done(self) -> int | None:
        """The last batch id fully published (None before the first)."""
        return self._driver.run(self._ops.last_done())
