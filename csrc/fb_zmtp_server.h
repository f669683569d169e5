/*
 * fb_zmtp_server.h - a ZeroMQ ROUTER (ZMTP 3, NULL mechanism) that listens
 * on plain stream sockets and is driven by whichever thread calls it, with
 * no I/O thread of its own: the broker's side of fb_zmtp.h.
 *
 * Why: through libzmq a message crosses two threads in the broker (its I/O
 * thread reads the publisher's connection and hands the message to the
 * relay's thread; the relay hands each DATA back to the I/O thread, which
 * writes it).  Each hand-over is a wake-up, and on a loaded machine the
 * I/O thread was the broker's largest cost.  Here the relay's own thread
 * (fastbus/broker/_relay.pyx) reads and writes the kernel's sockets.
 * Clients cannot tell the difference: any ZeroMQ DEALER still connects.
 *
 * The calls mirror the libzmq ones the relay makes on its ROUTER socket
 * (zmq.h's signatures and values), with libzmq's contract for a ROUTER
 * with ROUTER_MANDATORY:
 *
 *  - A message is received whole, as [routing id, frame, ...]; peers are
 *    taken in turn, a message each.  Routing ids are 9 bytes (a zero byte,
 *    then the connection's slot and generation): an id is never given to
 *    another connection.  A received frame is a view, valid until the next
 *    receive (as with fb_zmtp.h); its "Peer-Address" property
 *    (fb_zmtp_server_msg_gets) is the peer's IP address, NULL for a Unix
 *    socket.  Whole messages read before a connection was lost are still
 *    received.
 *  - A send starts with a routing id: -1 with errno EHOSTUNREACH for an id
 *    that is not (or no longer) a connection that finished its handshake,
 *    EAGAIN while sndhwm whole messages to that peer wait for the kernel's
 *    room.  The frames after an id that was taken are always taken.  A
 *    message is written when its last frame is given (no syscall per frame).
 *  - ZMQ_FD is an epoll descriptor, level-triggered: readable while a
 *    listener has a connection to accept, a connection has input, or bytes
 *    queued for a peer have room to go.  ZMQ_EVENTS takes in what it
 *    reports (accepts, writes what has room) without reading.  Input
 *    already taken into a connection's buffer does not show on it:
 *    fb_zmtp_server_buffered says whether there is any.
 *
 * Every length read from the network is checked: a frame or message above
 * max_msg_bytes, a command over 4 KiB, data before the handshake, a peer
 * that is not ZMTP 3 / NULL, or a Socket-Type a ROUTER does not talk to,
 * closes that connection (counted in protocol_errors).  Nothing from the
 * network is kept beyond one message under way per connection.
 *
 * Not thread-safe (one caller at a time, as a libzmq socket).  Linux
 * (epoll); elsewhere fb_zmtp_server_new fails with ENOSYS and the broker
 * uses libzmq.  The received message's msg_init/data/size/more/close calls
 * are fb_zmtp.h's (the same view).
 */
#ifndef FB_ZMTP_SERVER_H
#define FB_ZMTP_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "fb_reader.h"    /* fb_zmq_msg */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_zmtp_server_options {
    int sndhwm;                  /* whole messages queued per peer beyond the kernel's buffer (>= 1) */
    int sndbuf, rcvbuf;          /* SO_SNDBUF / SO_RCVBUF of each connection (0: the system's) */
    int keepalive_idle_s;        /* TCP keepalive: seconds idle before probing (0: off) */
    int keepalive_intvl_s, keepalive_cnt;
    uint64_t max_msg_bytes;      /* the largest message accepted from a peer (all frames); a RESP request too */
    int resp_auth_required;      /* RESP clients must AUTH first (the broker's Python side checks) */
} fb_zmtp_server_options;

typedef struct fb_zmtp_server_stats {
    uint64_t accepted;           /* connections accepted */
    uint64_t connections;        /* open now (handshake done or not) */
    uint64_t disconnects;        /* connections lost */
    uint64_t protocol_errors;    /* connections closed for what the peer sent */
    uint64_t dropped_messages;   /* whole messages to a peer that left before they were written */
    uint64_t handshake_timeouts; /* connections closed for not finishing the handshake in time */
    uint64_t resp_accepted;      /* of the accepted, Redis clients (RESP) */
    uint64_t syscalls_send, syscalls_recv, syscalls_poll;
} fb_zmtp_server_stats;

typedef struct fb_zmtp_server fb_zmtp_server;

/* The length of a routing id: a zero byte, the slot, the generation. */
#define FB_ZMTP_SERVER_ID_LEN 9

