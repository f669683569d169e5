# Mirrors csrc/fb_ring.h
from libc.stdint cimport uint8_t, uint64_t

cdef extern from "fb_ring.h" nogil:
    enum:
        FB_RING_ENTRY_BYTES

    ctypedef struct fb_ring_entry:
        fb_ring_entry *next
        unsigned char *buf
        size_t len
        uint64_t records
        uint64_t end
        uint8_t seq[8]

    ctypedef struct fb_ring:
        fb_ring_entry *head
        fb_ring_entry *tail
        size_t bytes
        uint64_t trimmed

    void fb_ring_keep(fb_ring *r, unsigned char *buf, size_t len, uint64_t records, uint64_t end,
                      const uint8_t *seq, size_t limit)
    void fb_ring_trim(fb_ring *r, uint64_t taken)
    void fb_ring_forget(fb_ring *r, uint64_t end)
    void fb_ring_clear(fb_ring *r)
    fb_ring_entry *fb_ring_detach(fb_ring *r)
    void fb_ring_entry_free(fb_ring_entry *e)
