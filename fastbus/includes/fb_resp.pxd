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

    ctypedef struct fb_resp_reader:
        unsigned char *buf
        size_t len
        size_t cap
        char first_err[256]
        size_t first_err_len

    void fb_resp_reader_init(fb_resp_reader *rd)
    void fb_resp_reader_destroy(fb_resp_reader *rd)
    void fb_resp_reader_reset(fb_resp_reader *rd)
    int fb_resp_pump(int fd, const void *data, size_t len, size_t need, int timeout_ms,
                     fb_resp_reader *rd, fb_resp_tally *t, uint32_t *err_idx, size_t err_cap)

    ctypedef struct fb_resp_elem:
        const unsigned char *ptr
        size_t len
        int is_int

    int fb_resp_flat_array(const void *buf, size_t len, fb_resp_elem *el, size_t max_elems, size_t *consumed)

    unsigned fb_resp_key_slot(const void *key, size_t len)
