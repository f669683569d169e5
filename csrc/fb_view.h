/*
 * fb_view.h - a publisher's view of what subscribers want: the filter that
 * the broker's WANT messages build (docs/PROTOCOL.md, "publisher filter"),
 * and the bookkeeping of acknowledging them (ACK).
 *
 * Two threads apply WANTs: the connection's native reader (fb_reader.h),
 * the moment it reads one, and the owner's Python thread when it reads the
 * socket itself; the publishing thread matches every message against the
 * view.  So the view has its own lock, held only for one call.  A
 * subscription's confirmation waits for every publisher's ACK; applying and
 * acknowledging in the reader means it never waits for a Python thread of
 * a publisher (one busy in Python held it to the interpreter's 5 ms
 * switch interval per subscribe(), measured: p50 5.5 ms, p99 26 ms).
 *
 * A WANT is [W, flags u8, ops batch(, seq u64 LE)]: flag bit 0 (reset) says
 * the ops are a full snapshot; otherwise they are a diff on the last one.
 * Ops are a batch (fb_batch.h) whose records are (key, one flags byte:
 * FB_OP_F_SUBSCRIBE | FB_OP_F_PREFIX).  The seq, when present, is
 * acknowledged while the lease the broker granted us may still run as the
 * broker sees it (ack_until_ns, set by the owner when a lease arrives);
 * what is applied outside it is acknowledged when the next lease arrives
 * (fb_view_grant).
 *
 * The view itself counts only under that lease (lease_until_ns): past it,
 * a message it would drop is sent.  A publisher whose filter drops
 * messages asks for a renewal from renew_at_ns on (fb_view_ask_renewal),
 * once until the answer; whoever sends the ping takes the request
 * (fb_view_take_renewal), and whoever reads the PONG applies the lease
 * (fb_view_lease).  Both can be native threads (fb_sender.h, fb_reader.h),
 * so a publisher busy in Python keeps its lease without any Python thread
 * of its own: a keeper starved of the interpreter lock let the lease run
 * out and the publisher send what nobody wanted.  These fields are read
 * without the lock on the publish path (atomics).
 */
#ifndef FB_VIEW_H
#define FB_VIEW_H

#include <stddef.h>
#include <stdint.h>

#include "fb_lock.h"
#include "fb_protocol.h"     /* FB_WANT_RESET, FB_OP_F_* */
#include "fb_trie.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The share of a granted lease a publisher counts on (per mille): clocks
 * may run at slightly different rates on two hosts (protocol.LEASE_USE). */
#define FB_VIEW_LEASE_USE_PERMILLE 900u
/* A lease longer than this (from the network) counts as this long. */
#define FB_VIEW_LEASE_MAX_US 3600000000ull
/* fb_view.renew */
#define FB_VIEW_RENEW_NONE 0     /* no renewal asked for */
#define FB_VIEW_RENEW_WANTED 1   /* asked for; its ping not sent yet */
#define FB_VIEW_RENEW_SENT 2     /* its ping sent; the PONG not read yet */

typedef struct fb_view {
    fb_lock lock;            /* guards every field below, for one call */
    fb_trie *trie;           /* the view (subscriber 0); NULL until the first reset */
    int on;                  /* a reset arrived this session: filter with it */
    uint64_t applied;        /* the seq of the latest WANT applied (0: none this session) */
    uint64_t acked;          /* the latest seq acknowledged */
    uint64_t ack_until_ns;   /* acknowledge at once until then (monotonic, fb_now_ns) */
    uint64_t wants;          /* WANTs applied (for stats) */
    /* The lease (atomic; see the top): */
    uint64_t lease_until_ns; /* the view counts until then; UINT64_MAX: for ever (no leases) */
    uint64_t renew_at_ns;    /* a publisher whose filter drops asks for a new lease from then on */
    int renew;               /* FB_VIEW_RENEW_* */
    uint64_t leases;         /* leases applied (for stats) */
} fb_view;

