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
 * Flag bit 1 (FB_BATCH_F_HEADERS): every record carries a header block,
 * `topic_len, payload_len, headers_len` uvarints then topic, headers,
 * payload; headers_len 0 is a record without headers.  A header block is
 * pairs `key_len uvarint (>= 1), key, value_len uvarint, value` filling it
 * exactly.  A batch none of whose records has headers never sets the flag,
 * so the header-less format is byte for byte what it was.
 *
 * Flag bit 2 (FB_BATCH_F_HEADERS_AGAIN, only with bit 1): a headers_len of
 * 1, with no header bytes after the topic, stands for the block of the
 * record just before (a stream's messages mostly carry the same headers:
 * a content type, a source).  No block is 1 byte long (the shortest is 3),
 * so the value is free.  The record before must have a block, of at most
 * FB_HEADERS_AGAIN_MAX bytes (a repeat may not make a few bytes on the wire
 * stand for much more).  A decoder hands out the earlier block itself, so
 * every reader of fb_record sees whole blocks; an encoder writes repeats
 * only for a peer that said it reads them (docs/BATCH_FORMAT.md).
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
#define FB_BATCH_F_HEADERS 0x02
#define FB_BATCH_F_HEADERS_AGAIN 0x04
#define FB_BATCH_KNOWN_FLAGS (FB_BATCH_F_CRC32C | FB_BATCH_F_HEADERS | FB_BATCH_F_HEADERS_AGAIN)
#define FB_HEADERS_AGAIN_LEN 1        /* headers_len of a repeat */
#define FB_HEADERS_AGAIN_MAX 4096     /* the longest block a repeat may stand for */
#define FB_VARINT_MAX 5

/* One decoded record: views into the caller's buffer (no copy).  headers
 * is NULL and headers_len 0 for a record without headers; otherwise a
 * header block the decoder checked (fb_headers_next walks it). */
typedef struct fb_record {
    const unsigned char *topic;
    const unsigned char *payload;
    uint32_t topic_len;
    uint32_t payload_len;
    const unsigned char *headers;
    uint32_t headers_len;
} fb_record;

/* Limits a network-facing decoder applies; 0 means no limit. */
typedef struct fb_decode_limits {
    uint32_t max_topic;
    uint32_t max_payload;  /* payload and header block together */
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

/* One header of a block: views into it. */
typedef struct fb_header {
    const unsigned char *key;
    const unsigned char *value;
    uint32_t key_len;
    uint32_t value_len;
} fb_header;

/* 1 if the header block [p, p + len) is well formed (len 0 included),
 * else 0.  fb_batch_decode checks every record's block with it. */
int fb_headers_valid(const unsigned char *p, size_t len);

/* The next header of a block fb_headers_valid accepted: 1 and *h filled,
 * with *p advanced past it; 0 at the block's end. */
int fb_headers_next(const unsigned char **p, const unsigned char *end, fb_header *h);

/* Header names that begin with ':' belong to the protocol (publish refuses
 * them from users; docs/BATCH_FORMAT.md, "Reserved headers"):
 *
 *   :reply-to  a request's reply channel; always the block's first header,
 *              so a router finds it without walking the block;
 *   :status    in a reply the broker makes itself: "503", no responders
 *              (a request that nobody subscribed to);
 *   :groups    between brokers only: the queue groups whose pick for this
 *              record is the receiving broker's (fb_router.h, "Queue groups
 *              across brokers"); the block's first header, or its second
 *              after :reply-to.  Its value: marks, each a varint length and
 *              that many bytes; one that starts with an empty mark (a zero
 *              length) is for those groups only, not for plain subscribers
 *              (a member's share handed over to the others);
 *   :hold      a request to a held queue group (fb_router_group_hold):
 *              after :reply-to, its value the most records the group may
 *              keep with it (decimal, 1 to 10 digits; 0: no count bound).
 *              The broker answers it itself, with a :status of 200 (a
 *              member or subscriber has it), 202 (kept for a member to
 *              come), 507 (not kept: the group keeps as many as the value
 *              says, or the broker's bound is reached) or 503 (nobody
 *              wants it and no group keeps it). */
#define FB_HEADER_REPLY_TO ":reply-to"
#define FB_HEADER_STATUS ":status"
#define FB_HEADER_GROUPS ":groups"
#define FB_HEADER_HOLD ":hold"
#define FB_STATUS_DELIVERED "200"
#define FB_STATUS_KEPT "202"
#define FB_STATUS_NO_RESPONDERS "503"
#define FB_STATUS_FULL "507"

/* A record's reply channel: 1 and *to, *len if its header block starts
 * with :reply-to (a request), else 0. */
int fb_record_reply_to(const fb_record *rec, const unsigned char **to, uint32_t *len);

/* A record's :hold header (the second, after :reply-to): 1, its value in
 * *capacity and the offset in the block just past it in *end; 0 if it has
 * none, or one whose value is not 1 to 10 digits up to 2^32 - 1. */
int fb_record_hold(const fb_record *rec, uint32_t *capacity, uint32_t *end);

/* A record's :groups header, where it may be (first, or after :reply-to):
 * 1, its value in *marks, *len, and the header's own bytes in the block,
 * [*at, *at + *span); else 0. */
int fb_record_groups(const fb_record *rec, const unsigned char **marks, uint32_t *len, uint32_t *at,
                     uint32_t *span);

/* 1 if `mark` is among the marks of a :groups value (one fb_record_groups
 * found: a malformed value matches nothing). */
int fb_groups_has(const unsigned char *marks, uint32_t len, const void *mark, uint32_t mark_len);
/* How many marks a :groups value holds (those before a malformed end; the
 * empty one of "for these groups only" is none). */
uint32_t fb_groups_count(const unsigned char *marks, uint32_t len);
/* 1 if a :groups value is for its groups only (it starts with an empty mark). */
int fb_groups_only(const unsigned char *marks, uint32_t len);

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
