/*
 * fb_outbox.h - a per-destination batch buffer with a flush policy.
 *
 * Records are appended already encoded in the batch format (fb_batch.h), so
 * taking a batch is handing over a buffer: no copy, no second pass.  A batch
 * is due when it holds max_messages records, or max_bytes bytes, or its
 * oldest record is max_age_ns old: the flush loop of a buffered publisher,
 * in C.  Time is passed in by the caller (fb_now_ns() or any monotonic
 * nanosecond clock), which keeps the core clock-free and testable.
 *
 * The struct is public so that a broker can keep outboxes in an array; treat
 * its fields as private.  Not thread-safe.
 */
#ifndef FB_OUTBOX_H
#define FB_OUTBOX_H

#include "fb_common.h"
#include "fb_batch.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_outbox_limits {
    size_t max_messages;   /* due at this many records; 0 = no limit */
    size_t max_bytes;      /* due at this many encoded bytes; 0 = no limit */
    uint64_t max_age_ns;   /* due when the oldest record is this old; 0 = no limit */
    int checksum;          /* append a CRC32C trailer to each batch */
} fb_outbox_limits;

#define FB_OUTBOX_VERB_MAX 15

typedef struct fb_outbox {
    fb_outbox_limits lim;
    /* RESP mode (fb_outbox_init_resp): "*3\r\n$<n>\r\n<VERB>\r\n", the
     * start of every command; resp_len == 0 in batch-format mode. */
    unsigned char resp[FB_OUTBOX_VERB_MAX + 16];
    uint8_t resp_len;
    unsigned char *buf;    /* header + records; NULL when empty */
    size_t len, cap;
    size_t cap_hint;       /* size to allocate for the next batch */
    uint32_t count;
    uint64_t first_ns;     /* append time of the oldest record */
    /* Repeats (FB_BATCH_F_HEADERS_AGAIN): on when the reader takes them;
     * the block of the record appended last, where it lies in buf
     * (last_hl 0: that record had none). */
    int again;
    size_t last_h;
    uint32_t last_hl;
} fb_outbox;

/* lim may be NULL (no limits).  Allocates nothing until the first append. */
void fb_outbox_init(fb_outbox *o, const fb_outbox_limits *lim);

/* An outbox whose records are Redis commands instead: each append writes
 * the RESP array `VERB topic payload` (VERB such as "PUBLISH", "SPUBLISH",
 * "RPUSH"), and a taken batch is a pipeline to write to a Redis connection
 * as is: no header, no checksum (lim->checksum is ignored).  Same flush
 * policy; max_bytes counts the encoded commands.  FB_EINVAL if the verb is
 * empty, longer than FB_OUTBOX_VERB_MAX or holds bytes other than letters,
 * digits, '.', '_' or '-'. */
int fb_outbox_init_resp(fb_outbox *o, const fb_outbox_limits *lim, const char *verb);
void fb_outbox_destroy(fb_outbox *o);

/* Append one record.  Returns 1 if the batch is now due by count or size,
 * 0 if not, FB_ETOOBIG if a length exceeds 2^32 - 1 or the batch already
 * holds 2^32 - 1 records, FB_ENOMEM.  A record is never dropped: one larger
 * than max_bytes makes the batch due at once. */
int fb_outbox_append(fb_outbox *o, const void *topic, size_t tlen,
                     const void *payload, size_t plen, uint64_t now_ns);

/* Append one record with a header block (fb_batch.h's encoding; the
 * caller built or checked it; hlen 0: none, as fb_outbox_append).  The
 * first record with headers makes the pending batch a headers batch
 * (FB_BATCH_F_HEADERS): its records so far are rewritten once with an
 * empty block each, so a batch without headers is never larger for the
 * feature.  With repeats on (fb_outbox_set_again), a block byte for byte
 * the one before is written as a repeat.  A RESP outbox has no place for
 * headers: they are left out (Redis's PUBLISH carries none).  Returns as
 * fb_outbox_append. */
int fb_outbox_append_h(fb_outbox *o, const void *topic, size_t tlen, const void *headers, size_t hlen,
                       const void *payload, size_t plen, uint64_t now_ns);

/* Whether records may repeat the block of the record before instead of
 * carrying it again (fb_batch.h, FB_BATCH_F_HEADERS_AGAIN): only for a
 * reader that said it takes them.  An outbox starts with it off; from
 * the next append on.  A RESP outbox ignores it. */
void fb_outbox_set_again(fb_outbox *o, int on);

/* 1 if a flush is due at time now_ns. */
int fb_outbox_due(const fb_outbox *o, uint64_t now_ns);

/* 1 if the count or size limit is reached (age not considered).  Every
 * append past a limit returns 1; a caller that wakes a sender on it wakes
 * it only when this was 0 before the append (once per batch, not once per
 * record until the sender runs). */
int fb_outbox_full(const fb_outbox *o);

/* When the age limit will make the batch due; UINT64_MAX if empty or no
 * age limit.  A flush loop sleeps until the earliest deadline. */
uint64_t fb_outbox_deadline(const fb_outbox *o);

/* Hand the pending batch over: *buf (free with fb_free) and *len.  Empty
 * outbox: *buf = NULL, *len = 0.  FB_ENOMEM only when the checksum trailer
 * cannot be appended (the batch then stays in the outbox). */
int fb_outbox_take(fb_outbox *o, unsigned char **buf, size_t *len);

/* Put back a batch fb_outbox_take just handed over and its count, because
 * it could not be sent: the outbox holds it again as it was.  Only while
 * nothing was appended since (the caller held the outbox throughout):
 * FB_EINVAL otherwise, and the batch stays the caller's. */
int fb_outbox_untake(fb_outbox *o, unsigned char *buf, size_t len, uint32_t count);

/* Drop the pending batch. */
void fb_outbox_clear(fb_outbox *o);

static inline size_t fb_outbox_count(const fb_outbox *o) { return o->count; }
/* Encoded size of the pending batch (header and trailer included). */
static inline size_t fb_outbox_bytes(const fb_outbox *o)
{
    return o->count ? o->len + (o->lim.checksum && !o->resp_len ? 4 : 0) : 0;
}

#ifdef __cplusplus
}
#endif
#endif /* FB_OUTBOX_H */
