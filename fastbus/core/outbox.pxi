# Outbox: a batch buffer with a flush policy (csrc/fb_outbox.h).
# Part of fastbus/_core.pyx (included there).

cdef inline uint64_t _now(now_ns) except? 0:
    return fb_now_ns() if now_ns is None else <uint64_t>now_ns


cdef fb_outbox_limits _limits(Py_ssize_t max_messages, Py_ssize_t max_bytes, max_delay,
                              bint checksum) except *:
    """Validated outbox limits (shared by Outbox and Router)."""
    if max_messages < 0 or max_bytes < 0:
        raise ValueError("max_messages and max_bytes must be >= 0 (0: no limit)")
    cdef double delay = 0.0 if max_delay is None else max_delay
    if not (delay >= 0.0) or delay > 1e9:
        raise ValueError(f"max_delay must be seconds >= 0 (0 or None: no limit), not {max_delay!r}")
    cdef fb_outbox_limits lim
    lim.max_messages = <size_t>max_messages
    lim.max_bytes = <size_t>max_bytes
    lim.max_age_ns = <uint64_t>(delay * 1e9)
    if delay > 0 and lim.max_age_ns == 0:
        lim.max_age_ns = 1
    lim.checksum = checksum
    return lim


cdef class Outbox:
    """A batch buffer for one destination, with a flush policy.

    ``append`` encodes a (topic, payload) record (and its headers, if any)
    straight into the pending
    batch and returns True when a flush is due by count (``max_messages``) or
    size (``max_bytes``); ``due()`` also checks the age of the oldest record
    (``max_delay`` seconds).  ``take()`` hands the batch over as a
    :class:`Batch` without copying.  0 (or None for ``max_delay``) disables a
    limit.  Nothing is ever dropped: a record larger than ``max_bytes`` just
    makes the batch due at once.

    Times are ``time.monotonic_ns()`` values; pass ``now_ns`` to use your own
    clock (tests, simulations).
    """

    def __cinit__(self, Py_ssize_t max_messages=1000, Py_ssize_t max_bytes=1 << 20,
                  max_delay=0.005, bint checksum=False, str command=None):
        cdef fb_outbox_limits lim = _limits(max_messages, max_bytes, max_delay, checksum)
        cdef bytes verb
        if command is None:
            fb_outbox_init(&self._o, &lim)
            return
        # RESP mode: each record is the Redis command `command topic payload`
        # and a batch is a pipeline to write as is (see fb_outbox.h).
        verb = command.encode("ascii", "replace")
        if fb_outbox_init_resp(&self._o, &lim, verb) < 0:
            raise ValueError(f"not a Redis command name: {command!r} (letters, digits, '.', '_', '-'; "
                             f"at most {FB_OUTBOX_VERB_MAX} characters)")

    def __dealloc__(self):
        fb_outbox_destroy(&self._o)

    @property
    def header_repeats(self) -> bool:
        """Whether a record whose headers are byte for byte those of the
        record before goes as a repeat (one byte instead of its block:
        docs/BATCH_FORMAT.md, flag bit 2).  Off at first: set it only when
        the reader says it takes them (a fastbus broker's WELCOME does)."""
        return self._o.again != 0

    @header_repeats.setter
    def header_repeats(self, bint on) -> None:
        _lock(&self._lock)              # (a publisher's sender may be appending)
        fb_outbox_set_again(&self._o, on)
        _unlock(&self._lock)

    def append(self, topic, payload, now_ns=None, *, headers=None) -> bool:
        """Add one record (with ``headers``: a mapping of str to str or
        bytes, None for none); True when a flush is due by count or size."""
        cdef bytes t = _as_bytes(topic)
        cdef bytes p = _as_bytes(payload)
        cdef bytes h = _encode_headers(headers)
        cdef uint64_t now = _now(now_ns)
        cdef int rc
        _lock(&self._lock)
        rc = _append(&self._o, t, h, p, now)
        _unlock(&self._lock)
        return _check(rc, "append") == 1

    def extend(self, records, now_ns=None) -> bool:
        """Add many ``(topic, payload)`` or ``(topic, payload, headers)``
        records in one call; True when a flush is due.  On an error the
        records before the bad one are kept."""
        cdef uint64_t now = _now(now_ns)
        cdef bytes t, p, h
        cdef int rc = 0
        cdef bint due = False
        for index, rec in enumerate(records):
            if len(rec) == 3:
                topic, payload, headers = rec
                h = _encode_headers(headers)
            else:
                topic, payload = rec
                h = None
            t = _as_bytes(topic)
            p = _as_bytes(payload)
            _lock(&self._lock)
            rc = _append(&self._o, t, h, p, now)
            _unlock(&self._lock)
            if _check(rc, f"record {index}") == 1:
                due = True
        return due

    def due(self, now_ns=None) -> bool:
        """Is a flush due (by count, size or age)?"""
        cdef uint64_t now = _now(now_ns)
        _lock(&self._lock)
        d = fb_outbox_due(&self._o, now)
        _unlock(&self._lock)
        return d != 0

    def deadline_ns(self):
        """When the age limit makes the batch due (monotonic ns), or None
        (empty, or no age limit).  A flush loop sleeps until then."""
        _lock(&self._lock)
        d = fb_outbox_deadline(&self._o)
        _unlock(&self._lock)
        return None if d == UINT64_MAX else d

    def take(self):
        """Hand the pending batch over (a Batch), or None if empty."""
        cdef unsigned char *buf = NULL
        cdef size_t n = 0
        _lock(&self._lock)
        rc = fb_outbox_take(&self._o, &buf, &n)
        _unlock(&self._lock)
        _check(rc, "take")
        if buf is NULL:
            return None
        return _wrap_batch(buf, n)

    def clear(self) -> None:
        """Drop the pending records."""
        _lock(&self._lock)
        fb_outbox_clear(&self._o)
        _unlock(&self._lock)

    def __len__(self) -> int:
        return fb_outbox_count(&self._o)

    @property
    def nbytes(self) -> int:
        """Encoded size of the pending batch."""
        return fb_outbox_bytes(&self._o)

    @property
    def limits(self) -> dict:
        return {"max_messages": self._o.lim.max_messages, "max_bytes": self._o.lim.max_bytes,
                "max_delay": self._o.lim.max_age_ns / 1e9, "checksum": bool(self._o.lim.checksum)}

    def __repr__(self) -> str:
        return f"<fastbus.Outbox records={len(self)} bytes={self.nbytes}>"
