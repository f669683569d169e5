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
 * - The slow-consumer policy over the links' queues (fb_links_push,
 *   fb_links_enforce): past `flow_bytes` a link holds publishers back
 *   until it drains to a quarter of that (one FLOW event asked of the
 *   owner however many links start holding); past `max_queue` its oldest
 *   data is dropped and counted exactly, or, when the policy says so or
 *   its control messages alone are over, its session is to be
 *   disconnected (the verdict is returned: the KICK is the owner's to
 *   send, on its socket).
 * - A resumed session's replay (fb_links_replay): what its ring kept past
 *   what the client took goes ahead of its queue, in order and without a
 *   copy; what it did not keep is one exact loss, told by one GAP.
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

/* What the data plane tells its owner (an event's kind). */
enum {
    FB_EVENT_WANT = 1,               /* a WANT reset mark reached the head of the link's queue: build it */
    FB_EVENT_FLOW = 2,               /* links holding publishers back came or went: pause or resume (link 0) */
    FB_EVENT_SLOW = 3,               /* a slow consumer, disconnected (value: why, FB_KICK_* - 1) */
    FB_EVENT_GONE = 4,               /* a send found the peer gone: remove it */
    FB_EVENT_OVERFLOW = 5,           /* a link without a session reads not even its control messages */
    FB_EVENT_DETACHED = 6            /* a resumable session's connection is gone: it lingers */
};

/* fb_links_enforce's verdict. */
enum {
    FB_KEPT = 0,                     /* within the bound (perhaps after dropping data) */
    FB_KICK_SLOW = 1,                /* disconnect the session: its queue is over the bound */
    FB_KICK_CONTROL = 2              /* ... its control messages alone are (it reads nothing) */
};

/* Something the data plane tells its owner: (kind, link, value). */
typedef struct fb_link_event {
    uint32_t kind;
    uint32_t link;
    uint32_t value;
} fb_link_event;

/* Told when a link's blocked mark changes (fb_links_block, _unblock): its
 * owner holds a blocked link's outbox (sent only when full, so what comes
 * meanwhile forms larger batches). */
typedef void (*fb_links_hold_fn)(void *arg, uint32_t link, int held);

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
    /* The slow-consumer policy (fb_links_init's defaults: 64 MiB, no flow
     * hold, drop the oldest data), and its state. */
    size_t max_queue;                /* a queue holds at most this many bytes */
    size_t flow_bytes;               /* past this a link holds publishers back (0: never) */
    uint8_t disconnect;              /* past max_queue a session is disconnected (else its oldest data goes) */
    uint8_t paused;                  /* the owner has paused publishers (it sets this) */
    uint8_t flow_asked;              /* a FLOW event is pending (the owner clears it as it takes events) */
    uint32_t nholding;               /* links with holding set */
    uint64_t dropped_slow;           /* records dropped from queues over max_queue */
    fb_links_hold_fn hold;           /* (NULL: nobody is told) */
    void *hold_arg;
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

/* Mark a link blocked (the hold hook told): 1 if it was not, 0 if it was.  A detached link is marked but not listed (it waits for its
 * client, not for its socket's room). */
int fb_links_block(fb_links *t, uint32_t link);

/* Clear a link's blocked mark (the hold hook told) and take it out of
 * the list: 1 if it was blocked, 0 if not.  The last listed link takes its place. */
int fb_links_unblock(fb_links *t, uint32_t link);

/* A resumable session's connection is gone (not detached yet): nothing
 * more is sent until it resumes; what is routed to it waits in its queue
 * (the policy bounds it; it holds no publisher back any more, a FLOW
 * asked if it did); blocked but not listed (it waits for its client, not
 * for room); one FB_EVENT_DETACHED pending. */
void fb_links_detach(fb_links *t, uint32_t link);

/* Start a link's queue over: its entries, its ring and its unreported
 * loss go, it holds nothing back (a FLOW asked if it did), is neither
 * exempt, asked, overflowed nor detached, no longer blocked, and its
 * pending events go (but FLOW). */
void fb_links_reset(fb_links *t, uint32_t link, const fb_zmq_msg_calls *z);

/* A link nothing more goes to (gone: `kind` FB_EVENT_GONE; or a slow
 * consumer disconnected, FB_EVENT_SLOW): a resumable session that is
 * gone is detached instead (it may come back); any other is reset, marked
 * gone and reported once (`kind`, `value`).  Nothing for a link gone
 * already. */
void fb_links_lose(fb_links *t, uint32_t link, uint32_t kind, uint32_t value, const fb_zmq_msg_calls *z);

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

/* A resumable session's client is back, having taken `taken` of its
 * stream (at most the link's `taken`): what its ring holds past that goes
 * ahead of its queue, in order, as DATA entries [DATA, seq, batch] (the
 * batches move, no copy); what the ring no longer holds past `taken`
 * (trimmed, or kept as a GAP, or an entry there was no memory to queue)
 * is added to the queue's loss, to be told by one GAP before the first
 * entry with records.  The ring is emptied and counts on from `taken`.
 * The records queued again; *lost set to the loss added. */
uint64_t fb_links_replay(fb_links *t, uint32_t link, uint64_t taken, const fb_zmq_msg_calls *z, uint64_t *lost);

/* Ask the owner for a FLOW event (once until it takes its events). */
void fb_links_ask_flow(fb_links *t);

/* Queue a data entry for a link: past flow_bytes (and not exempt, not
 * detached, not holding yet) it starts holding publishers back, a FLOW
 * asked unless they are paused already.  (Blocking it, and the bound,
 * fb_links_enforce, are the caller's next steps.) */
void fb_links_push(fb_links *t, uint32_t link, fb_qentry *e);

/* The link no longer holds publishers back: 1 if it did (the caller
 * decides whether publishers may resume: fb_links_ask_flow). */
int fb_links_release(fb_links *t, uint32_t link);

/* The link no longer holds publishers back, and will not until its queue
 * drains to a quarter of flow_bytes (it took nothing for too long while
 * they waited). */
void fb_links_exempt(fb_links *t, uint32_t link);

/* The queue drained some: at or below a quarter of flow_bytes the link
 * holds nothing back and may be held by again. */
void fb_links_drained(fb_links *t, uint32_t link);

/* The policy on a queue that just grew past nothing or past max_queue:
 * FB_KEPT (within it, its oldest data dropped and counted in lost and
 * dropped_slow if need be, the newest batch kept whatever its size; a link without a session whose control
 * messages alone are over it is reported once, FB_EVENT_OVERFLOW), or a
 * session to disconnect: FB_KICK_SLOW (the policy is "disconnect"),
 * FB_KICK_CONTROL (its control messages alone are over the bound). */
int fb_links_enforce(fb_links *t, uint32_t link, const fb_zmq_msg_calls *z);

#ifdef __cplusplus
}
#endif

#endif
