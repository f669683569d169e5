# Batch: an encoded batch (fb_batch.h format) owned without a copy.


cdef class Batch:
    cdef unsigned char *_buf
    cdef size_t _len
    cdef Py_ssize_t _exports


cdef Batch _wrap_batch(unsigned char *buf, size_t n)   # takes buf (malloc'd)
