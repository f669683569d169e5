"""Type aliases of fastbus's public signatures (for annotations; the same
objects exist at run time).

``ChannelT``: a channel name, a queue name's payload or a key: ``bytes``,
``str`` (sent as UTF-8) or another bytes-like object.  ``EncodableT``: a
message as ``publish`` takes it: those, or a number (sent as its ``repr``,
as redis-py does).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Union

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
elif TYPE_CHECKING:
    from typing_extensions import Buffer
else:                                    # Python 3.11 at run time: the common buffer types
    Buffer = Union[bytes, bytearray, memoryview]

ChannelT = Union[str, Buffer]
EncodableT = Union[str, int, float, Buffer]

__all__ = ["Buffer", "ChannelT", "EncodableT"]
