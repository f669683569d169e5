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
    # A held group's backlog (the router's held hook, csrc/fb_router.h),
    # the group by its mark (mlen u8 | mark):
    JREC_KEPT = 75               # 'K': mlen | mark | wall ns u64 | topic_len u32 | headers_len u32 | payload_len u32 | data
    JREC_GONE = 71               # 'G': mlen | mark | n u64: its n oldest left
    JK_HEAD = 1 + 32 + 20


cdef inline uint64_t _wall_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <uint64_t>ts.tv_sec * 1000000000u + <uint64_t>ts.tv_nsec


cdef size_t _jk_head(uint8_t *head, const unsigned char *mark, size_t mlen, uint64_t at_ns, uint64_t mono_now,
                     uint64_t wall_now, const fb_record *rec) noexcept nogil:
    """A K record's head (its length): the time it was kept as wall-clock
    time, so that its expiry runs on across a restart."""
    cdef size_t o = 1 + mlen
    head[0] = <uint8_t>mlen
    memcpy(head + 1, mark, mlen)
    _put_u64(head + o, wall_now - (mono_now - at_ns) if mono_now >= at_ns else wall_now)
    _put_u32(head + o + 8, rec.topic_len)
    _put_u32(head + o + 12, rec.headers_len)
    _put_u32(head + o + 16, rec.payload_len)
    return o + 20


cdef void _j_held(void *arg, const unsigned char *mark, size_t mlen, int what, const fb_record *rec,
                  uint64_t at_ns, size_t n) noexcept nogil:
    """The router's held hook: a backlog's change, appended (written by the
    turn's commit, with the batches a give put in sessions' queues)."""
    cdef _jhook *h = <_jhook *>arg
    cdef uint8_t head[JK_HEAD]
    cdef size_t hl
    if h.journal is NULL or mlen > 32:
        return
    if what == FB_HELD_KEPT:
        hl = _jk_head(head, mark, mlen, at_ns, fb_now_ns(), _wall_ns(), rec)
        if fb_journal_append2(h.journal, JREC_KEPT, head, hl, rec.topic,
                              <size_t>rec.topic_len + rec.headers_len + rec.payload_len) < 0:
            h.errors += 1
    else:
        head[0] = <uint8_t>mlen
        memcpy(head + 1, mark, mlen)
        _put_u64(head + 1 + mlen, n)
        if fb_journal_append(h.journal, JREC_GONE, head, 1 + mlen + 8) < 0:
            h.errors += 1


cdef size_t _j_backlog(Relay r, uint64_t gid, const unsigned char *mark, size_t mlen) noexcept nogil:
    """A snapshot of held group ``gid``'s backlog (K records, oldest
    first); how many were appended."""
    cdef const fb_backlog *bl
    cdef fb_record rec
    cdef uint64_t at, mono = fb_now_ns(), wall = _wall_ns()
    cdef uint8_t head[JK_HEAD]
    cdef size_t i = 0, hl
    bl = r.router.dp_lock_backlog(gid)
    while bl is not NULL and fb_backlog_at(bl, i, &rec, &at):
        hl = _jk_head(head, mark, mlen, at, mono, wall, &rec)
        if fb_journal_append2(r._journal, JREC_KEPT, head, hl, rec.topic,
                              <size_t>rec.topic_len + rec.headers_len + rec.payload_len) < 0:
            r.journal_errors += 1
        i += 1
    r.router.dp_unlock()
    return i


cdef inline void _put_u32(uint8_t *p, uint32_t v) noexcept nogil:
    cdef int i
    for i in range(4):
        p[i] = <uint8_t>(v >> (8 * i))


cdef int _j_batch(Relay r, fb_link *s, const unsigned char *buf, size_t len, uint32_t count) noexcept nogil:
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
    fb_links_mark_dirty(&r.L, link)


cdef int _j_commit(Relay r) noexcept nogil:
    """The group commit (see above): 0, or -1 if the write failed (what
    was appended stays, for the next; no TOOK says more meanwhile)."""
    cdef uint8_t rec[24]
    cdef uint32_t i, link
    cdef size_t n
    cdef fb_link *s
    # What the router still holds for anyone: taken, journaled (for a
    # resumable session) and queued, so the counts below cover all of it.
    while True:
        n = r.router.dp_pending(r._links, LINKS_PER_CALL)
        if n:
            r._send_links(r._links, n, fb_now_ns())
        if n < LINKS_PER_CALL:
            break
    for i in range(r.L.ndirty):
        s = &r.L.at[r.L.dirty[i]]
        if s.jdirty and s.jhas:
            memcpy(rec, s.jsid, 16)
            _put_u64(rec + 16, s.received)
            fb_journal_append(r._journal, JREC_RECEIVED, rec, 24)
    if fb_journal_pending(r._journal) == 0:
        return 0
    if fb_journal_commit(r._journal, 0) < 0:
        r.journal_errors += 1
        return -1
    for i in range(r.L.ndirty):
        link = r.L.dirty[i]
        s = &r.L.at[link]
        if not s.jdirty:
            continue
        s.jdirty = 0
        s.received_committed = s.received
        if s.session and s.resumable and (s.received - s.received_told >= TOOK_EVERY or
                                          s.received_bytes >= TOOK_BYTES):
            r._tell_took(link, False)
    r.L.ndirty = 0
    return 0


cdef size_t _j_snapshot(Relay r, size_t budget) noexcept nogil:
    """Append, for every journaled session, its count of what came from it
    and what it is owed (its ring past what its client took, its queue's
    data), each with its place in its stream: everything a restart needs
    of the data, so the segments before can go.  At most ``budget`` bytes
    of batches (a session's oldest go first past it: a restart tells its
    client the loss, GAP).  The batch bytes appended."""
    cdef uint32_t link
    cdef fb_link *s
    cdef fb_ring_entry *e
    cdef fb_qentry *q
    cdef uint8_t rec[24]
    cdef uint8_t head[JB_HEAD]
    cdef uint64_t end
    cdef size_t total = 0, nb
    for link in range(r.L.n):
        s = &r.L.at[link]
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
