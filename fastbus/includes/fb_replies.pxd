# Mirrors csrc/fb_replies.h
from libc.stdint cimport uint32_t, uint64_t

cdef extern from "fb_replies.h" nogil:
    ctypedef struct fb_replies:
        pass

    enum:
        FB_REPLY_WAITING
        FB_REPLY_DONE
        FB_REPLY_NO_RESPONDERS
        FB_REPLY_TIMEOUT
        FB_REPLY_LEAD
        FB_REPLY_CLOSED

    ctypedef struct fb_reply:
        unsigned char *buf
        size_t len
        uint32_t headers_len

    ctypedef struct fb_replies_stats:
        uint64_t opened
        uint64_t replied
        uint64_t no_responders
        uint64_t timed_out
        uint64_t unmatched

    fb_replies *fb_replies_new(const void *prefix, size_t prefix_len, uint32_t max_pending)
    void fb_replies_free(fb_replies *t)
    void fb_replies_set_wake_fd(fb_replies *t, int fd)
    int fb_replies_open(fb_replies *t, int async_, uint64_t *id)
    int fb_replies_wait(fb_replies *t, uint64_t id, uint64_t deadline_ns)
    void fb_replies_unlead(fb_replies *t)
    void fb_replies_set_read_elsewhere(fb_replies *t, int on)
    int fb_replies_state(fb_replies *t, uint64_t id)
    int fb_replies_close(fb_replies *t, uint64_t id, fb_reply *out)
    int fb_replies_take(fb_replies *t, const void *batch, size_t len)
    size_t fb_replies_done(fb_replies *t, uint64_t *ids, size_t cap)
    void fb_replies_close_all(fb_replies *t)
    void fb_replies_get_stats(fb_replies *t, fb_replies_stats *out)