/* A server with no listener yet.  NULL with *err set to an errno (ENOMEM,
 * EMFILE, EINVAL for bad options, ENOSYS off Linux). */
fb_zmtp_server *fb_zmtp_server_new(const fb_zmtp_server_options *opts, int *err);
/* Listen on `addr` (a struct sockaddr of `addrlen` bytes: AF_INET,
 * AF_INET6 or AF_UNIX; port 0: the system picks).  0, or an errno
 * (EADDRINUSE: another socket listens there; a Unix socket file nobody
 * accepts on is replaced).  `bound` (room for *boundlen bytes) gets the
 * address as bound, *boundlen its length. */
int fb_zmtp_server_listen(fb_zmtp_server *s, const void *addr, size_t addrlen, void *bound, size_t *boundlen);
/* The same, for a listener that also takes Redis clients: a connection
 * whose first byte is not a ZMTP greeting's (0xFF) speaks RESP, and is
 * presented as a fastbus session (fb_resp_session.h): its routing id, its
 * requests as that session's messages (a HELLO first), the messages sent
 * to it translated into replies and push messages. */
int fb_zmtp_server_listen_resp(fb_zmtp_server *s, const void *addr, size_t addrlen, void *bound, size_t *boundlen);
/* The PUB just received (all its frames) was routed to `receivers` links
 * and `over` of its records were dropped over the size limits: a RESP
 * connection's PUBLISH is answered with that.  A no-op for other peers.
 * A driver calls it after routing each PUB, before its next receive. */
void fb_zmtp_server_routed(fb_zmtp_server *s, uint64_t receivers, uint64_t over);
/* A RESP connection whose session the broker ended (a slow consumer, as
 * Redis's output buffer limit): closed now, what was queued for it
 * dropped; 1 if it was.  A ZMTP peer is told (KICK), not closed (0), but
 * with `any`: one that takes nothing at all (a process stopped with its
 * connection open) would otherwise hold the kernel's buffers for good. */
int fb_zmtp_server_close_peer(fb_zmtp_server *s, const unsigned char *id, size_t len, int any);
/* Close every connection and listener: whole messages still queued get up
 * to linger_ms to leave.  The calls then fail with ENOTSOCK (whoever still
 * holds the server, a relay, finds it closed), until it is freed. */
void fb_zmtp_server_close(fb_zmtp_server *s, int linger_ms);
void fb_zmtp_server_free(fb_zmtp_server *s);

/* libzmq's calls (void *socket: an fb_zmtp_server). */
int fb_zmtp_server_send(void *s, const void *buf, size_t len, int flags);
int fb_zmtp_server_getsockopt(void *s, int option, void *value, size_t *len);
int fb_zmtp_server_msg_recv(fb_zmq_msg *msg, void *s, int flags);
const char *fb_zmtp_server_msg_gets(const fb_zmq_msg *msg, const char *property);

/* Close the connections that have not finished their handshake within
 * handshake_ns of being accepted (libzmq's ZMQ_HANDSHAKE_IVL: a peer that
 * connects and says nothing holds a descriptor, not forever); what such a
 * connection sent is read first.  Whoever drives the server calls it now
 * and then, between receives (it may read: the last received frames'
 * views end).  The number closed. */
int fb_zmtp_server_expire(fb_zmtp_server *s, uint64_t handshake_ns);
/* Is input already read into a connection's buffer (a receive may find a
 * message without the descriptor showing it)?  No syscall. */
int fb_zmtp_server_buffered(const fb_zmtp_server *s);
/* What was written to a connection and its peer has not taken yet: the
 * bytes queued here for it, and those in the kernel's send queue
 * (SIOCOUTQ: not sent, or not acknowledged).  A peer that reads, however
 * slowly, makes it fall; a stuck one leaves it where it is (the broker's
 * flow control tells the two apart by it).  -1: not a connection. */
int64_t fb_zmtp_server_unsent(const fb_zmtp_server *s, const unsigned char *id, size_t len);
/* The routing id (FB_ZMTP_SERVER_ID_LEN bytes into `id`) of a connection
 * that finished its handshake and is gone, once every whole message it
 * sent was received: returns FB_ZMTP_SERVER_ID_LEN, or 0 when none is left
 * to say.  libzmq's ROUTER says a peer left only when a send to it fails;
 * a driver that calls this after its receives learns it at once (a
 * subscriber's session starts to linger at the cut, not at the next
 * message or probe).  Oldest first; the last 65,536 are kept. */
int fb_zmtp_server_take_gone(fb_zmtp_server *s, unsigned char *id);
void fb_zmtp_server_get_stats(const fb_zmtp_server *s, fb_zmtp_server_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* FB_ZMTP_SERVER_H */
