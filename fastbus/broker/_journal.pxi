# The broker's journal (--journal DIR; docs/PROTOCOL.md, "The journal"):
# what a resumable session is owed survives a kill -9 of the broker.
#
# Every batch routed to a resumable session is appended (csrc/fb_journal.h)
# with the session's id and its place in the session's stream (the count
# its client's "taken" counts in), and goes to the session's queue, not
# its socket.  Once a turn of the relay's loop, a group commit takes what
# the router's outboxes still hold, appends each publishing session's
# count of what came from it, and writes it all with one write; only then
# does the queued data go out, and only then does TOOK tell a publisher
# that the broker has its messages.  So nothing a client was told the
# broker took, or was sent, is missing after a restart: the journal is
# read back (read_journal), and each session lingers again with what it
# was owed in its ring (journal_restore; fastbus/broker/journal.py).
#
# Python appends what describes the sessions (opened, subscriptions,
# taken, ended: rare) with journal_append, in the same order: the relay
# and Python run in one thread.
# Part of fastbus/broker/_relay.pyx (included at its end).

cdef enum:
    # Records the relay writes (Python writes the others: journal.py).
    JREC_BATCH = 66              # 'B': sid[16] | end u64 | records u32 | seq[8] | batch
    JREC_RECEIVED = 82           # 'R': sid[16] | received u64
    JB_HEAD = 36


cdef inline void _put_u32(uint8_t *p, uint32_t v) noexcept nogil:
    cdef int i
    for i in range(4):
        p[i] = <uint8_t>(v >> (8 * i))


cdef int _j_batch(Relay r, slot *s, const unsigned char *buf, size_t len, uint32_t count) noexcept nogil:
    """Journal a batch routed to resumable session ``s``: the next of its
    stream (counted as the ring counts it).  0, or -1 (no memory)."""
    cdef uint8_t head[JB_HEAD]
    s.jend += count if count else 1
    memcpy(head, s.jsid, 16)
    _put_u64(head + 16, s.jend)
    _put_u32(head + 24, count if count else 1)
    memcpy(head + 28, s.seq, 8)
    return fb_journal_append2(r._journal, JREC_BATCH, head, JB_HEAD, buf, len)


cdef void _j_mark(Relay r, uint32_t link) noexcept nogil:
    """A counted message came from ``link``: the next commit writes its count."""
    cdef slot *s = &r.slots[link]
    if s.jdirty or not s.jhas or r._njdirty >= r.nslots:
        return
    s.jdirty = 1
    r._jdirty[r._njdirty] = link
    r._njdirty += 1


cdef int _j_commit(Relay r) noexcept nogil:
    """The group commit (see above): 0, or -1 if the write failed (what
    was appended stays, for the next; no TOOK says more meanwhile)."""
    cdef uint8_t rec[24]
    cdef uint32_t i, link
    cdef size_t n
    cdef slot *s
    # What the router still holds for anyone: taken, journaled (for a
    # resumable session) and queued, so the counts below cover all of it.
    while True:
        _lock(&r.router._lock)
        n = fb_router_pending(r.router._r, r._links, LINKS_PER_CALL)
        fb_lock_release(&r.router._lock)
        if n:
            r._send_links(r._links, n, fb_now_ns())
        if n < LINKS_PER_CALL:
            break
    for i in range(r._njdirty):
        s = &r.slots[r._jdirty[i]]
        if s.jdirty and s.jhas:
            memcpy(rec, s.jsid, 16)
            _put_u64(rec + 16, s.received)
            fb_journal_append(r._journal, JREC_RECEIVED, rec, 24)
    if fb_journal_pending(r._journal) == 0:
        return 0
    if fb_journal_commit(r._journal, 0) < 0:
        r.journal_errors += 1
        return -1
    for i in range(r._njdirty):
        link = r._jdirty[i]
        s = &r.slots[link]
        if not s.jdirty:
            continue
        s.jdirty = 0
        s.received_committed = s.received
        if s.session and s.resumable and (s.received - s.received_told >= TOOK_EVERY or
                                          s.received_bytes >= TOOK_BYTES):
            r._tell_took(link, False)
    r._njdirty = 0
    return 0


cdef size_t _j_snapshot(Relay r, size_t budget) noexcept nogil:
    """Append, for every journaled session, its count of what came from it
    and what it is owed (its ring past what its client took, its queue's
    data), each with its place in its stream: everything a restart needs
    of the data, so the segments before can go.  At most ``budget`` bytes
    of batches (a session's oldest go first past it: a restart tells its
    client the loss, GAP).  The batch bytes appended."""
    cdef uint32_t link
    cdef slot *s
    cdef rentry *e
    cdef qentry *q
    cdef uint8_t rec[24]
    cdef uint8_t head[JB_HEAD]
    cdef uint64_t end
    cdef size_t total = 0, nb
    for link in range(r.nslots):
        s = &r.slots[link]
        if not (s.session and s.jhas and s.resumable) or s.gone:
            continue
        memcpy(rec, s.jsid, 16)
        _put_u64(rec + 16, s.received)
        fb_journal_append(r._journal, JREC_RECEIVED, rec, 24)
        e = s.ring.head
        while e is not NULL:
            if e.buf is not NULL and total + e.len <= budget:
                memcpy(head, s.jsid, 16)
                _put_u64(head + 16, e.end)
                _put_u32(head + 24, <uint32_t>e.records)
                memcpy(head + 28, e.seq, 8)
                if fb_journal_append2(r._journal, JREC_BATCH, head, JB_HEAD, e.buf, e.len) == 0:
                    total += e.len
            e = e.next
        # The queue follows what was sent (and the loss it will announce).
        end = s.taken + s.q.lost
        q = s.q.head
        while q is not NULL:
            if q.records and q.nframes == 3:
                end += q.records
                nb = Z.msg_size(&q.frames[2])
                if total + nb <= budget:
                    memcpy(head, s.jsid, 16)
                    _put_u64(head + 16, end)
                    _put_u32(head + 24, <uint32_t>q.records)
                    memcpy(head + 28, Z.msg_data(&q.frames[1]), 8)
                    if fb_journal_append2(r._journal, JREC_BATCH, head, JB_HEAD, Z.msg_data(&q.frames[2]), nb) == 0:
                        total += nb
            q = q.next
    return total


cdef struct _jread:
    void *records                # a Python list (borrowed)
    int failed


cdef int _j_collect(void *arg, uint64_t segment, uint8_t type, const unsigned char *payload,
                    size_t len) noexcept with gil:
    cdef _jread *st = <_jread *>arg
    try:
        (<list>st.records).append((type, PyBytes_FromStringAndSize(<const char *>payload, len)))
    except BaseException:
        st.failed = 1
        return 1
    return 0


def read_journal(str path not None) -> tuple:
    """The records of the journal at ``path``, each segment up to its last
    whole commit: ``([(type, payload bytes), ...], torn bytes)``, torn
    being what a kill -9 (or a full disk) cut off past the last commit.
    OSError if the directory cannot be read."""
    cdef list records = []
    cdef _jread st
    cdef uint64_t torn = 0
    cdef bytes p = path.encode()
    st.records = <void *>records
    st.failed = 0
    if fb_journal_read(p, _j_collect, &st, &torn) < 0:
        err = errno
        raise OSError(err, f"cannot read the journal at {path}: {strerror(err).decode()}")
    if st.failed:
        raise MemoryError("reading the journal")
    return records, torn