void fb_view_init(fb_view *v);
void fb_view_free(fb_view *v);

/* Apply one WANT (the frames after the command; has_seq: a fourth frame,
 * seq).  Returns FB_OK; a batch error (fb_batch_decode's) or
 * FB_EMALFORMED for an op that is not one flags byte of known bits (the
 * view is then unchanged); FB_ENOMEM (the view is turned off: every
 * message is sent, which loses nothing).  Flag bits other than reset are
 * ignored, as a diff on no view yet is (everything is sent until a reset).  *ack: the seq to acknowledge now, 0 for none; once
 * sent, fb_view_acked(v, *ack). */
int fb_view_apply(fb_view *v, unsigned flags, const void *ops, size_t len, int has_seq, uint64_t seq,
                  uint64_t now_ns, uint64_t *ack);
/* An ACK for seq left. */
void fb_view_acked(fb_view *v, uint64_t seq);
/* A lease arrived that the broker counts until ack_until_ns: returns the
 * seq to acknowledge now (what was applied outside the last one), or 0. */
uint64_t fb_view_grant(fb_view *v, uint64_t ack_until_ns);
/* A new session (HELLO sent): no view, seqs anew, until its reset; no
 * lease until its WELCOME (or a PONG) grants one. */
void fb_view_forget(fb_view *v);

/* Does the view count at now (under its lease)? */
int fb_view_in_lease(fb_view *v, uint64_t now_ns);
/* The publisher's filter dropped (or would drop) a message at now: 1 if a
 * renewal is to be asked for now (renew_at_ns reached, or `force`, and
 * none asked for yet: the caller then has its ping sent), else 0. */
int fb_view_ask_renewal(fb_view *v, uint64_t now_ns, int force);
/* A sender: 1 if a renewal's ping is to be sent now (the request is taken:
 * on failure to send, fb_view_renewal_unsent puts it back). */
int fb_view_take_renewal(fb_view *v);
void fb_view_renewal_unsent(fb_view *v);
/* A lease of lease_us (µs) for what left at sent_ns (a ping's, or a
 * HELLO's): extends lease_until_ns (never shortens it; a lease of 0 grants
 * nothing: a downstream broker whose own lease ran out grants 0, and the
 * view must not count until sent_ns, a time it may be checked against
 * from before the ping left), sets renew_at_ns,
 * answers the renewal asked for, and acknowledges as fb_view_grant (the
 * broker counts the lease until twice it after sent_ns): returns the seq
 * to acknowledge now, or 0. */
uint64_t fb_view_lease(fb_view *v, uint64_t sent_ns, uint64_t lease_us);
/* A renewal's ping was answered without a lease (the broker does not know
 * this session yet): it may be asked for again. */
void fb_view_renewal_answered(fb_view *v);
/* The lease is set outright: 0 (none), or UINT64_MAX (for ever: a broker
 * that grants none waits for nobody). */
void fb_view_set_lease(fb_view *v, uint64_t until_ns);
/* 1 if some subscription in the view matches the topic, 0 if none, -1 if
 * there is no view (everything is wanted). */
int fb_view_match(fb_view *v, const void *topic, size_t len);
/* The same, and *until_ns: the lease that view counts under, read with it
 * (under the lock).  What publish() decides by: a lease is applied after
 * the WANTs that preceded its PONG, so a view read before a lease (a match,
 * then the lease looked up) may lack a subscription that the broker
 * confirmed without waiting for us, our lease having run out, while the
 * lease read later is a new one.  Read together, the view is never older
 * than its lease.  The caller reads the clock after this call: the lease
 * must hold at a time no earlier than the view. */
int fb_view_match_lease(fb_view *v, const void *topic, size_t len, uint64_t *until_ns);

#ifdef __cplusplus
}
#endif
#endif /* FB_VIEW_H */
