/*
 * fb_react.h - a client connection's reactions to what the broker says
 * that need no Python: written once, here, and made by whichever thread
 * read the message off the socket, the native reader (fb_reader.h) or a
 * user thread in get_message()/flush() (through the engine's Reactions).
 *
 * What the broker says that changes only native state is applied the
 * moment it is read, so that no message of it waits for a Python thread:
 *
 *   FLOW [flow_command, b]   sets *flow_paused (1 when b is flow_pause) and,
 *                            at a resume, signals *flow_wake (the native
 *                            sender's, fb_sender.h): taken, counted.
 *   WELCOME (flow_reset_command)  a new session is not paused: *flow_paused
 *                            set to 0; the owner's too (it reads the rest).
 *   WANT [want_command, flags, ops(, seq)]  applied to *view (fb_view.h) and
 *                            its ACK [ack_command, seq u64 LE] sent if due.
 *   PONG [pong_command, lease_token + sent u64 LE, instance, lease u64 LE]
 *                            a lease ping's answer: its lease applied to
 *                            *view (fb_view_lease), an ACK sent if due.
 *   PONG [live_pong_command, "", instance]  a liveness ping's, naming the
 *                            broker the owner knows (fb_react_set_instance):
 *                            taken, counted (another instance: the owner's,
 *                            who says HELLO again).
 *   TOOK [took_command, n u64 LE]  the broker's count of what it took of the
 *                            connection's kept messages: took(sock, n).
 *
 * and the liveness ping [ping_command, ""] is sent every ping_interval_ns
 * by whoever holds the lock when it is due (fb_react_ping_if_due); the
 * lease ping [ping_command, lease_token + send time u64 LE, lease_ask] when
 * the view asks for a renewal (fb_react_lease_ping: the native sender's
 * thread, or the publishing thread without one).
 *
 * Every hook is optional (its pointer NULL, or ping_interval_ns 0); what a
 * hook does not take (another command, a malformed message) is the
 * owner's, whose reading of it says what is wrong.  Everything is called
 * with the connection's lock held (fb_slock.h); the counters and
 * next_ping_ns are atomic, for readers without it.
 */
#ifndef FB_REACT_H
#define FB_REACT_H

#include <stddef.h>
#include <stdint.h>

#include "fb_view.h"
#include "fb_wake.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The longest broker instance compared (a longer one is never taken as
 * known: its PONGs all go to the owner). */
#define FB_REACT_INSTANCE_MAX 64
/* The longest lease token. */
#define FB_REACT_TOKEN_MAX 32
/* The most frames a reaction's message has: a longer message is the
 * owner's (a caller needs arrays of no more). */
#define FB_REACT_FRAMES_MAX 8

/* What became of a message (fb_react_message). */
enum {
    FB_REACT_OWNER = 0,          /* not a reaction's (or malformed): the owner handles it */
    FB_REACT_TAKEN = 1,          /* applied; nothing left to do */
    FB_REACT_ACK = 2             /* applied, and an ACK is due that the socket did not take
                                    now: the owner sends [ack_command, *ack] its own way */
};

typedef struct fb_react {
    /* The connection: its send (zmq_send's signature), set once. */
    int (*send)(void *sock, const void *buf, size_t len, int flags);
    void *sock;

    /* FLOW (flow_paused NULL: none). */
    const void *flow_command;
    size_t flow_command_len;
    unsigned char flow_pause;
    int *flow_paused;            /* atomic: the native sender reads it (fb_sender.h paused) */
    fb_wake *flow_wake;          /* signalled at a resume (optional) */
    const void *flow_reset_command;
    size_t flow_reset_command_len;

    /* WANT and lease PONG (view NULL: none; pong_command NULL: no lease PONG). */
    const void *want_command;
    size_t want_command_len;
    const void *ack_command;
    size_t ack_command_len;
    fb_view *view;
    const void *pong_command;
    size_t pong_command_len;
    const void *lease_token;     /* at most FB_REACT_TOKEN_MAX bytes */
    size_t lease_token_len;
    const void *lease_ask;       /* NULL: no lease pings (they need ping_command too) */
    size_t lease_ask_len;

    /* Liveness (ping_interval_ns 0: none). */
    const void *ping_command;
    size_t ping_command_len;
    const void *live_pong_command;
    size_t live_pong_command_len;
    uint64_t ping_interval_ns;

    /* TOOK (took NULL: none). */
    const void *took_command;
    size_t took_command_len;
    void (*took)(void *sock, uint64_t n);

    /* State. */
    uint64_t next_ping_ns;       /* atomic (fb_now_ns's clock); 0: due now */
    uint64_t pings_sent;         /* atomic counters */
    uint64_t pongs_taken;
    uint64_t flow_pauses;        /* FLOW pauses read while not paused */
    uint64_t wants_refused;      /* WANTs the view refused (the owner's to report) */
    uint64_t lease_pings;        /* lease pings sent */
    unsigned char instance[FB_REACT_INSTANCE_MAX];
    size_t instance_len;         /* 0: not known yet (every liveness PONG is the owner's) */
} fb_react;

/* A message read off the connection, frames[i] / lens[i] for i < nframes
 * (at most FB_REACT_FRAMES_MAX are looked at): apply what is a reaction's
 * (above).  FB_REACT_ACK sets *ack. */
int fb_react_message(fb_react *x, size_t nframes, const unsigned char *const *frames, const size_t *lens,
                     uint64_t *ack);
/* The broker's instance, as its WELCOME (or a PONG) said; an empty or
 * overlong one makes every liveness PONG the owner's. */
void fb_react_set_instance(fb_react *x, const void *instance, size_t len);
/* Send the liveness ping if it is due at now, and set the next; 1 if one
 * was sent.  One the socket does not take now (reconnecting, its queue
 * full) is not sent: the next is a ping_interval_ns later. */
int fb_react_ping_if_due(fb_react *x, uint64_t now);
/* Send the lease ping if the view asks for a renewal (fb_view_take_renewal),
 * its token's time now: 1 if sent, 0 if none is asked for, -1 if the
 * socket did not take it (the renewal is asked for again; *token, of
 * lease_token_len + 8 bytes, is the token it would have had, for an owner
 * that sends it its own way). */
int fb_react_lease_ping(fb_react *x, uint64_t now, unsigned char *token);
/* How long until the liveness ping is due: ms, 0 for now, -1 for never. */
int fb_react_ping_wait_ms(fb_react *x, uint64_t now);

#ifdef __cplusplus
}
#endif
#endif /* FB_REACT_H */
