# Mirrors csrc/fb_batch.h
from libc.stdint cimport uint8_t, uint32_t

cdef extern from "fb_batch.h" nogil:
    enum:
        FB_BATCH_MAGIC0
        FB_BATCH_MAGIC1
        FB_BATCH_VERSION
        FB_BATCH_HEADER
        FB_BATCH_F_CRC32C
        FB_BATCH_KNOWN_FLAGS
        FB_VARINT_MAX

    ctypedef struct fb_record:
        const unsigned char *topic
        const unsigned char *payload
        uint32_t topic_len
        uint32_t payload_len

    ctypedef struct fb_decode_limits:
        uint32_t max_topic
        uint32_t max_payload
        uint32_t max_records
        int require_checksum

    int fb_batch_header(const void *buf, size_t len, uint32_t *count, uint8_t *flags)
    int fb_batch_empty(int checksum, unsigned char **buf, size_t *len)
    int fb_batch_decode(const void *buf, size_t len, const fb_decode_limits *lim,
                        fb_record *out, size_t out_cap, size_t *n)
    size_t fb_varint_len(uint32_t v)
    size_t fb_put_varint(unsigned char *p, uint32_t v)
    uint32_t fb_crc32c(uint32_t crc, const void *buf, size_t len)
