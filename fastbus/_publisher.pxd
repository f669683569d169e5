# Publisher: the publish path's state over an Outbox (see _publisher.pyx),
# for other extensions: ``from fastbus._publisher cimport Publisher``.
from libc.stdint cimport uint64_t

from fastbus._core cimport Outbox

from fastbus.includes.fb_batchq cimport fb_batchq
from fastbus.includes.fb_burst cimport fb_burst
from fastbus.includes.fb_view cimport fb_view


cdef class Publisher:
    cdef public Outbox outbox
    cdef fb_view _view              # its own lock; a native reader applies WANTs to it
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
    cdef public object send_now
    cdef public Py_ssize_t max_topic
    cdef public Py_ssize_t max_payload
    cdef public object headers_refused
    cdef fb_batchq _sealed          # under outbox._lock (a native sender takes from it)
    cdef fb_burst _burst            # who sends a batch, and when (a native sender shares it)
    cdef uint64_t _accepted
    cdef uint64_t _refused
    cdef uint64_t _lapsed
    cdef public object renew
    cdef int _publish(self, object channel, object message, object headers) except -1
    cdef int _publish_block(self, object channel, object message, bytes h) except -1
    cdef list _checked(self, messages)
    cdef int _started(self) except -1
    cdef int _check_limits(self, bytes t, bytes p, bytes h) except -1


cdef class ClientBase:
    cdef public Publisher _publisher
