# Mirrors csrc/fb_outbox.h
from libc.stdint cimport uint8_t, uint32_t, uint64_t

cdef extern from "fb_outbox.h" nogil:
    ctypedef struct fb_outbox_limits:
        size_t max_messages
        size_t max_bytes
        uint64_t max_age_ns
        int checksum

    enum:
        FB_OUTBOX_VERB_MAX

    ctypedef struct fb_outbox:
        fb_outbox_limits lim
        unsigned char resp[FB_OUTBOX_VERB_MAX + 16]
        uint8_t resp_len
        unsigned char *buf
        size_t len
        size_t cap
        size_t cap_hint
        uint32_t count
        uint64_t first_ns
        int again

    void fb_outbox_init(fb_outbox *o, const fb_outbox_limits *lim)
    int fb_outbox_init_resp(fb_outbox *o, const fb_outbox_limits *lim, const char *verb)
    void fb_outbox_destroy(fb_outbox *o)
    int fb_outbox_append(fb_outbox *o, const void *topic, size_t tlen,
                         const void *payload, size_t plen, uint64_t now_ns)
    int fb_outbox_append_h(fb_outbox *o, const void *topic, size_t tlen, const void *headers, size_t hlen,
                           const void *payload, size_t plen, uint64_t now_ns)
    void fb_outbox_set_again(fb_outbox *o, int on)
    int fb_outbox_due(const fb_outbox *o, uint64_t now_ns)
    int fb_outbox_full(const fb_outbox *o)
    uint64_t fb_outbox_deadline(const fb_outbox *o)
    int fb_outbox_take(fb_outbox *o, unsigned char **buf, size_t *len)
    int fb_outbox_untake(fb_outbox *o, unsigned char *buf, size_t len, uint32_t count)
    void fb_outbox_clear(fb_outbox *o)
    size_t fb_outbox_count(const fb_outbox *o)
    size_t fb_outbox_bytes(const fb_outbox *o)
