/*
 * fb_router.h - a broker's routing step, one call per received batch.
 *
 * A broker holds one outbox per link (a connected client, a downstream or
 * upstream broker), numbered by dense 32-bit link ids that are also the
 * subscriber ids in the broker's trie.  fb_router_route() takes a received
 * batch, validates it whole (fb_batch_decode), matches all its topics in one
 * fb_trie_match_batch() and appends every record to the outbox of every
 * matching link except the one it came from (split horizon: a message is
 * never sent back over the link it arrived on).  Per-message work all
 * happens here, in C.
 *
 * When a batch leaves: batches form by themselves.  A broker reads what its
 * sockets hold (one "turn"), routing each batch as it comes, then sends
 * every outbox that is due (fb_router_due) and takes its batch with
 * fb_router_take.  At a low rate a message therefore leaves in the turn it
 * arrived; under load a turn reads many batches and each link gets one
 * batch per turn.  Two things bound an outbox in between:
 *
 *   - full: an outbox that reaches max_messages or max_bytes is due at
 *     once; fb_router_full lists the links that a route call filled, so the
 *     caller can send them before reading on (a flood never makes an
 *     outbox grow past its limits);
 *   - linger (optional, lim->max_age_ns, 0 = none): with a linger L, a
 *     link's outbox is due if it is full, or if nothing was taken from it
 *     in the last L ns (an idle link sends at once); otherwise it becomes
 *     due L after that link's previous batch was taken.  So under load each
 *     link gets at most one batch per L (larger batches), and a lone
 *     message still leaves at once.  With L = 0 every outbox that holds
 *     records is due.  fb_router_deadline gives the earliest such time, to
 *     sleep until.
 *
 * A link whose connection cannot take more (its send queue is blocked) can
 * be held (fb_router_hold): its outbox is then due only when full, so what
 * arrives meanwhile forms the next batch, sent when the link is released.
 *
 * The time of a link's last batch is kept here, not in the outbox:
 * take batches with fb_router_take (fb_outbox_take on fb_router_outbox()
 * works too, but does not record the time: the link then counts as idle).
 * Time is passed in by the caller (any monotonic nanosecond clock).
 *
 * Not thread-safe.
 */
#ifndef FB_ROUTER_H
#define FB_ROUTER_H

#include "fb_common.h"
#include "fb_backlog.h"
#include "fb_batch.h"
#include "fb_glob.h"
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
    uint64_t oversize;     /* records over the decode limits' max_topic/max_payload, not routed */
    uint64_t no_responders; /* requests that reached nobody, answered so (fb_router_set_notify) */
    uint64_t group_orphaned; /* a broker gave us records for a queue group with no member here now
                              * (its last left while they were on their way): one per group */
    uint64_t held_kept;    /* records a held group kept for want of a member */
    uint64_t held_given;   /* ... and gave to a member since (fb_router_group_give) */
    uint64_t held_full;    /* records a held group could not keep (the sender's capacity, the byte bound) */
    uint64_t held_dropped; /* kept records dropped: expired, or their group removed */
} fb_router_stats;

/* Every outbox gets lim's max_messages, max_bytes and checksum; lim's
 * max_age_ns is the router's linger (above), not an age limit of the
 * outboxes.  NULL: no limits, no linger. */
fb_router *fb_router_new(const fb_outbox_limits *lim);
void fb_router_free(fb_router *r);

/* Give a link an outbox (idempotent).  link < 2^31.  A new link is idle
 * (its first batch is due at once) and not held. */
int fb_router_add_link(fb_router *r, uint32_t link);
/* Drop a link's outbox and whatever it held.  Returns the number of records
 * dropped (0 for an unknown link). */
size_t fb_router_remove_link(fb_router *r, uint32_t link);
int fb_router_has_link(const fb_router *r, uint32_t link);

/* Route one batch received from link `source` (use a value that is not a
 * link, e.g. UINT64_MAX, for none).  Returns the number of records in it, or
 * a batch error (FB_EMALFORMED, ...; nothing is routed from a rejected
 * batch), or FB_ENOMEM.  lim may be NULL.
 *
 * lim's max_topic and max_payload bound single records: a record over them
 * is not routed, and counted (stats.oversize), while the rest of its batch
 * is (one oversized message must not take its neighbours with it; a sender
 * that wants to know compares stats.oversize before and after).  A batch
 * that is malformed, or over lim's max_records, is rejected whole. */
int fb_router_route(fb_router *r, fb_trie *t, const void *batch, size_t len,
                    const fb_decode_limits *lim, uint64_t source, uint64_t now_ns);

