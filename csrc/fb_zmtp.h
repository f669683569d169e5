/*
 * fb_zmtp.h - a ZeroMQ DEALER connection (ZMTP 3, NULL mechanism) spoken
 * over a plain stream socket by whichever thread calls it, with no I/O
 * thread of its own.
 *
 * Why: through libzmq, a message crosses a thread in each process it
 * passes (the caller hands it to libzmq's I/O thread, which writes it; on
 * the other side the I/O thread reads it and hands it on).  Each hand-over
 * is a wake-up, tens of microseconds on a loaded or virtual machine, and
 * libzmq has no mode that writes in the caller's thread.  A client of the
 * broker has one connection per session and needs none of libzmq's
 * routing, so the client's engine (fb_sender.h, fb_reader.h) and its
 * Python sessions can use this instead: the publishing thread writes the
 * socket, the reading thread reads it.  Its peer is a ROUTER: the broker's
 * own (fb_zmtp_server.h) or libzmq's (CURVE, FASTBUS_BROKER_TRANSPORT=
 * libzmq), which cannot tell it from a libzmq DEALER.
 *
 * The calls mirror the few of libzmq's that the engine makes (zmq.h's
 * signatures and values, so fb_zmq_calls / fb_zmq_recv_calls can point at
 * them), with libzmq's contract for a DEALER that connects:
 *
 *  - Messages sent before the connection exists, or while it is being
 *    made again, are queued (up to sndhwm messages) and go once the
 *    handshake is done.  A message leaves whole or not at all: a connection
 *    lost in the middle of one drops what was queued (the broker sees a new
 *    connection, which says HELLO first; anything else it refuses).
 *  - A message is received whole: the first frame is given only once all
 *    of its frames are here.  Unlike libzmq's, a received frame is a view
 *    of the connection's input buffer, valid until the next call on the
 *    connection (fb_zmtp_msg_close or not): its users (fb_reader.c,
 *    _engine.pyx's recv_frames) copy it at once, and no frame is copied
 *    twice.
 *  - The connection is made again when lost (reconnect_ivl, doubling up to
 *    reconnect_ivl_max), by whoever calls next.
 *  - ZMQ_FD is a descriptor that is readable while ZMQ_EVENTS may say
 *    more than it did (the kernel holds input, what is queued has room
 *    to go, the reconnect is due); ZMQ_EVENTS says what is possible.  It
 *    is an epoll descriptor, the same for the connection's life (a
 *    reconnect changes the socket under it), level-triggered (no call to
 *    take an edge: the read path's only syscall is recv), so whoever
 *    polls it reads what it reports, as a poller of a pyzmq socket does.
 *    Whole messages already taken into the connection's buffer do not
 *    show on it: fb_zmtp_buffered says whether there are any (a reader
 *    that stopped before EAGAIN may have left some).
 *
 * Every length read from the network is checked: a frame or message above
 * max_msg_bytes, or anything that is not ZMTP from a ROUTER, closes the
 * connection (counted in protocol_errors) and it is made again.
 *
 * Not thread-safe, as a libzmq socket is not: one caller at a time (the
 * client holds its session's lock, fb_slock.h).  Linux (epoll, timerfd);
 * elsewhere fb_zmtp_open fails with ENOSYS and the client uses libzmq.
 */
#ifndef FB_ZMTP_H
#define FB_ZMTP_H

#include <stddef.h>
#include <stdint.h>

#include "fb_reader.h"    /* fb_zmq_msg */

