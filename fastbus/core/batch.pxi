# Batches: the Batch object, encode/decode/batch_count and crc32c (csrc/fb_batch.h).
# Part of fastbus/_core.pyx (included there).

# --------------------------------------------------------------------------
# Batches and outboxes

cdef class Batch:
    """An encoded batch handed over by an Outbox, without a copy.

    Supports the buffer protocol (``memoryview(batch)``, ``sock.send(batch)``,
    ``zmq`` with ``copy=False``), ``len()`` in bytes, ``bytes()`` and
    ``records()``.  Create batches with ``Outbox.take()`` or ``encode()``.
    """

    def __cinit__(self):
        self._buf = NULL
        self._len = 0
        self._exports = 0

    def __init__(self):
        if self._buf is NULL:
            raise TypeError("Batch objects come from Outbox.take() or fastbus.encode()")

    def __dealloc__(self):
        fb_free(self._buf)

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, self._buf, <Py_ssize_t>self._len, 1, flags)
        self._exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self._exports -= 1

    def __len__(self) -> int:
        return <Py_ssize_t>self._len

    def __bytes__(self) -> bytes:
        return PyBytes_FromStringAndSize(<const char *>self._buf, <Py_ssize_t>self._len)

    @property
    def count(self) -> int:
        """Number of records."""
        cdef uint32_t n = 0
        _check(fb_batch_header(self._buf, self._len, &n, NULL), "batch")
        return n

    def records(self, *, headers=None) -> list:
        """Decode: ``[(topic, payload), ...]`` as bytes (``headers``:
        ``(topic, payload, headers)``, as :func:`decode`)."""
        return decode(self, headers=headers)

    def __repr__(self) -> str:
        return f"<fastbus.Batch records={self.count} bytes={self._len}>"


cdef Batch _wrap_batch(unsigned char *buf, size_t n):
    cdef Batch b = Batch.__new__(Batch)
    b._buf = buf
    b._len = n
    return b


def encode(records, *, bint checksum=False, bint header_repeats=False) -> Batch:
    """Encode ``(topic, payload)`` or ``(topic, payload, headers)`` records
    into one Batch (no records: a valid empty batch).  ``headers``: a
    mapping of str to str or bytes, or None.  ``header_repeats``: a
    record whose headers are the record before's goes as a repeat
    (``Outbox.header_repeats``; for a reader that takes them)."""
    cdef Outbox ob = Outbox(0, 0, None, checksum)
    fb_outbox_set_again(&ob._o, header_repeats)
    ob.extend(records, 0)
    b = ob.take()
    return _empty_batch(checksum) if b is None else b


cdef Batch _empty_batch(bint checksum):
    # An outbox never hands over an empty batch: the core writes one.
    cdef unsigned char *buf = NULL
    cdef size_t n = 0
    _check(fb_batch_empty(checksum, &buf, &n), "encode")
    return _wrap_batch(buf, n)


def batch_count(data) -> int:
    """Number of records a batch declares (its header only is checked)."""
    cdef Py_buffer view
    cdef uint32_t n = 0
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        _check(fb_batch_header(view.buf, <size_t>view.len, &n, NULL), "batch")
    finally:
        PyBuffer_Release(&view)
    return n


def decode(data, *, uint32_t max_topic=0, uint32_t max_payload=0, uint32_t max_records=0,
           bint require_checksum=False, headers=None) -> list:
    """Validate a whole batch and return its records: ``(topic, payload)``
    for a record without headers, ``(topic, payload, headers)`` for one
    with them (a read-only Headers of str to bytes, shared by records that repeat it).  ``headers=True``: every record as
    a triple (None for no headers); ``headers=False``: every record as a
    pair, its headers left out.

    Every length is checked before use; malformed, truncated, unknown-version
    or checksum-failing input raises BatchError (a ValueError) and returns
    nothing.  The limits (0: none) bound what a network peer may send;
    ``max_payload`` counts a record's payload and headers together."""
    cdef Py_buffer view
    cdef fb_decode_limits lim
    cdef size_t n = 0
    cdef fb_record *recs = NULL
    lim.max_topic = max_topic
    lim.max_payload = max_payload
    lim.max_records = max_records
    lim.require_checksum = require_checksum
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        recs = _batch_records(&view, &lim, &n)
        return _records_to_list(recs, n, HEADERS_MIXED if headers is None else
                                HEADERS_ALWAYS if headers else HEADERS_NEVER)
    finally:
        PyMem_Free(recs)
        PyBuffer_Release(&view)


