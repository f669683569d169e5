# Mirrors csrc/fb_backlog.h
from libc.stdint cimport uint64_t
from fastbus.includes.fb_batch cimport fb_record

cdef extern from "fb_backlog.h" nogil:
    ctypedef struct fb_backlog:
        pass

    int fb_backlog_at(const fb_backlog *b, size_t i, fb_record *rec, uint64_t *at_ns)
    size_t fb_backlog_count(const fb_backlog *b)
