/*
 * fb_links.h - the broker data plane's table of links: each link's state
 * (its session, its send queue, its books), found by number or by the
 * routing id of its connection, and the relay's lists over them (the
 * links it retries, the links the journal's next commit writes, the
 * events Python has not taken yet).
 *
 * A link is a number the broker gives each peer (a session, the upstream
 * broker, the XPUB socket); its state lives here and only here, so the
 * relay (fastbus/broker/_relay.pyx) reads and writes it without a copy
 * and Python reads it through the relay, never mirrors it.  Three things
 * here are easy to get wrong and are tested alone (tests/test_links.c,
 * under ASan/UBSan):
 *
 * - The index by routing id is open addressing with tombstones, kept at
 *   most half full (rebuilt without tombstones when it would pass that),
 *   so a lookup always ends at an empty cell.  A routing id names one
 *   link: naming another with it takes it from the first (its peer is
 *   gone; libzmq and the Listener do not reuse ids while a peer lives).
 * - Growing the table grows the lists with it, to the room they can ever
 *   need (a link blocked once, dirty once, and at most three events a
 *   link pending plus one FLOW), so adding to them on the data path never
 *   allocates and never fails.
 * - Events are kept in order; forgetting a link's (its queue was reset)
 *   keeps everyone else's, and the one kind the caller names.
 *
 * Not thread-safe: the data plane's thread.
 */
#ifndef FB_LINKS_H
#define FB_LINKS_H

#include <stddef.h>
#include <stdint.h>

#include "fb_linkq.h"
#include "fb_ring.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FB_LINK_IDENT_MAX 255        /* ZeroMQ routing ids are 1..255 bytes */
#define FB_LINK_NONE UINT32_MAX      /* "no such link" (fb_links_find) */
#define FB_LINKS_MAX (1u << 26)      /* link numbers are below this */

typedef struct fb_link {
    uint8_t session;                 /* a session on the ROUTER socket: the relay sends its batches */
    uint8_t acks;                    /* it said "ack" in HELLO: it filters under a lease, asked for by lease pings */
    uint8_t gone;                    /* disconnected or unreachable: nothing more goes to it */
    uint8_t blocked;                 /* it has a queue or an unreported loss (fb_links_block) */
    uint8_t holding;                 /* its queue is over the flow bound: publishers are asked to pause for it */
    uint8_t exempt;                  /* held publishers back too long: no longer does */
    uint8_t asked;                   /* its owner was asked for the WANT reset its queue's mark stands for */
    uint8_t overflowed;              /* reported: not even its control messages are read (not a session) */
    uint8_t resumable;               /* its HELLO named a session to resume: a lost connection detaches it */
    uint8_t detached;                /* ... and it was lost: what is routed to it waits in its queue */
    uint8_t idlen;                   /* its routing id (0: none, not in the index) */
    uint8_t ident[FB_LINK_IDENT_MAX];
    uint8_t seq[8];                  /* the DATA frame's seq, little-endian */
    /* Its traffic, per batch (never per message), for any kind of link:
     * the broker's one set of books. */
    uint64_t batches_in, messages_in, bytes_in, batches_out, messages_out, bytes_out;
    uint64_t lease_end_ns;           /* the latest end of a lease granted it (fb_now_ns's clock) */
    uint64_t last_sent_ns;           /* when a message last went to its socket */
    fb_linkq q;                      /* what waits for its socket */
    /* A resumable session's stream: records sent to it as DATA or
     * announced lost by GAP, counted as its client counts what it takes,
     * and what was sent, kept for a resume. */
    uint64_t taken;
    fb_ring ring;
    /* What it sent that its client keeps until told (TOOK): how many
     * came, how many TOOK last said, and their bytes since. */
    uint64_t received, received_told;
    uint64_t received_bytes;
    /* With a journal: the session's id there, its stream count through
     * the last batch journaled for it, and how many of what it sent the
     * last commit covers. */
    uint8_t jhas;
    uint8_t jdirty;                  /* in the dirty list (the next commit writes its count) */
    uint8_t jsid[16];
    uint64_t jend;
    uint64_t received_committed;
} fb_link;

/* Something the data plane tells its owner: (kind, link, value), kinds
 * and values the owner's. */
typedef struct fb_link_event {
    uint32_t kind;
    uint32_t link;
    uint32_t value;
} fb_link_event;

typedef struct fb_links {
    fb_link *at;                     /* links 0 .. n-1 (zeroed until used) */
    uint32_t n;
    uint32_t *index;                 /* by routing id: link + 1, 0 empty, FB_LINK_NONE a tombstone */
    uint32_t icap, iused;            /* its cells (a power of two), and those not empty */
    uint32_t *blocked;               /* links with blocked set and not detached, in no order */
    uint32_t nblocked;
    uint32_t *dirty;                 /* links with jdirty set */
    uint32_t ndirty;
    fb_link_event *events;           /* oldest first */
    uint32_t nevents;
} fb_links;

/* An empty table with room for 64 links: 0, or -1 (ENOMEM). */
int fb_links_init(fb_links *t);

/* Free the table: each link's queue (its messages closed through `z`)
 * and ring, and the table's own memory.  `t` may be one that failed
 * init. */
void fb_links_free(fb_links *t, const fb_zmq_msg_calls *z);

/* Room for link number `link` (new links zeroed), the lists grown with
 * it: 0, or -1 with errno ENOMEM, or EINVAL for a link at or past
 * FB_LINKS_MAX (the table is unchanged). */
int fb_links_reserve(fb_links *t, uint32_t link);

/* The link a routing id names, or FB_LINK_NONE. */
uint32_t fb_links_find(const fb_links *t, const uint8_t *ident, size_t n);

/* Give link `link` (reserved, and named by no routing id now) the routing
 * id `ident`; a link that had it loses it and its session flag.  0, or -1
 * with errno EINVAL (a length outside 1..255, a link not reserved) or
 * ENOMEM (the index could not grow; nothing changed). */
int fb_links_name(fb_links *t, uint32_t link, const uint8_t *ident, size_t n);

/* Take link `link`'s routing id out of the index (it keeps the bytes,
 * for the reply it may still be sent; a link not in it: no-op). */
void fb_links_unname(fb_links *t, uint32_t link);

/* Mark a link blocked: 1 if it was not (the caller holds its outbox), 0
 * if it was.  A detached link is marked but not listed (it waits for its
 * client, not for its socket's room). */
int fb_links_block(fb_links *t, uint32_t link);

/* Clear a link's blocked mark and take it out of the list: 1 if it was
 * blocked, 0 if not.  The last listed link takes its place. */
int fb_links_unblock(fb_links *t, uint32_t link);

/* Add to the dirty list (a link with a journal id, not in it yet). */
void fb_links_mark_dirty(fb_links *t, uint32_t link);

/* Append an event.  Room is the caller's rule: at most three a link
 * pending and one of link 0's (see the top). */
void fb_links_event(fb_links *t, uint32_t kind, uint32_t link, uint32_t value);

/* Whether an event of `kind` for `link` is pending. */
int fb_links_has_event(const fb_links *t, uint32_t kind, uint32_t link);

/* Forget the pending events of `link`, but those of kind `keep`; the
 * others stay, in order. */
void fb_links_forget_events(fb_links *t, uint32_t link, uint32_t keep);

#ifdef __cplusplus
}
#endif

#endif
