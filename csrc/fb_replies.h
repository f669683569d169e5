/*
 * fb_replies.h - a client's requests waiting for their replies, matched by
 * id (request/reply, docs/PROTOCOL.md "Requests").
 *
 * A request goes out with the header :reply-to = the client's inbox prefix
 * followed by the request's id in decimal ("_INBOX.<client>.17"); the
 * client subscribes to its whole inbox once (a glob on the prefix), so a
 * request costs no subscription.  Whoever reads the inbox connection hands
 * each received batch to fb_replies_take, one call: every record on the
 * prefix whose id is a waiting request is copied into that request's slot
 * and its waiter is woken; any other record (a second reply, one that came
 * after its request gave up, a channel that is not an id) is counted and
 * dropped.  A reply the broker made itself because nobody subscribed to
 * the request's channel (header :status 503, fb_batch.h) completes the
 * request with FB_REPLY_NO_RESPONDERS.
 *
 * Two kinds of waiter:
 *   - a thread: fb_replies_wait blocks on the request's own condition
 *     variable (no interpreter lock held), until the reply came, the
 *     deadline passed, or it is asked to lead: somebody must read the
 *     inbox connection, and a waiting thread does it while nobody else
 *     does (fb_replies_lead / _unlead: one leader at a time; the leader
 *     that stops hands the role to another waiter);
 *   - an event loop: a request opened with `async` is listed in the done
 *     list when it completes (fb_replies_done) and wake_fd, if set, is
 *     written once until the list is drained.
 *
 * Thread-safe (one mutex).  At most max_pending requests wait at once.
 */
#ifndef FB_REPLIES_H
#define FB_REPLIES_H

#include <stddef.h>
#include <stdint.h>

#include "fb_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_replies fb_replies;

/* A request's state (fb_replies_wait's and fb_replies_close's results). */
enum {
    FB_REPLY_WAITING = 0,
    FB_REPLY_DONE = 1,             /* its reply came */
    FB_REPLY_NO_RESPONDERS = 2,    /* the broker routed it to nobody */
    FB_REPLY_TIMEOUT = 3,          /* fb_replies_wait: the deadline passed first */
    FB_REPLY_LEAD = 4,             /* fb_replies_wait: nobody reads the inbox; the caller now does */
    FB_REPLY_CLOSED = 5,           /* the table was closed (fb_replies_close_all) */
};

/* A reply handed over by fb_replies_close: buf (fb_free) holds the header
 * block (headers_len bytes, fb_batch.h's format) then the payload. */
typedef struct fb_reply {
    unsigned char *buf;
    size_t len;
    uint32_t headers_len;
} fb_reply;

typedef struct fb_replies_stats {
    uint64_t opened, replied, no_responders, timed_out;
    uint64_t unmatched;            /* records on the inbox that matched no waiting request */
} fb_replies_stats;

/* prefix: the inbox channel's prefix (the id follows it).  NULL on no memory. */
fb_replies *fb_replies_new(const void *prefix, size_t prefix_len, uint32_t max_pending);
void fb_replies_free(fb_replies *t);

/* An event loop's descriptor, written (8 bytes, an eventfd's or a pipe's)
 * when an async request completes and the done list was empty; -1: none. */
void fb_replies_set_wake_fd(fb_replies *t, int fd);

/* A new request: *id (its channel is prefix + id).  FB_OK, FB_ENOMEM, or
 * FB_ELIMIT when max_pending wait already. */
int fb_replies_open(fb_replies *t, int async, uint64_t *id);

/* Block until request id completes (FB_REPLY_DONE, _NO_RESPONDERS), the
 * monotonic deadline_ns passes (FB_REPLY_TIMEOUT, first if it has; 0: a look),
 * nobody leads and the caller must (FB_REPLY_LEAD: it now is the leader),
 * or the table closes (FB_REPLY_CLOSED).  FB_ENOTFOUND for an unknown id. */
int fb_replies_wait(fb_replies *t, uint64_t id, uint64_t deadline_ns);

/* The leader stops reading: another thread waiting in fb_replies_wait is
 * asked to lead. */
void fb_replies_unlead(fb_replies *t);

/* on: a native reader takes every batch the inbox gets (fb_reader.h
 * replies), so no waiter is asked to lead; off again (that reader
 * stopped): a waiter is, at once. */
void fb_replies_set_read_elsewhere(fb_replies *t, int on);

/* Request id's state now (FB_REPLY_WAITING, _DONE, _NO_RESPONDERS), or
 * FB_ENOTFOUND. */
int fb_replies_state(fb_replies *t, uint64_t id);

/* Forget request id and take its reply, if it came (*out; buf NULL if
 * none).  Returns its state, or FB_ENOTFOUND. */
int fb_replies_close(fb_replies *t, uint64_t id, fb_reply *out);

/* Match the records of a received batch to the waiting requests: the
 * number that completed one, or a batch error (nothing matched). */
int fb_replies_take(fb_replies *t, const void *batch, size_t len);

/* Async requests completed since the last call, up to cap: their ids. */
size_t fb_replies_done(fb_replies *t, uint64_t *ids, size_t cap);

/* The inbox is gone: every waiter returns FB_REPLY_CLOSED, and every
 * later wait too. */
void fb_replies_close_all(fb_replies *t);

void fb_replies_get_stats(fb_replies *t, fb_replies_stats *out);

#ifdef __cplusplus
}
#endif

#endif
