"""BufferedPublisher and BufferedListProducer on a Redis Cluster, for the
commands that must reach the primary owning a key's hash slot (SPUBLISH,
RPUSH, LPUSH): :class:`ClusterRouter`, one buffered publisher per primary.
``BufferedPublisher(cluster, sharded=True)`` and
``BufferedListProducer(cluster)`` return one.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Self

import redis

from fastbus._core import key_slot
from fastbus._types import ChannelT, EncodableT
from fastbus.errors import FlushTimeout, PublishError
from fastbus.redis.publisher import BufferedListProducer, BufferedPublisher, check_options, deadline_after, flush_part, merged_errors

log = logging.getLogger("fastbus.redis")


class ClusterRouter:
    """BufferedPublisher / BufferedListProducer on a Redis Cluster for
    commands that must reach the primary that owns the key's hash slot
    (SPUBLISH, RPUSH, LPUSH): one buffered publisher per primary, the slot
    computed in C.  Messages of one channel or key keep their order (one
    slot, one primary).  After a MOVED reply the slot map is read again and
    the refused messages are sent to the new owner (their order relative to
    later messages of the same key is then not guaranteed).  Each primary's
    publisher batches by itself as BufferedPublisher does (``max_delay`` an
    optional linger); the options are checked here, before the first one
    is made."""

    def __init__(self, cluster: Any, kind: type, **kwargs: Any) -> None:
        check_options(**kwargs)
        self._rc = cluster
        self._kind = kind
        self._kwargs = kwargs
        self._subs: dict[str, BufferedPublisher] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._table: list[str] = []
        self._refresh(initial=True)

    def _refresh(self, initial: bool = False) -> None:
        nm = self._rc.nodes_manager
        if not initial:
            nm.initialize()
        table = [""] * 16384
        for slot, nodes in nm.slots_cache.items():
            if nodes:
                table[slot] = nodes[0].name
        if "" in table:
            raise redis.ClusterDownError("the cluster does not cover every hash slot")
        self._table = table

    def _sub(self, name: str) -> BufferedPublisher:
        sub = self._subs.get(name)
        if sub is None:
            with self._lock:
                sub = self._subs.get(name)
                if sub is None:
                    node = self._rc.get_node(node_name=name)
                    kw = dict(self._kwargs)
                    if self._kind is BufferedListProducer:
                        kw.pop("sharded", None)
                    sub = self._kind(node.redis_connection.connection_pool, **kw)
                    sub._redirect = self._redirected
                    self._subs[name] = sub
        return sub

    def publish(self, channel: ChannelT, message: EncodableT) -> int:
        """Queue a message for the primary that owns its channel's slot."""
        if self._closed:
            raise PublishError("publisher is closed", [], "closed")
        return self._sub(self._table[key_slot(channel)]).publish(channel, message)

    push = publish

    def has_room(self) -> bool:
        """Would publish() queue without waiting, whichever primary it goes to?"""
        return all(sub.has_room() for sub in list(self._subs.values()))

    def wait_for_room(self) -> None:
        """Block until every primary's publisher has room (see BufferedPublisher)."""
        for sub in list(self._subs.values()):
            sub.wait_for_room()

    def _redirected(self, messages: list) -> None:
        try:
            self._refresh()
        except Exception:
            log.exception("reading the cluster's slot map failed")
        for channel, message in messages:
            self._sub(self._table[key_slot(channel)]).publish(channel, message)

    def flush(self, timeout: float | None = 30.0) -> None:
        """flush() every primary's publisher; again while redirects move
        messages between them; all within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in range(5):
            before = sum(s.stats().get("redirected", 0) for s in list(self._subs.values()))
            errors = []
            for sub in list(self._subs.values()):
                try:
                    sub.flush(None if deadline is None else max(0.0, deadline - time.monotonic()))
                except PublishError as exc:
                    errors.append(exc)
            if errors:
                every = [m for e in errors for m in e.failed]
                raise PublishError(f"{len(every)} messages were not written: {errors[0].reason}", every,
                                   errors[0].reason, errors[0].error)
            if sum(s.stats().get("redirected", 0) for s in list(self._subs.values())) == before:
                return

    def close(self, timeout: float | None = 30.0) -> None:
        """Close every primary's publisher, all within about ``timeout``
        (what is not answered by then is reported, as BufferedPublisher.close)."""
        if self._closed:
            return
        deadline = deadline_after(timeout)
        failed: PublishError | None = None
        other: BaseException | None = None
        timed_out = False
        try:
            self.flush(flush_part(timeout))
        except PublishError as exc:
            failed = exc
        except FlushTimeout:
            timed_out = True                         # each publisher below reports what is left
        except BaseException as exc:
            other = exc
        self._closed = True
        # Every primary's publisher stops at once (the same deadline), not
        # one after the other.
        started: set[str] = set()
        ended: set[str] = set()
        while len(ended) < len(self._subs):          # a redirect may add one meanwhile
            for name, sub in list(self._subs.items()):
                if name not in started:
                    started.add(name)
                    if not sub._closing:
                        sub._stop_begin(deadline, timeout, timed_out)
            for name, sub in list(self._subs.items()):
                if name in started and name not in ended:
                    ended.add(name)
                    try:
                        for wait in sub._stop_end(deadline, timeout, None):
                            sub._thread.join(wait)
                    except PublishError as exc:
                        failed = merged_errors(failed, exc)
                    except FlushTimeout as exc:
                        other = other or exc
        if other is not None:
            raise other
        if failed is not None:
            raise failed

    def stats(self) -> dict[str, int]:
        """The sum of the primaries' counters, and ``nodes``."""
        out: dict[str, int] = {"nodes": len(self._subs)}
        for sub in list(self._subs.values()):
            for k, v in sub.stats().items():
                out[k] = out.get(k, 0) + v
        return out

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
