"""A client's settings, checked once, in one object every part reads."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fastbus import protocol as P
from fastbus.endpoints import check_connect


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """What :class:`fastbus.Client` was given (see its docstring for what
    each does), checked: a bad value raises ValueError here, when the
    client is made, not later on the message path.  ``Client.options``;
    ``Client(options=...)`` makes a client with the same settings."""

    endpoint: str = f"tcp://127.0.0.1:{P.DEFAULT_PORT}"
    name: str = ""
    decode_responses: bool = False
    # publishing
    max_messages: int = 1000
    max_bytes: int = 64 * 1024
    max_delay: float | None = None
    max_buffer_bytes: int = 8 * 1024 * 1024
    block_timeout: float | None = 60.0
    # receiving and subscribing
    max_inbox_bytes: int = 8 * 1024 * 1024
    socket_connect_timeout: float = 5.0
    subscribe_timeout: float | None = 10.0
    # the connection
    ping_interval: float = 1.0
    curve_server_key: str | None = None
    curve_public_key: str | None = None
    curve_secret_key: str | None = field(default=None, repr=False)   # (never printed)

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoint", check_connect(self.endpoint))
        if not self.name:
            object.__setattr__(self, "name", f"client-{os.getpid()}-{id(self):x}")
        if self.max_delay is not None and not 0 <= self.max_delay <= 10:
            raise ValueError(f"max_delay must be None (no linger) or between 0 and 10 seconds, "
                             f"not {self.max_delay!r}")
        if not self.max_delay:
            object.__setattr__(self, "max_delay", None)      # 0 means no linger too
        if not 0 < self.ping_interval <= 60:
            raise ValueError(f"ping_interval must be between 0 and 60 seconds, not {self.ping_interval!r}")
        if self.max_inbox_bytes <= 0:
            raise ValueError(f"max_inbox_bytes must be positive, not {self.max_inbox_bytes!r}")
        if self.max_buffer_bytes <= 0:
            raise ValueError(f"max_buffer_bytes must be positive, not {self.max_buffer_bytes!r}")
        if self.max_messages <= 0 or self.max_bytes <= 0:
            raise ValueError("max_messages and max_bytes must be positive")
        if self.block_timeout is not None and self.block_timeout < 0:
            raise ValueError("block_timeout must be >= 0 seconds, or None to wait for ever")
        if not 0 < self.socket_connect_timeout <= 3600:
            raise ValueError(f"socket_connect_timeout must be between 0 and 3600 seconds, "
                             f"not {self.socket_connect_timeout!r}")
        if self.subscribe_timeout is not None and not 0 < self.subscribe_timeout <= 3600:
            raise ValueError(f"subscribe_timeout must be None (no limit) or between 0 and 3600 seconds, "
                             f"not {self.subscribe_timeout!r}")
        keys = (self.curve_server_key, self.curve_public_key, self.curve_secret_key)
        if any(k is None for k in keys) and any(k is not None for k in keys):
            raise ValueError("CURVE needs curve_server_key, curve_public_key and curve_secret_key together")

    @property
    def curve(self) -> tuple[str, str, str] | None:
        """(server key, public key, secret key), or None without CURVE."""
        if self.curve_secret_key is None:
            return None
        return (self.curve_server_key, self.curve_public_key, self.curve_secret_key)   # type: ignore[return-value]
