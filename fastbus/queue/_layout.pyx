# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""fastbus.queue's items and topic READ replies decoded in one call: the
queue item layout, written by the Lua scripts (fastbus/queue/lua/lib.lua,
the source of truth; tests/test_queue_layout.py checks the two agree).

An extension of its own: a format of the queues, not of the C core.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

# A work-queue item: version u8 (1), prior deliveries u32, id u64, created
# ms u64, all big-endian, then the payload.  A topic READ value: created ms
# u64 big-endian, then the payload.

cdef enum:
    QUEUE_ITEM_VERSION = 1
    QUEUE_HEADER = 21           # 1 + 4 + 8 + 8
    _QI_PRIOR = 1
    _QI_ID = 5
    _QI_CREATED = 13
    TOPIC_VALUE_HEADER = 8      # the created-ms stamp

QUEUE_ITEM_LAYOUT = {"version": QUEUE_ITEM_VERSION, "header": QUEUE_HEADER, "prior": _QI_PRIOR,
                     "id": _QI_ID, "created": _QI_CREATED, "topic_value_header": TOPIC_VALUE_HEADER}


cdef inline uint32_t _be32(const unsigned char *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t _be64(const unsigned char *p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v = (v << 8) | p[i]
    return v


cdef class QueueMessage:
    """A message as a :mod:`fastbus.queue` consumer gets it (exported there as
    ``Message``).

    ``id``: monotonic per queue (per topic for topic messages); ``payload``:
    the bytes put; ``created_at``: server time of the put, in seconds since
    the epoch; ``deliveries``: 1 on the first delivery, counting redeliveries
    after requeues and crashed consumers (in a message looked at with
    ``peek``: the deliveries so far).  ``ack()``, ``reject()`` and
    ``requeue()`` settle it through the consumer that got it (coroutines for
    an asyncio consumer)."""


    def __init__(self, id, bytes payload not None, double created_at, long deliveries,
                 bytes _key=b"", _consumer=None):
        self.id = id
        self.payload = payload
        self.created_at = created_at
        self.deliveries = deliveries
        self._key = _key
        self._consumer = _consumer

    def ack(self):
        return self._consumer.ack(self)

    def reject(self):
        return self._consumer.reject(self)

    def requeue(self):
        return self._consumer.requeue(self)

    def __repr__(self):
        return (f"Message(id={self.id!r}, payload={self.payload!r}, created_at={self.created_at!r}, "
                f"deliveries={self.deliveries!r})")


def queue_decode(list items not None, consumer=None) -> list:
    """Work-queue items as the scripts return them (21-byte header + payload)
    -> :class:`QueueMessage` objects, in one call.  With a consumer they are
    being delivered (``deliveries`` counts this one); without, looked at.
    ValueError on an item too short or of another version."""
    cdef Py_ssize_t i, n = len(items), size
    cdef const unsigned char *p
    cdef QueueMessage m
    cdef long this = 0 if consumer is None else 1
    cdef list out = PyList_New(n)
    for i in range(n):
        item = items[i]
        if not PyBytes_CheckExact(item):
            raise TypeError(f"queue item {i} is {type(item).__name__}, not bytes")
        size = PyBytes_GET_SIZE(item)
        p = <const unsigned char *>PyBytes_AS_STRING(item)
        if size < QUEUE_HEADER or p[0] != QUEUE_ITEM_VERSION:
            raise ValueError(f"queue item {i} is not a fastbus v1 item ({size} bytes)")
        m = QueueMessage.__new__(QueueMessage)
        m.deliveries = <long>_be32(p + _QI_PRIOR) + this
        m.id = _be64(p + _QI_ID)
        m.created_at = <double>_be64(p + _QI_CREATED) / 1000.0
        m.payload = PyBytes_FromStringAndSize(<const char *>p + QUEUE_HEADER, size - QUEUE_HEADER)
        m._key = PyBytes_FromStringAndSize(<const char *>p + _QI_ID, 8)
        m._consumer = consumer
        Py_INCREF(m)
        PyList_SET_ITEM(out, i, m)
    return out


# -- fastbus.queue topics: READ replies (one value per id: 8-byte created ms
#    big-endian, then the payload; None where the id is not retained)

cdef inline const unsigned char *_topic_value(object v, Py_ssize_t i, Py_ssize_t *size) except NULL:
    if not PyBytes_CheckExact(v):
        raise TypeError(f"topic value {i} is {type(v).__name__}, not bytes")
    size[0] = PyBytes_GET_SIZE(v)
    if size[0] < TOPIC_VALUE_HEADER:
        raise ValueError(f"topic value {i} is {size[0]} bytes, shorter than its {TOPIC_VALUE_HEADER}-byte timestamp")
    return <const unsigned char *>PyBytes_AS_STRING(v)


def topic_decode(list values not None, uint64_t first) -> list:
    """A topic READ reply for ids ``first, first+1, ...`` -> the retained
    ones as :class:`QueueMessage` (``deliveries`` 0), in one call."""
    cdef Py_ssize_t i, n = len(values), size
    cdef const unsigned char *p
    cdef QueueMessage m
    cdef list out = []
    for i in range(n):
        v = values[i]
        if v is None:
            continue
        p = _topic_value(v, i, &size)
        m = QueueMessage.__new__(QueueMessage)
        m.deliveries = 0
        m.id = first + <uint64_t>i
        m.created_at = <double>_be64(p) / 1000.0
        m.payload = PyBytes_FromStringAndSize(<const char *>p + TOPIC_VALUE_HEADER, size - TOPIC_VALUE_HEADER)
        m._key = b""
        m._consumer = None
        out.append(m)
    return out


def topic_columns(list values not None, uint64_t first) -> tuple:
    """A topic READ reply -> Arrow-ready column buffers of the retained ids,
    with no Python object per message: ``(rows, ids, micros, offsets, data)``
    where ``ids`` and ``micros`` (created, microseconds since the epoch) are
    native int64 arrays, ``offsets`` native int32 (rows + 1) and ``data`` the
    payloads end to end: the buffers of an Arrow int64, timestamp[us] and
    binary column."""
    cdef Py_ssize_t i, n = len(values), size, rows = 0, total = 0
    cdef const unsigned char *p
    for i in range(n):
        v = values[i]
        if v is not None:
            p = _topic_value(v, i, &size)
            rows += 1
            total += size - TOPIC_VALUE_HEADER
    if total > 0x7fffffff:
        raise ValueError("more than 2 GiB of payloads in one read: read a smaller range")
    ids = PyBytes_FromStringAndSize(NULL, rows * 8)
    micros = PyBytes_FromStringAndSize(NULL, rows * 8)
    offsets = PyBytes_FromStringAndSize(NULL, (rows + 1) * 4)
    data = PyBytes_FromStringAndSize(NULL, total)
    cdef int64_t *pid = <int64_t *>PyBytes_AS_STRING(ids)
    cdef int64_t *pts = <int64_t *>PyBytes_AS_STRING(micros)
    cdef int32_t *pof = <int32_t *>PyBytes_AS_STRING(offsets)
    cdef char *pd = PyBytes_AS_STRING(data)
    cdef Py_ssize_t r = 0, at = 0
    pof[0] = 0
    for i in range(n):
        v = values[i]
        if v is None:
            continue
        p = _topic_value(v, i, &size)
        if r >= rows or at + size - TOPIC_VALUE_HEADER > total:      # the list changed under us (a finalizer)
            raise RuntimeError("topic values changed while being read")
        pid[r] = <int64_t>(first + <uint64_t>i)
        pts[r] = <int64_t>_be64(p) * 1000
        memcpy(pd + at, p + TOPIC_VALUE_HEADER, size - TOPIC_VALUE_HEADER)
        at += size - TOPIC_VALUE_HEADER
        r += 1
        pof[r] = <int32_t>at
    if r != rows:
        raise RuntimeError("topic values changed while being read")
    return rows, ids, micros, offsets, data
