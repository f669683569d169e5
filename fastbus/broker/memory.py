"""Memory the broker gives back to the system (:class:`GiveBack`), and the
allocator setting that makes that possible (``fix_mmap_threshold``).

The trie's arena returns its own segments (docs/CORE.md); what Python and
libzmq freed goes to glibc's heaps, which keep it until ``malloc_trim``.
Nothing here exists where there is no glibc.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("fastbus.broker")

#: What a subscription costs the broker while it is being processed and
#: held (the trie, the forwarders, the Python objects of its SUB and WANT
#: frames) besides its key, which the routing trie holds once; and the
#: fall that is worth a malloc_trim: this much, and at least a quarter of
#: what is still held (a trim walks the heaps, in the broker's thread).
#: Long keys (up to 64 KiB each) are mostly key: a client leaving with
#: 1,000 of them frees 64 MB in 64 KiB blocks, which glibc keeps in its
#: heap until trimmed.
TRIM_BYTES_PER_SUBSCRIPTION = 300
TRIM_AFTER_BYTES = 16 << 20
#: A large fall is trimmed again this many seconds later: what was still in
#: flight (queued in ZeroMQ, not counted here) goes within a second or two,
#: and on a loaded machine later (one trim at 2 s left 19 MB of 32 held in CI).
TRIM_AGAIN_AFTER = (1.0, 3.0, 6.0)

#: Allocations above this size get pages of their own (mmap) and give them
#: back when freed.  glibc's default threshold moves up to the largest block
#: freed so far (up to 32 MiB): once a large WANT diff or SUB frame has come
#: and gone, the next ones land in a thread's heap, where one block still in
#: use can pin megabytes that malloc_trim cannot return (measured: 16 MB of
#: 31 held in one libzmq thread's heap, one run in eight).  It stays above
#: what the data plane allocates a batch at a time (an outbox's buffer grows
#: to its max_bytes, 256 KiB, and past it by up to one record, doubling:
#: 512 KiB): at 256 KiB every full batch was a mmap, a munmap and 64 page
#: faults (1,300 a second with 2-header messages, 6% of the machine's CPU).
MMAP_THRESHOLD = 1 << 20
#: Free memory at the top of a heap that glibc keeps instead of giving it
#: back at once (its default, 128 KiB, while the threshold is pinned, would
#: give back and take again a batch buffer's pages each time); what the
#: broker frees in bulk it gives back itself (GiveBack: malloc_trim).
TRIM_THRESHOLD = 8 << 20
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3    # mallopt's parameter numbers (malloc.h)


def fix_mmap_threshold() -> None:
    """Pin glibc's mmap threshold at MMAP_THRESHOLD, and its trim threshold
    at TRIM_THRESHOLD (nothing where there is no glibc).  Process-wide: a
    broker sets them when it is made."""
    try:
        import ctypes
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, ImportError):
        return
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    fn(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    fn(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def _malloc_trim():
    """glibc's malloc_trim(pad), or None where there is none."""
    try:
        import ctypes
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, ImportError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


class GiveBack:
    """After what the broker holds fell a lot (a client with many
    subscriptions left, a long queue drained), have the C allocator return
    its free pages to the system.  ``check`` runs in maintenance, at most
    once a second, and trims only after such a fall: malloc_trim walks the
    heaps.  Subscriptions are counted as they go (``released``: a client
    can come and go between two runs); queued bytes are sampled."""

    def __init__(self, counters: dict) -> None:
        self.counters = counters
        self._trim = _malloc_trim()
        self._released_mark = 0
        self._released_bytes_mark = 0
        self._queued_peak = 0
        self._again_at: list[float] = []

    def check(self, released: int, released_bytes: int, subscriptions: int, held_bytes: int,
              queued: int) -> None:
        """``released``: subscriptions released so far and ``released_bytes``
        what they were counted (running counts: key + SUB_OVERHEAD each);
        ``subscriptions`` and ``held_bytes`` held, and ``queued`` bytes, now."""
        if self._trim is None:
            return
        if self._again_at and time.monotonic() >= self._again_at[0]:
            # What was still on its way out at the first trim (a large WANT
            # diff in a publisher's ZeroMQ pipe, say) has been freed since.
            self._again_at.pop(0)
            self._trim(0)
            self.counters["memory_trims"] += 1
        freed = ((released - self._released_mark) * TRIM_BYTES_PER_SUBSCRIPTION
                 + released_bytes - self._released_bytes_mark)
        held = subscriptions * TRIM_BYTES_PER_SUBSCRIPTION + held_bytes
        self._queued_peak = max(self._queued_peak, queued)
        fall = freed + self._queued_peak - queued
        if fall >= TRIM_AFTER_BYTES and held + queued <= 4 * fall:
            t0 = time.perf_counter()
            self._trim(0)
            self.counters["memory_trims"] += 1
            log.debug("gave memory back (malloc_trim) in %.1f ms", (time.perf_counter() - t0) * 1e3)
            self._released_mark = released
            self._released_bytes_mark = released_bytes
            self._queued_peak = queued
            now = time.monotonic()
            self._again_at = [now + t for t in TRIM_AGAIN_AFTER]
