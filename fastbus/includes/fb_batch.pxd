# Mirrors csrc/fb_batch.h
from libc.stdint cimport uint8_t, uint32_t

cdef extern from "fb_batch.h" nogil:
    enum:
        FB_BATCH_MAGIC0
        FB_BATCH_MAGIC1
        FB_BATCH_VERSION
        FB_BATCH_HEADER
        FB_BATCH_F_CRC32C
        FB_BATCH_F_HEADERS
        FB_BATCH_F_HEADERS_AGAIN
        FB_BATCH_KNOWN_FLAGS
        FB_HEADERS_AGAIN_LEN
        FB_HEADERS_AGAIN_MAX
        FB_VARINT_MAX

    const char *FB_HEADER_REPLY_TO
    const char *FB_HEADER_STATUS
    const char *FB_HEADER_HOLD
    const char *FB_STATUS_NO_RESPONDERS

    ctypedef struct fb_record:
        const unsigned char *topic
        const unsigned char *payload
        uint32_t topic_len
        uint32_t payload_len
        const unsigned char *headers
        uint32_t headers_len

    ctypedef struct fb_header:
        const unsigned char *key
        const unsigned char *value
        uint32_t key_len
        uint32_t value_len

    ctypedef struct fb_decode_limits:
        uint32_t max_topic
        uint32_t max_payload
        uint32_t max_records
        int require_checksum

    int fb_batch_header(const void *buf, size_t len, uint32_t *count, uint8_t *flags)
    int fb_batch_empty(int checksum, unsigned char **buf, size_t *len)
    int fb_batch_decode(const void *buf, size_t len, const fb_decode_limits *lim,
                        fb_record *out, size_t out_cap, size_t *n)
    int fb_headers_valid(const unsigned char *p, size_t len)
    int fb_headers_next(const unsigned char **p, const unsigned char *end, fb_header *h)
    int fb_record_reply_to(const fb_record *rec, const unsigned char **to, uint32_t *len)
    size_t fb_varint_len(uint32_t v)
    size_t fb_put_varint(unsigned char *p, uint32_t v)
    uint32_t fb_crc32c(uint32_t crc, const void *buf, size_t len)
