"""Several brokers as one: :class:`ShardedClient` and
:class:`ShardedPubSub`, defined in ``fastbus.client.sharding``."""

from fastbus.client.sharding import ShardedClient, ShardedPubSub

__all__ = ["ShardedClient", "ShardedPubSub"]
