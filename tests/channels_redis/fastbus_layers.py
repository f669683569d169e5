"""Written as the conftest.py of channels_redis's own tests by
tests/test_channels_redis_suite.py: the suite's two layer classes,
``channels_redis.core.RedisChannelLayer`` and
``channels_redis.pubsub.RedisPubSubChannelLayer``, make
:class:`fastbus.channels.ChannelLayer` objects on fastbus brokers instead
of layers on a Redis server.  Nothing else of the suite is changed.

``hosts`` names Redis servers, which mean nothing here: one host (or
none) becomes the broker ``$FASTBUS_CHANNELS_ENDPOINT``; several hosts
(the suite's ``MULTIPLE_TEST_HOSTS``) become the brokers
``$FASTBUS_CHANNELS_ENDPOINTS`` (comma-separated), so those tests run on a
layer sharded over several brokers.  RedisChannelLayer's named channels
are work queues (the layer's default), RedisPubSubChannelLayer's pub/sub
(``named_channels="pubsub"``).  Every other keyword goes to
ChannelLayer as it is, so one it does not take fails that test.
"""

from __future__ import annotations

import os

import channels_redis.core
import channels_redis.pubsub

from fastbus.channels import ChannelLayer

ENDPOINT = os.environ["FASTBUS_CHANNELS_ENDPOINT"]
ENDPOINTS = os.environ["FASTBUS_CHANNELS_ENDPOINTS"].split(",")


def fastbus_layer(hosts=None, **kwargs) -> ChannelLayer:
    """RedisChannelLayer: named channels are work queues (the default)."""
    return ChannelLayer(ENDPOINTS if hosts and len(hosts) > 1 else ENDPOINT, **kwargs)


def fastbus_pubsub_layer(hosts=None, **kwargs) -> ChannelLayer:
    """RedisPubSubChannelLayer: named channels are pub/sub."""
    return fastbus_layer(hosts, named_channels="pubsub", **kwargs)


channels_redis.core.RedisChannelLayer = fastbus_layer
channels_redis.pubsub.RedisPubSubChannelLayer = fastbus_pubsub_layer