/* Up to cap links whose outbox is full (max_messages or max_bytes) and was
 * appended to since the last call, into links[], each once; returns how
 * many (the rest stay for the next call).  Take their batches before
 * reading more. */
size_t fb_router_full(fb_router *r, uint32_t *links, size_t cap);

/* Up to cap links whose outbox is due at now_ns (full, or by the linger
 * rule above), into links[]; returns how many.  Calling again after taking
 * their batches returns the next ones. */
size_t fb_router_due(fb_router *r, uint64_t now_ns, uint32_t *links, size_t cap);

/* Links whose outbox holds records, due or not (for a flush of everything). */
size_t fb_router_pending(fb_router *r, uint32_t *links, size_t cap);

/* Earliest time an outbox that holds records and is not held becomes due
 * by the linger rule (0 if one is due now, e.g. full or idle); UINT64_MAX
 * if none will.  With no linger, every outbox that holds records is due:
 * a caller that takes what is due after each turn sees UINT64_MAX. */
uint64_t fb_router_deadline(const fb_router *r);

/* Hand a link's pending batch over (*buf, free with fb_free; NULL and 0
 * when empty or unknown link) and record now_ns as the time of its last
 * batch.  FB_ENOMEM as fb_outbox_take (the batch then stays). */
int fb_router_take(fb_router *r, uint32_t link, uint64_t now_ns, unsigned char **buf, size_t *len);

/* Whether a link's records keep their headers (keep != 0, what a new link
 * does) or go without them (a peer that does not read them: an older
 * client, a bridge to a protocol with no place for them), and whether a
 * block the record before had is sent as a repeat (again != 0: a peer
 * that said it reads them; fb_batch.h, FB_BATCH_F_HEADERS_AGAIN; a new
 * link does not).  Unknown links: no-op. */
void fb_router_set_headers(fb_router *r, uint32_t link, int keep, int again);

/* Requests from this link (records whose header block starts with
 * :reply-to, fb_batch.h) that reach no link are answered at once: a
 * record on the reply channel with the header :status 503 and no
 * payload, routed after the batch like any other (the requester's own
 * link included).  A broker sets it for its clients, not for other
 * brokers: the broker where a request entered the tree knows whether it
 * left for anywhere.  Off for a new link. */
void fb_router_set_notify(fb_router *r, uint32_t link, int on);

/* Hold a link (held != 0: its outbox is due only when full) or release it
 * (its outbox is due again by the linger rule).  Unknown links: no-op. */
void fb_router_hold(fb_router *r, uint32_t link, int held);

/* 1 if a link is held, 0 if not (or unknown).  A broker that sends batches
 * from more than one place uses it to leave a held link's batch to the one
 * that queues for it (fastbus's C data plane leaves it to Python). */
int fb_router_held(const fb_router *r, uint32_t link);

/* Glob subscriptions (Redis's patterns, fb_glob.h), matched exactly here,
 * at the hop that delivers.  The trie only knows prefixes: a glob is held
 * there under its literal prefix (fb_glob_prefix) by a subscriber id of its
 * own, which fb_router_add_glob gives (>= FB_ROUTER_GLOB_BASE, never a
 * link).  When the trie reports such an id for a record, the router matches
 * the record's topic against the glob and, if it matches, delivers to the
 * glob's link.  A link gets a record once however many of its keys and
 * globs match it.  Why here: the forwarders, upstream brokers and the
 * publishers' filters see the prefix (a wider subscription is always safe),
 * and a subscriber is sent only what its globs match.
 *
 * fb_router_add_glob copies the pattern; FB_EINVAL for a link >= 2^31.
 * fb_router_remove_glob frees the id (FB_ENOTFOUND if it is not one); the
 * caller removes the trie's entry for it.  Removing a link leaves its
 * globs (their records go nowhere: the link has no outbox). */
#define FB_ROUTER_GLOB_BASE ((uint64_t)1 << 32)
int fb_router_add_glob(fb_router *r, uint32_t link, const void *pattern, size_t len, uint64_t *id);
int fb_router_remove_glob(fb_router *r, uint64_t id);
/* Glob subscriptions held (for counters and tests). */
size_t fb_router_glob_count(const fb_router *r);

