/*
 * fb_leases.h - a session's PING answered in the broker's data plane: the
 * liveness ping every client sends each ping_interval, and the lease ping
 * of a filtering publisher (ten to twenty a second each), so that neither
 * costs the broker's owner (Python) a turn.
 *
 * A PING is [token] or, from a session that said "ack", [token, "lease"];
 * its answer is PONG [token, instance] or [token, instance, lease µs] and
 * grants the lease (the link's lease_end_ns, which only grows: the peer
 * keeps the latest end it was granted).  The answer goes at once when
 * nothing waits for the link, else behind what waits (DATA, and a WANT
 * mark: the lease is on the view those give it), never ahead.  The lease
 * counts from before the PONG leaves, as the client counts from before
 * its PING left: both ends err short.
 *
 * Until the owner says the broker's instance id (and, for lease pings, a
 * lease length), nothing is answered here: the owner answers.  A broker
 * whose lease depends on its own from upstream leaves lease pings to its
 * owner (lease 0).  Not thread-safe: the data plane's thread.  Tested
 * alone in tests/test_leases.c.
 */
#ifndef FB_LEASES_H
#define FB_LEASES_H

#include <stddef.h>
#include <stdint.h>

#include "fb_links.h"
#include "fb_zmq_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FB_INSTANCE_MAX 64           /* the broker instance id a PONG carries (protocol.new_instance_id: 16) */

typedef struct fb_leases {
    uint8_t instance[FB_INSTANCE_MAX];
    size_t instlen;                  /* 0: not said yet (nothing is answered here) */
    uint64_t lease_ns;               /* what a lease ping is granted (0: its owner answers them) */
    uint64_t answered;               /* PINGs answered here */
    uint64_t granted;                /* ... of them lease pings, a lease granted */
} fb_leases;

/* fb_leases_pong's outcome. */
enum {
    FB_PONG_SENT = 0,                /* handed to the socket */
    FB_PONG_QUEUED = 1,              /* queued behind what waits for the link (the caller blocks it, applies the bound) */
    FB_PONG_GONE = 2,                /* the socket says the peer is gone: the caller loses the link */
    FB_PONG_NOT = 3                  /* not answered (not said yet, not a lease ping this answers, no memory): the owner's */
};

/* Say the instance id (at most FB_INSTANCE_MAX bytes) and the lease a
 * lease ping is granted (0: none here): 0, or -1 (EINVAL). */
int fb_leases_set(fb_leases *l, const void *instance, size_t n, uint64_t lease_ns);

/* Answer a PING of `token` from link `s` (a session: its routing id is
 * the first frame sent, on `sock` through `api`); `ask` is the lease
 * ping's second frame (NULL: a liveness ping).  Queued entries' messages
 * are made through `z`.  Returns FB_PONG_*; a grant is recorded on `s`
 * and counted when the answer is sent or queued. */
int fb_leases_pong(fb_leases *l, fb_link *s, const fb_zmq_api *api, void *sock, const fb_zmq_msg_calls *z,
                   const void *token, size_t tlen, const void *ask, size_t asklen, uint64_t now);

/* The owner granted a lease ending at `end_ns` (WELCOME, a PONG it
 * answered): recorded if it ends later than the link's. */
void fb_leases_grant(fb_link *s, uint64_t end_ns);

#ifdef __cplusplus
}
#endif

#endif
