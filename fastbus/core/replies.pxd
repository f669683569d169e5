# Replies' C state (fb_replies.h): a client's requests waiting for replies.
from fastbus.includes.fb_replies cimport fb_replies


cdef class Replies:
    cdef fb_replies *_t
    cdef readonly bytes prefix
