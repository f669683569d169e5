/*
 * fb_backlog.h - what a held queue group keeps while it has no member.
 *
 * A queue group that is held (fb_router_group_hold) does not lose a record
 * that finds no member to take it: the record waits here, a copy of its
 * topic, headers and payload stamped with its arrival time, until a member
 * joins (fb_router_group_join gives it the backlog first, oldest first)
 * or it is older than the group's expiry (fb_backlog_expire).  A FIFO in
 * a ring of owned copies: push at the tail, pop at the head, nothing moved.
 *
 * What bounds it is the caller's: the router refuses a record over the
 * capacity the sender named or over its byte limit for every backlog.
 * Not thread-safe.
 */
#ifndef FB_BACKLOG_H
#define FB_BACKLOG_H

#include "fb_common.h"
#include "fb_batch.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_backlog_item {
    unsigned char *data;       /* topic, then headers, then payload */
    uint32_t topic_len, headers_len, payload_len;
    uint64_t at_ns;            /* when it was kept */
} fb_backlog_item;

typedef struct fb_backlog {
    fb_backlog_item *items;    /* a ring of cap slots */
    size_t head, count, cap;
    size_t bytes;              /* fb_backlog_cost of every item held */
} fb_backlog;

/* What an item of this record costs (its bytes and its slot). */
static inline size_t fb_backlog_cost(const fb_record *rec)
{
    return (size_t)rec->topic_len + rec->headers_len + rec->payload_len + sizeof(fb_backlog_item);
}

void fb_backlog_init(fb_backlog *b);
/* Frees every item and the ring. */
void fb_backlog_destroy(fb_backlog *b);
/* Keep a copy of rec, stamped at_ns.  FB_OK or FB_ENOMEM (nothing kept). */
int fb_backlog_push(fb_backlog *b, const fb_record *rec, uint64_t at_ns);
/* The i-th oldest item as a record (views into the backlog, valid until
 * the next pop or push) and when it was kept: 1, or 0 past the last. */
int fb_backlog_at(const fb_backlog *b, size_t i, fb_record *rec, uint64_t *at_ns);
/* The oldest: 1, or 0 if empty. */
static inline int fb_backlog_peek(const fb_backlog *b, fb_record *rec, uint64_t *at_ns)
{
    return fb_backlog_at(b, 0, rec, at_ns);
}
/* Drop the oldest item (none: nothing). */
void fb_backlog_pop(fb_backlog *b);
/* Drop the items kept before before_ns (the oldest first: the ring is in
 * arrival order); returns how many. */
size_t fb_backlog_expire(fb_backlog *b, uint64_t before_ns);
/* Drop everything; returns how many. */
size_t fb_backlog_clear(fb_backlog *b);

static inline size_t fb_backlog_count(const fb_backlog *b) { return b->count; }

#ifdef __cplusplus
}
#endif
#endif /* FB_BACKLOG_H */
