# What a resumable session was sent, kept for a resume: the DATA batches
# (and GAPs) that went to its connection, oldest first, each numbered by
# the session's stream count (records delivered or announced lost, up to
# and including it).  A connection that is cut loses what the kernel, or
# a forwarder, held for it; the client says in its resuming HELLO how
# many it took ("taken"), and what follows is sent again
# (docs/PROTOCOL.md, "Resuming a session").  The ring is bounded in bytes
# (the Relay's ``_retain``): what falls off the old end is remembered
# only as the count through it (``trimmed``), so a resume from before it
# is one GAP with the exact number.  The client's TAKEN frees what it
# holds (``_ring_trim``).
# Part of fastbus/broker/_relay.pyx (included there).

cdef enum:
    #: What one kept entry costs beyond its batch, counted against the bound.
    RING_ENTRY_BYTES = 64


cdef struct rentry:
    rentry *next
    unsigned char *buf           # the batch (fb_malloc'd: fb_free), NULL for a GAP
    size_t len
    uint64_t records             # records in the batch, or the GAP's count
    uint64_t end                 # the stream's count through this entry
    uint8_t seq[8]               # the DATA frame's seq it went with


cdef struct rring:
    rentry *head
    rentry *tail
    size_t bytes
    uint64_t trimmed             # the stream's count through the last entry dropped off the old end


cdef void _rentry_free(rentry *e) noexcept nogil:
    if e.buf is not NULL:
        fb_free(e.buf)
    free(e)


cdef void _ring_pop(rring *r) noexcept nogil:
    """Drop the oldest entry, remembering the count through it."""
    cdef rentry *e = r.head
    r.head = e.next
    if r.head is NULL:
        r.tail = NULL
    r.bytes -= e.len + RING_ENTRY_BYTES
    r.trimmed = e.end
    _rentry_free(e)


cdef void _ring_clear(rring *r) noexcept nogil:
    while r.head is not NULL:
        _ring_pop(r)
    r.bytes = 0
    r.trimmed = 0


cdef void _ring_forget(rring *r, uint64_t end) noexcept nogil:
    """Everything through ``end`` is no longer kept (no memory to keep it):
    a resume from before it is one GAP of the exact count."""
    _ring_clear(r)
    r.trimmed = end


cdef void _ring_keep(rring *r, unsigned char *buf, size_t len, uint64_t records, uint64_t end,
                     const uint8_t *seq, size_t limit) noexcept nogil:
    """Keep a batch (``buf``, which becomes the ring's; NULL: a GAP of
    ``records``) that the stream counted through ``end``, then drop the
    oldest entries while the ring holds more than ``limit`` bytes (the
    newest always stays).  Without memory for the entry, the batch goes
    and is remembered as dropped: a resume from before it is told the
    exact loss."""
    cdef rentry *e = <rentry *>malloc(sizeof(rentry))
    if e is NULL:
        if buf is not NULL:
            fb_free(buf)
        _ring_forget(r, end)
        return
    e.next = NULL
    e.buf = buf
    e.len = len if buf is not NULL else 0
    e.records = records
    e.end = end
    memcpy(e.seq, seq, 8)
    if r.tail is NULL:
        r.head = e
    else:
        r.tail.next = e
    r.tail = e
    r.bytes += e.len + RING_ENTRY_BYTES
    while r.bytes > limit and r.head is not e:
        _ring_pop(r)


cdef void _ring_trim(rring *r, uint64_t taken) noexcept nogil:
    """The client took everything through ``taken``: drop what it covers."""
    while r.head is not NULL and r.head.end <= taken:
        _ring_pop(r)
