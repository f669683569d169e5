# Extension types of fastbus._core, for other Cython extensions:
#
#   from fastbus._core cimport Trie
#   from fastbus.includes.fb_trie cimport fb_trie_match
#   cdef Trie t = Trie()
#   with nogil: fb_trie_match(t._t, ...)      # hold t's lock if threads share t
#
# Each object owns its C struct (_t / _f / _o) and a lock (fb_lock.h) that
# every method takes; code that calls the C API directly on an object other
# threads also use takes it too (fb_lock_wait / fb_lock_release on &obj._lock,
# without holding the GIL while waiting).
from fastbus.includes.fb_lock cimport fb_lock
from libc.stdint cimport uint64_t
from fastbus.includes.fb_trie cimport fb_trie
from fastbus.includes.fb_forwarder cimport fb_forwarder
from fastbus.includes.fb_outbox cimport fb_outbox
from fastbus.includes.fb_batch cimport fb_decode_limits
from fastbus.includes.fb_router cimport fb_router


cdef class Trie:
    cdef fb_trie *_t
    cdef fb_lock _lock


cdef class Forwarder:
    cdef fb_forwarder *_f
    cdef fb_lock _lock


cdef class Batch:
    cdef unsigned char *_buf
    cdef size_t _len
    cdef Py_ssize_t _exports


cdef class Outbox:
    cdef fb_outbox _o
    cdef fb_lock _lock
    cdef uint64_t _accepted
    cdef uint64_t _refused


cdef class Router:
    cdef fb_router *_r
    cdef Trie _trie
    cdef fb_decode_limits _lim
    cdef fb_lock _lock


cdef class Publisher:
    cdef public Outbox outbox
    cdef public object wanted
    cdef public object wake
    cdef public object closed_error
    cdef public bint closed
    cdef public object pending_error
    cdef public str closed_message
    cdef public Py_ssize_t max_buffer_bytes
    cdef public object block_timeout
    cdef public object block_reason
    cdef object _room
    cdef Py_ssize_t _waiting
    cdef object _sealed
    cdef Py_ssize_t _sealed_bytes
    cdef Py_ssize_t _sealed_count
