"""Channel names and patterns as the broker sees them: bytes.

The rule lives in :mod:`fastbus._messages` (one rule for every subscriber
and publisher); these are its names as ``fastbus.client`` exports them."""

from __future__ import annotations

from fastbus._messages import GLOB_SPECIALS, pattern_prefix
from fastbus._messages import to_bytes as to_key

__all__ = ["GLOB_SPECIALS", "pattern_prefix", "to_key"]
