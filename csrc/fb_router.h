/*
 * fb_router.h - a broker's routing step, one call per received batch.
 *
 * A broker holds one outbox per link (a connected client, a downstream or
 * upstream broker), numbered by dense 32-bit link ids that are also the
 * subscriber ids in the broker's trie.  fb_router_route() takes a received
 * batch, validates it whole (fb_batch_decode), matches all its topics in one
 * fb_trie_match_batch() and appends every record to the outbox of every
 * matching link except the one it came from (split horizon: a message is
 * never sent back over the link it arrived on).  The broker then sends the
 * outboxes that are due (fb_router_due) and sleeps until the earliest
 * deadline (fb_router_deadline).  Per-message work all happens here, in C.
 *
 * Not thread-safe.
 */
#ifndef FB_ROUTER_H
#define FB_ROUTER_H

#include "fb_common.h"
#include "fb_batch.h"
#include "fb_outbox.h"
#include "fb_trie.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_router fb_router;

/* Counters, cumulative since the router was created. */
typedef struct fb_router_stats {
    uint64_t batches;      /* batches routed */
    uint64_t records;      /* records received in them */
    uint64_t bytes;        /* bytes of those batches */
    uint64_t deliveries;   /* record copies appended to outboxes */
    uint64_t unrouted;     /* records that matched no link (other than their source) */
    uint64_t rejected;     /* batches rejected as malformed (nothing routed from them) */
} fb_router_stats;

/* Every outbox gets these limits.  NULL: no limits. */
fb_router *fb_router_new(const fb_outbox_limits *lim);
void fb_router_free(fb_router *r);

/* Give a link an outbox (idempotent).  link < 2^31. */
int fb_router_add_link(fb_router *r, uint32_t link);
/* Drop a link's outbox and whatever it held.  Returns the number of records
 * dropped (0 for an unknown link). */
size_t fb_router_remove_link(fb_router *r, uint32_t link);
int fb_router_has_link(const fb_router *r, uint32_t link);

/* Route one batch received from link `source` (use a value that is not a
 * link, e.g. UINT64_MAX, for none).  Returns the number of records in it, or
 * a batch error (FB_EMALFORMED, ...; nothing is routed from a rejected
 * batch), or FB_ENOMEM.  lim may be NULL. */
int fb_router_route(fb_router *r, fb_trie *t, const void *batch, size_t len,
                    const fb_decode_limits *lim, uint64_t source, uint64_t now_ns);

/* Up to cap links whose outbox is due at now_ns, into links[]; returns how
 * many.  Calling again after taking their batches returns the next ones. */
size_t fb_router_due(fb_router *r, uint64_t now_ns, uint32_t *links, size_t cap);

/* Links whose outbox holds records, due or not (for a flush of everything). */
size_t fb_router_pending(fb_router *r, uint32_t *links, size_t cap);

/* Earliest time an outbox becomes due by age; UINT64_MAX if none. */
uint64_t fb_router_deadline(const fb_router *r);

/* The outbox of a link (NULL if unknown), to take its batch or append to it
 * directly; call fb_router_touch() after appending so the router tracks it. */
fb_outbox *fb_router_outbox(fb_router *r, uint32_t link);
void fb_router_touch(fb_router *r, uint32_t link);

void fb_router_get_stats(const fb_router *r, fb_router_stats *s);

#ifdef __cplusplus
}
#endif
#endif /* FB_ROUTER_H */
