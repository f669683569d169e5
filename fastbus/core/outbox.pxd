# Outbox's C state (fb_outbox.h).
from fastbus.includes.fb_lock cimport fb_lock
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint64_t

from fastbus.includes.fb_outbox cimport fb_outbox, fb_outbox_append, fb_outbox_append_h


cdef class Outbox:
    cdef fb_outbox _o
    cdef fb_lock _lock


cdef inline int _append(fb_outbox *o, bytes t, bytes h, bytes p, uint64_t now) noexcept:
    """One record into an outbox whose lock the caller holds (h: its header
    block, None for none).  Inline here, so that every extension's append
    (fastbus._core's Outbox and Router, fastbus._publisher) is this one."""
    if h is None:
        return fb_outbox_append(o, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t),
                                PyBytes_AS_STRING(p), PyBytes_GET_SIZE(p), now)
    return fb_outbox_append_h(o, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t), PyBytes_AS_STRING(h),
                              PyBytes_GET_SIZE(h), PyBytes_AS_STRING(p), PyBytes_GET_SIZE(p), now)
