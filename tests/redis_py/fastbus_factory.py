"""Appended to redis-py's own test conftests by tests/test_redis_py_suite.py:
the suite's client factories make fastbus clients on a fastbus broker
(``$FASTBUS_REDIS_PY_ENDPOINT``) instead of redis-py clients on a Redis
server.  Nothing else of the suite is changed.

Sync: ``_get_client`` (behind the ``r``, ``r2``, ``decoded_r`` and
``r_timeout`` fixtures, and called by tests directly).  Asyncio: the
``create_redis`` fixture (behind ``r``, ``r2``, ``decoded_r``), with the
same two parameters as redis-py's (a single connection or a pool: one
client either way).  The keywords redis-py's factories add for the
server (``protocol``, ``legacy_responses``, ``connection_class``) have no
meaning for a broker and are left out; every other keyword a test passes
goes to fastbus's client as it is, so a keyword fastbus does not take
fails that test.
"""

from __future__ import annotations

import os

import pytest
import pytest_asyncio

import fastbus
import fastbus.aio

ENDPOINT = os.environ["FASTBUS_REDIS_PY_ENDPOINT"]
_SERVER_ONLY = ("protocol", "legacy_responses", "connection_class", "single_connection_client")


def _options(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k not in _SERVER_ONLY}


def _get_client(cls, request, single_connection_client=True, flushdb=True, from_url=None, **kwargs):
    client = fastbus.Client(ENDPOINT, **_options(kwargs))
    if request is not None:
        request.addfinalizer(lambda: client.close(timeout=2))
    return client


@pytest_asyncio.fixture(params=[(True,), (False,)], ids=["single", "pool"])
async def create_redis(request):
    made = []

    async def client_factory(url=None, cls=None, flushdb=True, **kwargs):
        client = fastbus.aio.Client(ENDPOINT, **_options(kwargs))
        made.append(client)
        return client

    yield client_factory
    for client in made:
        await client.aclose()


__all__ = ["_get_client", "create_redis", "pytest"]
