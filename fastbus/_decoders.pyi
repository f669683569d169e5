"""Type stubs for fastbus._decoders (redis-py message dicts, one call per batch)."""

from collections.abc import Callable
from typing import Any, final

from typing_extensions import Buffer

@final
class Matcher:
    """A PubSub's subscriptions as its decoder reads them (see fastbus/_decoders.pyx)."""
    trie: Any
    entries: dict[int, tuple[Any, ...]]
    classes: dict[bytes, tuple[str, Any] | None]
    def __init__(self, text: bool = False) -> None: ...
    def __call__(self, channel: bytes | str) -> tuple[str, Any] | None: ...

def decode_messages(data: Buffer, classes: dict[bytes, tuple[str, Any] | None],
                    classify: Callable[[bytes], tuple[str, Any] | None],
                    utf8: bool = False,
                    request: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> list[dict[str, Any]]: ...
def decode_matching(data: Buffer, classes: dict[bytes, tuple[str, Any] | None],
                    classify: Callable[[bytes], tuple[str, Any] | None]
                    ) -> list[tuple[bytes, bytes] | tuple[bytes, bytes, dict[str, bytes]]]: ...
def resp_pubsub_decode(data: Buffer, start: int = 0, end: int = -1, as_dicts: bool = True,
                       utf8: bool = False) -> tuple[int, list[Any], list[dict[str, Any]]]: ...

class PubSubBase:
    """The compiled base of fastbus's PubSub (see fastbus/_decoders.pyx)."""
    _dicts: Any
    _control: Any
    _pending: Any
    _handlers: int
    def get_message(self, ignore_subscribe_messages: bool = False,
                    timeout: float | None = 0.0) -> dict[str, Any] | None:
        """The next message, or None if none arrives within ``timeout``
        seconds (0: do not wait; None: wait for ever)."""