/* Queue groups: of the members of one group, each record goes to exactly
 * one (NATS's queue subscribers), while the links subscribed plainly to
 * the same channel still each get it.  A group is held in the trie under
 * its key by a subscriber id of its own, which fb_router_add_group gives
 * (>= FB_ROUTER_GROUP_BASE, never a link nor a glob's id): the trie holds
 * the group once, however many members it has.  A glob group (pattern not
 * NULL: a Redis glob, held in the trie under its literal prefix) is
 * matched here, as a glob subscription is.
 *
 * When the trie reports a group for a record, the router picks a member
 * round robin, never the record's source: one that is not held
 * (fb_router_hold: its connection takes no more now) and not away
 * (fb_router_set_away: its session lingers without a connection); if
 * every member is, a held one (the record waits in its queue, under its
 * slow-consumer bound); if every one is away, an away one (its session
 * keeps it for its resume).  A member that also matched the record some
 * other way gets it once.  A group without members routes nothing. */
#define FB_ROUTER_GROUP_BASE ((uint64_t)1 << 33)
int fb_router_add_group(fb_router *r, const void *pattern, size_t len, uint64_t *id);
/* FB_ENOTFOUND if id is not a group; its members go with it. */
int fb_router_remove_group(fb_router *r, uint64_t id);
/* A link joins (idempotent) or leaves a group (FB_ENOTFOUND if it is not a
 * member, or id not a group).  FB_EINVAL for a link >= 2^31. */
int fb_router_group_join(fb_router *r, uint64_t id, uint32_t link);
int fb_router_group_leave(fb_router *r, uint64_t id, uint32_t link);
/* A group's members (0 for an unknown id). */
size_t fb_router_group_size(const fb_router *r, uint64_t id);
/* A member whose session is away (lingering without a connection): picked
 * only when every other member is away too.  Off for a new link. */
void fb_router_set_away(fb_router *r, uint32_t link, int away);

/* Held groups: a group that keeps what finds no member (none, only the
 * record's source, or only members whose session is away), so that a
 * member to come gets it: a work queue that
 * outlives its workers (a Channels layer's named channel).  The record is
 * kept, oldest first, in the group's backlog (fb_backlog.h) unless that
 * holds as many as the record's :hold header allows (fb_batch.h) or every
 * backlog together would cost more than the router's bound
 * (fb_router_set_held_limit); a record with a :hold header from a link
 * that is answered (fb_router_set_notify) is answered with a :status
 * saying which happened.  A backlog is given to the members when the
 * caller says (fb_router_group_give: after a join), round robin as
 * records are; what is older than the caller's expiry it drops
 * (fb_router_group_expire). */
/* Make a group held (idempotent); FB_ENOTFOUND, FB_ENOMEM. */
int fb_router_group_hold(fb_router *r, uint64_t id);
/* A group no longer held: its backlog is dropped (how many it held are
 * returned; not counted in held_dropped: the caller's to count). */
size_t fb_router_group_release(fb_router *r, uint64_t id);
/* The bound of what every backlog may cost together (fb_backlog_cost), 0: none. */
void fb_router_set_held_limit(fb_router *r, size_t max_bytes);
/* Records a group keeps now (0 for a group not held, or an unknown id). */
size_t fb_router_group_held(const fb_router *r, uint64_t id);
/* What every backlog costs now. */
size_t fb_router_held_bytes(const fb_router *r);
/* A group's backlog to its members that are not away, oldest first, one
 * member a record (none: it stays): after a join, or a member's resume;
 * returns how many were given, or FB_ENOMEM (what was not given stays). */
int64_t fb_router_group_give(fb_router *r, uint64_t id, uint64_t now_ns);
/* Drop the records a group kept before before_ns; returns how many. */
size_t fb_router_group_expire(fb_router *r, uint64_t id, uint64_t before_ns);

/* Bound channels: a group held in the trie under more keys than its own
 * (the caller adds its id under them) takes what they get as if it had
 * been published on the group's own channel, `topic`: the member it picks
 * gets, and its backlog keeps, the record under that topic (AMQP's queue
 * bound to an exchange; a Channels layer's named channel in a group).
 * Such a copy is the group's own: a member that also gets the record by
 * its first topic (a plain subscription of the bound channel) gets both.
 * `capacity` bounds what the backlog keeps of records that came so (0: no
 * count bound; a record's :hold still applies).  topic NULL: none (the
 * records keep their topics, the group's own key decides).  A broker link
 * the group picks gets such a copy as a plain record under `topic` (no
 * :groups header: the other broker routes it as published there).  Not
 * for a glob group: FB_EINVAL.  FB_ENOTFOUND, FB_ENOMEM. */
int fb_router_set_group_topic(fb_router *r, uint64_t id, const void *topic, size_t len, uint32_t capacity);

