# Mirrors csrc/fb_resp.h
from libc.stdint cimport uint32_t, int64_t

cdef extern from "fb_resp.h" nogil:
    enum:
        FB_RESP_MAX_BULK

    ctypedef struct fb_resp_tally:
        size_t replies
        size_t errors
        int64_t int_sum
        size_t consumed
        size_t first_err_off
        size_t first_err_len

    int fb_resp_scan(const void *buf, size_t len, size_t max_replies, fb_resp_tally *t,
                     uint32_t *err_idx, size_t err_cap)
