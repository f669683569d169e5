# Outbox's C state (fb_outbox.h).
from fastbus.includes.fb_lock cimport fb_lock
from fastbus.includes.fb_outbox cimport fb_outbox


cdef class Outbox:
    cdef fb_outbox _o
    cdef fb_lock _lock
