"""fastbus on Redis: every part takes a URL; with none, ``$FASTBUS_REDIS_URL``,
else an embedded Redis-compatible server private to the process
(:mod:`fastbus.redis.server`).  Failures against a server raise the
errors of :mod:`fastbus.redis.errors` (also in :mod:`fastbus.errors`)."""

from typing import TYPE_CHECKING

__all__ = [
    "ENV_BINARY",
    "ENV_URL",
    "FlushTimeout",
    "NotARedisServer",
    "PayloadTooLarge",
    "RedisServerError",
    "ServerOutOfMemory",
    "ServerRefused",
    "ServerTimeout",
    "ServerUnavailable",
    "check_url",
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

# The names above, imported on first use (fastbus._lazy says why).
if TYPE_CHECKING:
    from fastbus.errors import FlushTimeout
    from fastbus.redis.errors import (
        NotARedisServer,
        PayloadTooLarge,
        RedisServerError,
        ServerOutOfMemory,
        ServerRefused,
        ServerTimeout,
        ServerUnavailable,
    )
    from fastbus.redis.publisher import (
        BufferedListProducer,
        BufferedPublisher,
        PublishError,
        PublishTimeout,
    )
    from fastbus.redis.publisher_aio import AsyncBufferedListProducer, AsyncBufferedPublisher
    from fastbus.redis.binary import ENV_BINARY, bundled_server_binary, find_server_binary
    from fastbus.redis.server import (
        ENV_URL,
        EmbeddedServer,
        EmbeddedServerError,
        ServerNotFoundError,
        check_url,
        default_server,
        resolve_url,
    )
    from fastbus.redis.subscriber import Subscriber
else:
    from fastbus._lazy import attach

    __getattr__ = attach(__name__, __file__, globals())
