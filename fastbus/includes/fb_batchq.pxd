# Mirrors csrc/fb_batchq.h
from libc.stdint cimport uint32_t

cdef extern from "fb_batchq.h" nogil:
    ctypedef struct fb_batchq:
        size_t batches
        size_t bytes
        size_t count
    void fb_batchq_init(fb_batchq *q)
    void fb_batchq_clear(fb_batchq *q)
    int fb_batchq_push(fb_batchq *q, unsigned char *buf, size_t len, uint32_t count)
    int fb_batchq_push_front(fb_batchq *q, unsigned char *buf, size_t len, uint32_t count)
    int fb_batchq_peek(const fb_batchq *q, unsigned char **buf, size_t *len, uint32_t *count)
    int fb_batchq_pop(fb_batchq *q, unsigned char **buf, size_t *len, uint32_t *count)
