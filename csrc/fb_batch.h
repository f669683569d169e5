/*
 * fb_batch.h - the batch wire format: many (topic, payload) records in one
 * buffer, so a link carries one frame per batch instead of one per message.
 *
 * Version 1 (docs/BATCH_FORMAT.md is the normative description):
 *
 *   offset 0  'F' 'B'            magic
 *          2  version  u8        1
 *          3  flags    u8        bit 0: a CRC32C trailer follows the records
 *          4  count    u32 LE    number of records
 *          8  records: topic_len uvarint, payload_len uvarint, topic, payload
 *        end  [crc32c  u32 LE    of every byte before it, if flag bit 0]
 *
 * Lengths are unsigned LEB128, at most 5 bytes, minimal (no redundant 0x80
 * continuation), at most 2^32 - 1.  The decoder checks every length against
 * what remains before using it, requires exactly `count` records and no
 * trailing bytes, and never reads outside the buffer.  Without the checksum
 * flag a corrupted payload byte cannot be detected (the transports fastbus uses
 * - TCP, IPC - already check integrity); with it, every error burst of up to
 * 32 bits, so every corrupted byte, is rejected.
 */
#ifndef FB_BATCH_H
#define FB_BATCH_H

#include "fb_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FB_BATCH_MAGIC0 0x46 /* 'F' */
#define FB_BATCH_MAGIC1 0x42 /* 'B' */
#define FB_BATCH_VERSION 1
#define FB_BATCH_HEADER 8
#define FB_BATCH_F_CRC32C 0x01
#define FB_BATCH_KNOWN_FLAGS FB_BATCH_F_CRC32C
#define FB_VARINT_MAX 5

/* One decoded record: views into the caller's buffer (no copy). */
typedef struct fb_record {
    const unsigned char *topic;
    const unsigned char *payload;
    uint32_t topic_len;
    uint32_t payload_len;
} fb_record;

/* Limits a network-facing decoder applies; 0 means no limit. */
typedef struct fb_decode_limits {
    uint32_t max_topic;
    uint32_t max_payload;
    uint32_t max_records;
    int require_checksum;
} fb_decode_limits;

/* Check the header only and read its count and flags.  For sizing the record
 * array before fb_batch_decode. */
int fb_batch_header(const void *buf, size_t len, uint32_t *count, uint8_t *flags);

/* Validate the whole batch and, if out is not NULL, fill out[0..count).
 * out_cap must be >= count (FB_EINVAL otherwise).  lim may be NULL.  On
 * success *n = count; on error *n = 0 and out's contents are unspecified. */
int fb_batch_decode(const void *buf, size_t len, const fb_decode_limits *lim,
                    fb_record *out, size_t out_cap, size_t *n);

/* An empty batch (no records; with checksum, its CRC32C trailer) in a new
 * buffer the caller frees with fb_free: *buf and *len.  The outbox never
 * hands over an empty batch; encoders of "no records" use this.
 * FB_OK or FB_ENOMEM (then *buf is NULL). */
int fb_batch_empty(int checksum, unsigned char **buf, size_t *len);

/* Encoded size of one record, and writing one (dst needs that many bytes). */
static inline size_t fb_varint_len(uint32_t v)
{
    return v < (1u << 7) ? 1 : v < (1u << 14) ? 2 : v < (1u << 21) ? 3 : v < (1u << 28) ? 4 : 5;
}
static inline size_t fb_put_varint(unsigned char *p, uint32_t v)
{
    size_t i = 0;
    while (v >= 0x80) { p[i++] = (unsigned char)(v | 0x80); v >>= 7; }
    p[i++] = (unsigned char)v;
    return i;
}

/* CRC32C (Castagnoli), as in iSCSI/ext4: crc = fb_crc32c(0, buf, len).
 * Uses the SSE4.2 instruction when the CPU has it. */
uint32_t fb_crc32c(uint32_t crc, const void *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* FB_BATCH_H */
