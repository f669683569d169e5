/*
 * fb_resp_session.h - a Redis client's connection, spoken to as a fastbus
 * session: the broker's side of RESP2 and RESP3 for what a pub/sub client
 * sends.
 *
 * Why here, in the transport: every library that takes a redis:// URL
 * (redis-py, ioredis, go-redis, Jedis, hiredis, redis-cli) builds its own
 * client, so the broker must speak Redis's protocol to be used unchanged.
 * A RESP connection is translated, in C and in the broker's own thread,
 * into the messages a fastbus client would send (HELLO, SUB, PUB: the
 * relay routes them as any session's, fastbus/broker/_relay.pyx), and the
 * broker's answers (WELCOME, CONFIRM, DATA, REFUSED, KICK) into Redis's
 * replies and push messages.  So a RESP peer is a link of the same data
 * plane: the same router, slow-consumer bounds, limits and monitoring, and
 * a message published by a fastbus client reaches a Redis subscriber and
 * the reverse.  fb_zmtp_server.c owns the socket and calls this module;
 * this module never touches a descriptor.
 *
 * What is answered here, without the broker: PING, ECHO, QUIT, RESET and
 * the subscribed-mode and NOAUTH gates.  SUBSCRIBE, PSUBSCRIBE,
 * SSUBSCRIBE and their UN- twins become SUB messages (keys kept here too:
 * Redis says which subscription a message matched, "message" or
 * "pmessage" with the pattern, so each record the broker delivers once is
 * matched again against this connection's own keys); PUBLISH and SPUBLISH
 * a PUB of one record, answered with the receivers the router counted
 * (fb_resp_session_routed).  Every other command goes to the broker's
 * Python side as one "r" message ([r, state, request as a RESP array]),
 * which answers with the reply's bytes ([r, reply(, state)]): HELLO, AUTH,
 * CLIENT, INFO, COMMAND, PUBSUB, SELECT and the unknown-command error are
 * written once, there.
 *
 * Replies keep the requests' order: while a command waits for the broker
 * (its session's WELCOME, a subscription's CONFIRM, a Python reply) no
 * further request is parsed, and data that comes before a subscription's
 * CONFIRM is held and written after the subscribe reply, as Redis orders
 * them.
 *
 * Input is untrusted: a request is bounded (argument count 1,048,576, a
 * bulk 512 MB, all of it max_request bytes), parsed incrementally (a
 * request that arrives a byte at a time is read once, not rescanned), and
 * anything that is not RESP gets "-ERR Protocol error: ..." and the
 * connection closed once that is written, as Redis does.
 */
#ifndef FB_RESP_SESSION_H
#define FB_RESP_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "fb_zmtp_wire.h"   /* fb_zbuf */

#ifdef __cplusplus
extern "C" {
#endif

/* fb_resp_session_input's and _deliver's results (besides FB_ENOMEM). */
enum {
    FB_RESP_MORE = 0,      /* every whole request was handled: read more input */
    FB_RESP_MESSAGE = 1,   /* a message for the broker is ready (fb_resp_session_frame) */
    FB_RESP_WAIT = 2,      /* waiting for the broker's answer: read nothing until it comes */
    FB_RESP_CLOSE = 3,     /* close the connection once `out` is written */
    FB_RESP_YIELD = 4,     /* handled a turn's worth: let other connections go first */
    FB_RESP_RESUME = 5     /* (deliver) the wait is over: parse input again */
};

/* State bits of the "r" message to the broker and of its answer. */
#define FB_RESP_STATE_RESP3 0x01u     /* HELLO 3 said: push messages, RESP3 types */
#define FB_RESP_STATE_AUTHED 0x02u    /* AUTH (or HELLO AUTH) succeeded, or none is required */
#define FB_RESP_STATE_NEED_AUTH 0x04u /* the broker checks passwords (request only) */
#define FB_RESP_STATE_SUBSCRIBED 0x08u/* the connection holds a subscription (request only) */
#define FB_RESP_STATE_CLOSE 0x80u     /* (answer only) close once the reply is written */

/* Redis's bounds on one request. */
#define FB_RESP_MAX_ARGS (1024u * 1024u)
#define FB_RESP_MAX_INLINE (64u * 1024u)

typedef struct fb_resp_session fb_resp_session;

/* One frame of a message from the broker. */
typedef struct fb_resp_frame {
    const unsigned char *p;
    size_t n;
} fb_resp_frame;

/* A session for a new connection; its first message (a HELLO) is ready at
 * once.  max_request: the largest request accepted (bytes); auth_required:
 * commands other than AUTH, HELLO, QUIT and RESET are refused (NOAUTH)
 * until the broker says AUTHED.  NULL: no memory. */
fb_resp_session *fb_resp_session_new(uint64_t max_request, int auth_required);
void fb_resp_session_free(fb_resp_session *r);

/* Handle the whole requests at the front of in[0, len): replies written to
 * out, *used the bytes of the requests handled (a partial request is
 * remembered, not consumed: pass it again, with what follows, from the
 * same start).  Returns an FB_RESP_* code or FB_ENOMEM. */
int fb_resp_session_input(fb_resp_session *r, const unsigned char *in, size_t len, size_t *used, fb_zbuf *out);

/* After FB_RESP_MESSAGE: its frames (after the routing id), one a call:
 * returns 1 while more follow, 0 with the last, -1 when none is left.
 * Views valid until the next fb_resp_session_input. */
int fb_resp_session_frame(fb_resp_session *r, const unsigned char **p, size_t *n);

/* Is a message ready, or are subscription changes left to send? */
int fb_resp_session_pending(const fb_resp_session *r);

/* The broker routed the PUB last given (receivers: the record copies it
 * made; over: records dropped over the size limits): its reply. */
void fb_resp_session_routed(fb_resp_session *r, uint64_t receivers, uint64_t over, fb_zbuf *out);

/* A whole message from the broker, frames[0] its command: translated into
 * out.  Returns 0, FB_RESP_RESUME (input may be parsed again),
 * FB_RESP_CLOSE (a KICK, or a reply that closes), or FB_ENOMEM. */
int fb_resp_session_deliver(fb_resp_session *r, const fb_resp_frame *frames, int n, fb_zbuf *out);

/* Counters of one session (for the server's stats). */
typedef struct fb_resp_session_stats {
    uint64_t requests, published, delivered, gaps_lost;
} fb_resp_session_stats;
void fb_resp_session_get_stats(const fb_resp_session *r, fb_resp_session_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* FB_RESP_SESSION_H */