#ifdef __cplusplus
extern "C" {
#endif

/* zmq.h's values. */
#define FB_ZMTP_DONTWAIT 1
#define FB_ZMTP_SNDMORE 2
#define FB_ZMTP_RCVMORE 13
#define FB_ZMTP_FD 14
#define FB_ZMTP_EVENTS 15
#define FB_ZMTP_POLLIN 1
#define FB_ZMTP_POLLOUT 2

typedef struct fb_zmtp_options {
    int sndhwm;                  /* messages queued beyond the kernel's buffer (>= 1) */
    int sndbuf, rcvbuf;          /* SO_SNDBUF / SO_RCVBUF (0: the system's) */
    int keepalive;               /* SO_KEEPALIVE */
    uint64_t max_msg_bytes;      /* the largest message accepted from the peer (all frames) */
    uint64_t reconnect_ivl_ns;   /* first wait before connecting again */
    uint64_t reconnect_ivl_max_ns;
} fb_zmtp_options;

typedef struct fb_zmtp_stats {
    uint64_t connects;           /* handshakes completed */
    uint64_t disconnects;        /* connections lost (or refused) */
    uint64_t protocol_errors;    /* connections closed for what the peer sent */
    uint64_t dropped_messages;   /* queued messages dropped with a lost connection */
    uint64_t syscalls_send, syscalls_recv;
    uint64_t unkept;             /* counted messages sent without a copy kept (no memory) */
    uint64_t lookups;            /* host name lookups done after losses (fb_zmtp_set_host) */
    uint64_t lookup_failures;    /* ... that found nothing (the last address kept) */
    uint64_t address_changes;    /* ... that gave another address (connected to from then on) */
} fb_zmtp_stats;

typedef struct fb_zmtp fb_zmtp;

/* A connection to `addr` (a struct sockaddr of `addrlen` bytes: AF_INET,
 * AF_INET6 or AF_UNIX), started at once.  NULL with *err set to an errno if
 * it cannot be made at all (no memory, no descriptors, ENOSYS); a peer that
 * is not there yet is not an error (it is tried again). */
fb_zmtp *fb_zmtp_open(const void *addr, size_t addrlen, const fb_zmtp_options *opts, int *err);
/* The address was `host`'s (a name; copied): look it up again each time a
 * connection is lost, in a thread of its own (fb_resolve.h), and connect
 * from then on to what it found, at the same port; the last address found
 * stays in use while a lookup runs or if it fails.  As libzmq does at
 * each reconnect: a service that moved (a container restarted elsewhere,
 * a DNS record changed) is reached again.  0, or -1 with errno (EINVAL:
 * not a TCP address; ENOMEM). */
int fb_zmtp_set_host(fb_zmtp *z, const char *host);
/* The struct sockaddr connected to now (*len: room in, size out).  0, or
 * -1 with errno ENOSPC. */
int fb_zmtp_address(const fb_zmtp *z, void *addr, size_t *len);
/* Close: what is still queued gets up to linger_ms to leave (0: dropped). */
void fb_zmtp_close(fb_zmtp *z, int linger_ms);

/* libzmq's calls (void *socket: an fb_zmtp).  send: -1 with errno EAGAIN
 * when sndhwm messages wait (checked at a message's first frame; frames
 * after it are always taken), ENOTSOCK once closed.  DONTWAIT is implied:
 * nothing here blocks. */
int fb_zmtp_send(void *z, const void *buf, size_t len, int flags);
int fb_zmtp_getsockopt(void *z, int option, void *value, size_t *len);
int fb_zmtp_msg_init(fb_zmq_msg *msg);
int fb_zmtp_msg_recv(fb_zmq_msg *msg, void *z, int flags);
void *fb_zmtp_msg_data(fb_zmq_msg *msg);
size_t fb_zmtp_msg_size(const fb_zmq_msg *msg);
int fb_zmtp_msg_more(const fb_zmq_msg *msg);
int fb_zmtp_msg_close(fb_zmq_msg *msg);

/* Is a whole message (or the rest of one) here to be received without
 * reading the kernel's socket?  No syscall. */
int fb_zmtp_buffered(fb_zmtp *z);
/* May a receive find a message without waiting: one is buffered, or the
 * last read filled all the room it had (the kernel may hold more)?  0
 * means the kernel was drained at the last read: a poll of the descriptor
 * says when more comes (a reader can wait there at once instead of trying
 * a receive that would find nothing).  No syscall. */
int fb_zmtp_pending(fb_zmtp *z);
/* A message (n frames) the connection sends first each time it is made
 * again after a loss, ahead of what waits (libzmq's ZMQ_HELLO_MSG, on
 * reconnects only): so the peer hears at once that this is the same
 * client on a new connection, instead of at its next message.  A copy is
 * kept; n = 0 clears it.  0, or -1 with errno (ENOMEM, EINVAL). */
int fb_zmtp_set_reconnect_message(fb_zmtp *z, const void *const *frames, const size_t *lens, int n);
/* Resend: messages whose first frame begins with one of `commands` (n
 * bytes, at most 8) are counted, numbered 1, 2, ... in the order sent, and
 * a copy of each is kept until the peer acknowledges it (fb_zmtp_acked,
 * cumulative), at most max_bytes of them (past it a counted message's
 * send is EAGAIN: the sender waits, as at sndhwm).  When a connection
 * that was up is lost, counted messages are held from then on (kept, not
 * written) until fb_zmtp_resume says what the peer has on the new one:
 *   FB_ZMTP_RESUMED: the peer's session goes on and holds `received` of
 *     them: what follows is written again, in order, then what was held;
 *   FB_ZMTP_FRESH: a new session at the peer: what went on the lost
 *     connection is dropped (returned: how many), what never went is
 *     written, numbered from 1 again;
 *   FB_ZMTP_FRESH_DROP: a new session, everything kept dropped (the
 *     caller sends its state again its own way).
 * Set before anything is counted; n = 0 turns it off at any time (what is
 * kept and held goes).  So a connection cut costs nothing the
 * peer's count does not cover: nothing lost, nothing twice. */
#define FB_ZMTP_RESUMED 0
#define FB_ZMTP_FRESH 1
#define FB_ZMTP_FRESH_DROP 2
int fb_zmtp_set_resend(fb_zmtp *z, const unsigned char *commands, size_t n, size_t max_bytes);
void fb_zmtp_acked(fb_zmtp *z, uint64_t n);
uint64_t fb_zmtp_resume(fb_zmtp *z, uint64_t received, int how);
void fb_zmtp_resend_state(const fb_zmtp *z, uint64_t *counted, uint64_t *acked, size_t *kept_bytes, int *held);

/* Each message kept for resend, oldest first: fn(arg, its first frame's
 * body, its size, its last frame's body, its size), until fn returns
 * nonzero.  What a closing sender asks to say what the peer never
 * acknowledged (the records in its batches).  The number of messages. */
/* 1 once for each connection that was up and went (a cut, the peer
 * gone), then 0 until the next: what a subscriber is told at once
 * (fb_reader.h `lost`), whoever of its readers asks first; the lock of
 * whoever reads the connection held. */
int fb_zmtp_take_lost(void *sock);

typedef int (*fb_zmtp_kept_fn)(void *arg, const unsigned char *first, size_t first_len,
                               const unsigned char *last, size_t last_len);
size_t fb_zmtp_kept_each(const fb_zmtp *z, fb_zmtp_kept_fn fn, void *arg);
/* Is the handshake done (messages flow now)? */
int fb_zmtp_connected(const fb_zmtp *z);
void fb_zmtp_get_stats(const fb_zmtp *z, fb_zmtp_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* FB_ZMTP_H */
