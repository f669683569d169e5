# A link's send queue in the broker's data plane: the messages its socket
# would not take yet (its ZeroMQ pipe is full), in order, each counted in
# bytes, and the records dropped from it not yet reported (GAP).  The
# policy that bounds it (slow consumers, flow control, control messages
# that collapse) is the Relay's (_relay.pyx) and is described in
# fastbus/broker/sending.py; here are the entries and the operations on one
# queue, which touch no socket.
# Part of fastbus/broker/_relay.pyx (included there).

cdef enum:
    Q_FRAMES = 0                 # frames to send as they are: data (records > 0) or a control message
    Q_WANT_MARK = 1              # a WANT reset, built by Python when the mark reaches the head
    Q_FLOW_MARK = 2              # FLOW with the state at the time it goes
    MARK_WANT = 1                # linkq.marks: it holds a WANT mark ...
    MARK_FLOW = 2                # ... a FLOW mark
    #: What one queued message costs beyond its frames (the entry and its
    #: ZeroMQ messages), counted in the queue's bytes so that a flood of
    #: small control messages is bounded by max_queue_bytes as data is.
    QUEUE_ENTRY_BYTES = 256


cdef struct qentry:
    qentry *next
    uint64_t records             # data records (0: a control message or a mark)
    size_t size                  # what it counts against the queue's limit
    uint32_t done                # records already sent (the XPUB link sends a message per record)
    uint8_t kind
    uint8_t cmd                  # a control message's command byte (WANT and FLOW collapse)
    uint8_t nframes
    fbz_msg frames[1]            # nframes of them (allocated so)


cdef struct linkq:
    qentry *head
    qentry *tail
    size_t bytes
    uint64_t lost                # data records dropped, not yet reported
    uint8_t marks                # MARK_WANT | MARK_FLOW: the marks it holds


cdef qentry *_qentry_new(int nframes) noexcept nogil:
    """An entry for nframes messages (initialised empty), or NULL."""
    cdef size_t n = sizeof(qentry) + (<size_t>(nframes - 1 if nframes > 1 else 0)) * sizeof(fbz_msg)
    cdef qentry *e = <qentry *>calloc(1, n)
    cdef int i
    if e is NULL:
        return NULL
    e.nframes = <uint8_t>nframes
    for i in range(nframes):
        Z.msg_init(&e.frames[i])
    e.size = QUEUE_ENTRY_BYTES
    return e


cdef void _qentry_free(qentry *e) noexcept nogil:
    """Close an entry's messages (those not sent) and free it."""
    cdef int i
    for i in range(e.nframes):
        Z.msg_close(&e.frames[i])
    free(e)


cdef int _qentry_frame(qentry *e, int i, const void *data, size_t n) noexcept nogil:
    """Frame i a copy of data; 0, or -1 for want of memory."""
    Z.msg_close(&e.frames[i])
    if Z.msg_init_size(&e.frames[i], n) < 0:
        Z.msg_init(&e.frames[i])
        return -1
    if n:
        memcpy(Z.msg_data(&e.frames[i]), data, n)
    e.size += n
    return 0


cdef void _qentry_mark(qentry *e, uint8_t kind) noexcept nogil:
    """Make an entry a mark (its frames go)."""
    cdef int i
    for i in range(e.nframes):
        Z.msg_close(&e.frames[i])
    e.nframes = 0
    e.kind = kind
    e.records = 0
    e.size = QUEUE_ENTRY_BYTES


cdef void _q_push(linkq *q, qentry *e) noexcept nogil:
    e.next = NULL
    if q.tail is NULL:
        q.head = e
    else:
        q.tail.next = e
    q.tail = e
    q.bytes += e.size


cdef void _q_pop(linkq *q) noexcept nogil:
    """Free the head entry."""
    cdef qentry *e = q.head
    q.head = e.next
    if q.head is NULL:
        q.tail = NULL
    q.bytes -= e.size
    _qentry_free(e)


cdef void _q_clear(linkq *q) noexcept nogil:
    while q.head is not NULL:
        _q_pop(q)
    q.bytes = 0
    q.lost = 0
    q.marks = 0


cdef uint64_t _q_drop_data(linkq *q, size_t limit) noexcept nogil:
    """Drop the oldest data entries until the queue holds at most limit
    bytes (control messages stay: they cannot be dropped without breaking
    the protocol); the records dropped, added to ``lost``."""
    cdef qentry *e = q.head
    cdef qentry *prev = NULL
    cdef qentry *nxt
    cdef uint64_t dropped = 0
    while e is not NULL and q.bytes > limit:
        nxt = e.next
        if e.records and not e.done:
            if prev is NULL:
                q.head = nxt
            else:
                prev.next = nxt
            if q.tail is e:
                q.tail = prev
            q.bytes -= e.size
            dropped += e.records
            _qentry_free(e)
        else:
            prev = e
        e = nxt
    q.lost += dropped
    return dropped


cdef bint _q_collapse(linkq *q, uint8_t cmd, uint8_t mark, uint8_t kind) noexcept nogil:
    """A control message of command ``cmd`` that a later one of its kind
    makes moot is to be queued: make sure the queue holds one ``mark``
    for it, where the first such message was queued, and nothing else of
    its command.  False only for want of memory (then nothing changed)."""
    cdef qentry *e
    cdef qentry *prev = NULL
    cdef qentry *nxt
    cdef bint placed = False
    if q.marks & mark:
        return True
    e = q.head
    while e is not NULL:
        nxt = e.next
        if e.kind == Q_FRAMES and not e.records and e.cmd == cmd:
            if not placed:
                q.bytes -= e.size
                _qentry_mark(e, kind)
                q.bytes += e.size
                placed = True
                prev = e
            else:
                if prev is NULL:
                    q.head = nxt
                else:
                    prev.next = nxt
                if q.tail is e:
                    q.tail = prev
                q.bytes -= e.size
                _qentry_free(e)
        else:
            prev = e
        e = nxt
    if not placed:
        e = _qentry_new(0)
        if e is NULL:
            return False
        e.kind = kind
        _q_push(q, e)
    q.marks |= mark
    return True
