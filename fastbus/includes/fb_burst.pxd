# Mirrors csrc/fb_burst.h
from libc.stdint cimport uint64_t

cdef extern from "fb_burst.h" nogil:
    ctypedef struct fb_burst:
        uint64_t last_send_ns
        int streak
        int burst_limit
        uint64_t gap_ns

    void fb_burst_init(fb_burst *b, uint64_t gap_ns, int burst_limit)
    void fb_burst_sent(fb_burst *b, int busy, uint64_t now)
    int fb_burst_starts_idle(fb_burst *b, uint64_t now)
    int fb_burst_idle(const fb_burst *b, uint64_t now)
    uint64_t fb_burst_linger_due(const fb_burst *b, uint64_t linger_ns, uint64_t now)
