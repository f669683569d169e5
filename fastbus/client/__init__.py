"""fastbus clients, with the pub/sub API Python users know from redis-py.

    client = fastbus.Client()                 # the broker of `fastbus broker`
    client.publish("news", "hello")           # leaves at once; batched under load
    p = client.pubsub()
    p.subscribe("news")
    p.psubscribe("market.*")                  # Redis glob patterns
    for msg in p.listen():                    # {'type', 'pattern', 'channel', 'data'}
        ...

A client has one ZeroMQ connection for publishing and one per PubSub (so each
PubSub's subscriptions and ordering are its own).  No thread sits between a
user's call and the network: a message published while the client is idle is
sent by the publishing thread, and ``get_message()`` reads the connection in
the calling thread.  Batches form by themselves under load (see
:class:`Client`).  The broker tells each publisher which topics someone
wants, and ``publish`` drops the others before they reach the network
(``publish`` returns 0 then; ``stats()`` counts them).  After a broker
restart or reconnect, the client introduces itself again and resends every
subscription; delivery resumes without user code.

The modules, top down (each imports only those below it): ``aio`` (the
asyncio twins, ``fastbus.aio``) and ``sharding`` (several brokers as one,
``fastbus.sharding``), ``_client``
(Client), ``_pubsub`` (PubSub), ``_options`` (ClientOptions: every setting,
checked once), ``_connections`` (Connections: the owner of a client's
connections), ``_pubsession`` and ``_subsession`` (the publishing and the
subscribing connection), ``_session`` (a connection and the rules for the
threads that share it), ``_keeper`` (the background thread for sessions
nobody drives), ``_engine`` (the native threads), ``_keys`` (channel
names), ``_stats`` (``query_stats``), ``_redis_compat`` (redis-py's
keywords and URLs).
"""

from fastbus.client._client import Client
from fastbus.client._keys import pattern_prefix, to_key
from fastbus.client._options import ClientOptions
from fastbus.client._pubsub import PubSub
from fastbus.client._session import native_stream
from fastbus.client._stats import query_stats
from fastbus.errors import ConnectionClosed, PublishTimeout

__all__ = ["Client", "ClientOptions", "ConnectionClosed", "PubSub", "PublishTimeout", "native_stream", "pattern_prefix", "query_stats", "to_key"]
