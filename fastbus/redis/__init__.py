"""fastbus on Redis: every part takes a URL, and with none uses an embedded
Redis-compatible server (:mod:`fastbus.redis.server`)."""

from fastbus.redis.publisher import (
    AsyncBufferedListProducer,
    AsyncBufferedPublisher,
    BufferedListProducer,
    BufferedPublisher,
    PublishError,
    PublishTimeout,
)
from fastbus.redis.server import (
    ENV_BINARY,
    EmbeddedServer,
    EmbeddedServerError,
    ServerNotFoundError,
    bundled_server_binary,
    default_server,
    find_server_binary,
    resolve_url,
)
from fastbus.redis.subscriber import Subscriber

__all__ = [
    "ENV_BINARY",
    "AsyncBufferedListProducer",
    "AsyncBufferedPublisher",
    "BufferedListProducer",
    "BufferedPublisher",
    "EmbeddedServer",
    "EmbeddedServerError",
    "PublishError",
    "PublishTimeout",
    "ServerNotFoundError",
    "Subscriber",
    "bundled_server_binary",
    "default_server",
    "find_server_binary",
    "resolve_url",
]
