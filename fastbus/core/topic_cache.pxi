# The decoders' cache of topic bytes objects: inline helpers, included by
# fastbus/_core.pyx (batch.pxi's decode) and fastbus/_decoders.pyx.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcmp

# -- decoded topics ---------------------------------------------------------
#
# A batch repeats its topics: a consumer of 50 channels gets each one
# thousands of times.  Decoding keeps the bytes object last made for a topic
# in a small direct-mapped table and hands the same (immutable) object out
# again: one allocation fewer per record, and a topic whose hash is already
# computed when it is used as a dict key.  Only short topics are kept.

cdef enum:
    _TC_SLOTS = 64
    _TC_MAX_LEN = 64

cdef struct _topic_cache:
    PyObject *slot[_TC_SLOTS]


cdef inline uint32_t _tc_slot(const unsigned char *s, size_t n) noexcept nogil:
    cdef uint64_t h = (<uint64_t>0xcbf29ce484222325ULL) ^ n     # FNV-1a over at most 64 bytes
    cdef size_t i
    for i in range(n):
        h = (h ^ s[i]) * (<uint64_t>0x100000001b3ULL)
    return <uint32_t>((h ^ (h >> 29)) & (_TC_SLOTS - 1))


cdef inline object _tc_get(_topic_cache *c, const char *s, size_t n):
    if n > _TC_MAX_LEN:
        return PyBytes_FromStringAndSize(s, n)
    cdef uint32_t k = _tc_slot(<const unsigned char *>s, n)
    cdef PyObject *o = c.slot[k]
    if o is not NULL and <size_t>PyBytes_GET_SIZE(<object>o) == n and \
            memcmp(PyBytes_AS_STRING(<object>o), s, n) == 0:
        return <object>o
    cdef object b = PyBytes_FromStringAndSize(s, n)
    Py_INCREF(b)
    c.slot[k] = <PyObject *>b
    Py_XDECREF(o)
    return b


cdef inline void _tc_clear(_topic_cache *c) noexcept:
    cdef int i
    for i in range(_TC_SLOTS):
        Py_XDECREF(c.slot[i])
        c.slot[i] = NULL
