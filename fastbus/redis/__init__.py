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

__all__ = [
    "AsyncBufferedListProducer",
    "AsyncBufferedPublisher",
    "BufferedListProducer",
    "BufferedPublisher",
    "PublishError",
    "PublishTimeout",
    "ENV_BINARY",
    "EmbeddedServer",
    "EmbeddedServerError",
    "ServerNotFoundError",
    "bundled_server_binary",
    "default_server",
    "find_server_binary",
    "resolve_url",
]