/* Every change of a backlog, told as it happens, for a journal to keep
 * (fastbus's --journal: a restart finds each held group's backlog as it
 * was).  FB_HELD_KEPT: rec was kept at at_ns (the router's clock), the
 * newest of the group's (rec views the backlog's copy: its topic, headers
 * and payload are one run of bytes, from rec->topic); FB_HELD_GONE: its n oldest left (given to
 * members, expired, or dropped with the group: in one call however many).
 * The group by its mark (fb_router_set_group_mark; a group without one is
 * not told).  Called with the router in the middle of a call: fn must not
 * call the router.  Not told: fb_router_group_restore, fb_router_destroy. */
enum { FB_HELD_KEPT = 1, FB_HELD_GONE = 2 };
typedef void (*fb_router_held_fn)(void *arg, const unsigned char *mark, size_t mark_len, int what,
                                  const fb_record *rec, uint64_t at_ns, size_t n);
void fb_router_set_held_hook(fb_router *r, fb_router_held_fn fn, void *arg);
/* A held group's backlog, to read (fb_backlog_at: a journal's snapshot);
 * NULL for a group not held. */
const fb_backlog *fb_router_group_backlog(const fb_router *r, uint64_t id);
/* Put a record back into a held group's backlog, as the newest, kept at
 * at_ns (a journal read back): no member is given it now, no capacity
 * applies, the router's byte bound does (FB_ETOOBIG past it).  FB_OK,
 * FB_ENOTFOUND (not held), FB_ENOMEM. */
int fb_router_group_restore(fb_router *r, uint64_t id, const fb_record *rec, uint64_t at_ns);

/* Queue groups across brokers.  A broker link (fb_router_set_broker) that
 * is a member of a group stands for the group's members behind it.  A
 * record's pick for a group is made once in the whole federation, by the
 * broker where the record enters: one from a client is picked for by every
 * group it matches, among all of the group's members, broker links
 * included; one from a broker link only by the groups its :groups header
 * names (fb_batch.h): the broker that sent it picked this one.  A record
 * that a group gives to a broker link goes with a :groups header naming
 * that group (and every other group that picked the same link); every
 * other copy goes without one.  A group is named by its mark
 * (fb_router_set_group_mark: the same in every broker, 1 to
 * FB_ROUTER_MARK_MAX bytes; FB_EINVAL otherwise); a group without a mark
 * is this router's alone (it picks for every record it matches, and
 * names itself to nobody).  A new link is not a broker. */
#define FB_ROUTER_MARK_MAX 32

/* A batch's records from the `skip`-th on, routed to the queue groups
 * ids[0..nids) only, as a record from a client is (one member each, never
 * `source`): what a member was given and never took, handed to another
 * (a session that ran out: fastbus.broker.loop).  Returns how many records
 * a member took, or an error (the batch is trusted: the broker's own). */
int64_t fb_router_route_groups(fb_router *r, fb_trie *t, const void *batch, size_t len, size_t skip,
                               const uint64_t *ids, size_t nids, uint64_t source, uint64_t now_ns);
int fb_router_set_group_mark(fb_router *r, uint64_t id, const void *mark, size_t len);
void fb_router_set_broker(fb_router *r, uint32_t link, int broker);

/* A link that receives every record from now_ns >= from_ns on, as if it
 * were subscribed to everything (each record once, never back to its
 * source), whatever the trie says; before from_ns only what it subscribed
 * to.  One such link per router; link UINT32_MAX clears it.
 *
 * Why: a broker's subscriptions on its upstream link are what the upstream
 * broker wants, as far as this broker has heard.  The upstream confirms a
 * subscription to its subscribers once this broker has acknowledged the
 * change, or once this broker's lease on its view has run out (fastbus's
 * protocol, docs/PROTOCOL.md "Confirmed means in effect everywhere").
 * From the lease's end the broker must therefore forward everything up,
 * until a renewed lease says its view is current again: from_ns is that
 * end, checked per routed batch. */
void fb_router_set_catchall(fb_router *r, uint32_t link, uint64_t from_ns);

/* The outbox of a link (NULL if unknown), to take its batch or append to it
 * directly; call fb_router_touch() after appending so the router tracks it. */
fb_outbox *fb_router_outbox(fb_router *r, uint32_t link);
void fb_router_touch(fb_router *r, uint32_t link);

void fb_router_get_stats(const fb_router *r, fb_router_stats *s);

#ifdef __cplusplus
}
#endif
#endif /* FB_ROUTER_H */
