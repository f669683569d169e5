"""asyncio clients, with the API of redis-py's ``redis.asyncio`` pub/sub:
:class:`Client` and :class:`PubSub`, defined in ``fastbus.client.aio``
(the asyncio twins of the client's classes live in its package)."""

from fastbus.client.aio import Client, PubSub

__all__ = ["Client", "PubSub"]
