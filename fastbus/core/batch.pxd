# Batch: an encoded batch (fb_batch.h format) owned without a copy.
from fastbus.includes.fb_batch cimport fb_decode_limits, fb_record


cdef class Batch:
    cdef unsigned char *_buf
    cdef size_t _len
    cdef Py_ssize_t _exports


cdef Batch _wrap_batch(unsigned char *buf, size_t n)   # takes buf (malloc'd)

# A batch's checked records in a PyMem_Malloc'd array (the caller frees it).
cdef fb_record *_batch_records(Py_buffer *view, const fb_decode_limits *lim, size_t *n) except NULL

# How _records_to_list gives headers: in a third item of the records that
# have them (what fastbus.decode does by default), of every record, of none.
cdef enum:
    HEADERS_MIXED = 0
    HEADERS_ALWAYS = 1
    HEADERS_NEVER = 2

cdef list _records_to_list(const fb_record *recs, size_t n, int headers)