cdef fb_record *_batch_records(Py_buffer *view, const fb_decode_limits *lim, size_t *n) except NULL:
    """A batch's records (pointing into ``view``), checked, in a
    PyMem_Malloc'd array the caller frees; ``n``: how many.  (decode here,
    and the message decoders of fastbus._decoders.)"""
    cdef uint32_t count = 0
    _check(fb_batch_header(view.buf, <size_t>view.len, &count, NULL), "batch")
    # A count the buffer cannot hold is rejected by the decoder; do not
    # allocate for it first.
    cdef size_t cap = count if count <= (<size_t>view.len) // 2 else 0
    cdef fb_record *recs = <fb_record *>PyMem_Malloc((cap if cap else 1) * sizeof(fb_record))
    if recs is NULL:
        raise MemoryError()
    cdef int rc
    if <size_t>view.len >= NOGIL_MIN_BYTES:
        with nogil:
            rc = fb_batch_decode(view.buf, <size_t>view.len, lim, recs if cap else NULL, cap, n)
    else:
        rc = fb_batch_decode(view.buf, <size_t>view.len, lim, recs if cap else NULL, cap, n)
    if rc < 0:
        PyMem_Free(recs)
        _raise(rc, "batch")
    return recs


cdef list _records_to_list(const fb_record *recs, size_t n, int headers):
    """The records as tuples of bytes: ``(topic, payload)``, with
    ``(topic, payload, headers)`` as ``headers`` says (HEADERS_MIXED: for
    a record that has headers; HEADERS_ALWAYS: for every one, None for
    none; HEADERS_NEVER: never).  Tuples that hold only bytes can never be
    part of a reference cycle: untracking them keeps a decoded batch of
    thousands of records from driving the cyclic GC (a measured 4x on large
    batches held at once).  (A dict of headers holds only str and bytes:
    CPython keeps it untracked, and so may its tuple be.)"""
    cdef list out = PyList_New(n)
    cdef size_t i
    cdef object t, p, h
    cdef tuple tup
    cdef bint triple
    cdef _topic_cache cache
    cdef _header_memo memo
    memset(&cache, 0, sizeof(cache))
    memset(&memo, 0, sizeof(memo))
    try:
        for i in range(n):
            t = _tc_get(&cache, <const char *>recs[i].topic, recs[i].topic_len)
            p = PyBytes_FromStringAndSize(<const char *>recs[i].payload, recs[i].payload_len)
            triple = headers == HEADERS_ALWAYS or (headers == HEADERS_MIXED and recs[i].headers_len != 0)
            tup = PyTuple_New(3 if triple else 2)
            Py_INCREF(t)
            PyTuple_SET_ITEM(tup, 0, t)
            Py_INCREF(p)
            PyTuple_SET_ITEM(tup, 1, p)
            if triple:
                h = _headers_memo(&memo, recs[i].headers, recs[i].headers_len, False, True)
                Py_INCREF(h)
                PyTuple_SET_ITEM(tup, 2, h)
            PyObject_GC_UnTrack(<void *>tup)
            Py_INCREF(tup)
            PyList_SET_ITEM(out, i, tup)
    finally:
        _tc_clear(&cache)
        _hm_clear(&memo)
    return out


def crc32c(data, uint32_t crc=0) -> int:
    """CRC-32C (Castagnoli) of a bytes-like object, continuing from ``crc``."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return fb_crc32c(crc, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)


def shard_hash(data) -> int:
    """32-bit hash of a bytes-like object for consistent hashing
    (fastbus.sharding): CRC-32C through MurmurHash3's finaliser.  CRC alone
    is linear: similar names (``tcp://127.0.0.1:6464#1``, ``...:6465#1``)
    get related values, and a ring of them gave one broker 28% and another
    42% of the channels; the finaliser's multiplies spread them evenly."""
    cdef Py_buffer view
    cdef uint32_t h
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        h = fb_crc32c(0, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    h ^= h >> 16
    h *= 0x85EBCA6BU
    h ^= h >> 13
    h *= 0xC2B2AE35U
    h ^= h >> 16
    return h
