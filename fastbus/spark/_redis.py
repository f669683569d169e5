"""One redis-py client per URL per process: Spark reuses its Python workers
for many tasks, and a connection per task would cost a handshake each."""

from __future__ import annotations

import os
import threading

import redis

_lock = threading.Lock()
_clients: dict[tuple[int, str], redis.Redis] = {}


def client(url: str) -> redis.Redis:
    key = (os.getpid(), url)                   # a forked worker must not share sockets
    with _lock:
        c = _clients.get(key)
        if c is None:
            c = _clients[key] = redis.Redis.from_url(url)
        return c
