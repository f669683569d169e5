/* fb_zmtp_server.c - see fb_zmtp_server.h.
 *
 * The server's connections live in slots (each its own allocation, so a
 * slot array that grows moves no connection).  A routing id names a slot
 * and its generation, which grows each time the slot is freed: a send to
 * a connection that left finds another generation and fails, as libzmq's
 * ROUTER_MANDATORY does, even once the slot is used again.
 *
 * Reading is fair and cheap: connections the epoll descriptor reports go
 * into a ring; a receive takes one from the ring, reads what the kernel
 * has for it, and gives one whole message; the connection goes back to the
 * ring's end only if more may be there (bytes left in its buffer, or a
 * read that filled all the room it had).  A connection whose kernel side
 * is drained leaves the ring, and the level-triggered descriptor brings it
 * back when more arrives.
 *
 * A connection that is lost keeps its slot, and the whole messages it had
 * read, until they are received: frames given out are views of its buffer,
 * which only a receive may free or move.
 *
 * (Over 700 lines because the server's slots, ring and epoll descriptor are
 * one structure the receive and send paths both maintain; the wire format
 * is fb_zmtp_wire.c.)
 */
#define _GNU_SOURCE
#include "fb_zmtp_server.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fb_resp_session.h"
#include "fb_zmtp.h"       /* zmq.h's values */
#include "fb_zmtp_wire.h"

#ifdef __linux__
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <linux/sockios.h>  /* SIOCOUTQ */
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fb_common.h"

#define READ_CHUNK 65536
#define FIRST_CHUNK 2048
#define MAX_LISTENERS 16
#define EVENTS_PER_WAIT 256
#define ID_LEN FB_ZMTP_SERVER_ID_LEN
/* epoll's data: a listener's index with this bit, else a slot's. */
#define LISTENER_TAG (1ull << 32)
/* A RESP connection stops reading requests while this much of its
 * replies waits for the kernel (a client that pipelines without reading
 * cannot grow the broker's memory). */
#define RESP_OUT_PAUSE (1u << 20)
#define MAX_FRAMES 8

enum { IN_READING, IN_WAITING, IN_OUT_FULL };   /* a RESP connection's input */

enum { C_FREE, C_HANDSHAKE, C_UP, C_LOST };

typedef struct conn {
    int state;
    int fd;
    uint32_t gen;
    fb_zbuf in, out;
    size_t out_end;              /* [out.off, out_end): whole messages (and our greeting) to write */
    int out_msgs;                /* whole messages in `out` not yet wholly written */
    int got_greeting;
    int watch_out;               /* EPOLLOUT is asked (bytes wait for room) */
    int in_ring;
    int was_up;                  /* finished its handshake: its loss is reported (fb_zmtp_server_take_gone) */
    int sniff;                   /* accepted on a RESP listener: its first byte says ZMTP (0xFF) or RESP */
    fb_resp_session *resp;       /* a Redis client's connection (fb_resp_session.h), else NULL */
    int in_state;                /* ... its input: IN_* */
    int close_after;             /* close once `out` is written (QUIT, a protocol error, a KICK) */
    fb_zbuf frames;              /* frames of a message being sent to it: [u64 n][n bytes]... */
    uint32_t events;             /* what epoll watches on fd */
    int more_in_kernel;          /* the last read filled all its room: more may wait */
    uint64_t since_ns;           /* accepted at (fb_now_ns) */
    char peer[INET6_ADDRSTRLEN]; /* "" for a Unix socket */
} conn;

struct fb_zmtp_server {
    fb_zmtp_server_options o;
    int efd;
    int lfd[MAX_LISTENERS];
    int lresp[MAX_LISTENERS];    /* that listener also takes Redis clients (RESP) */
    int nlisteners;
    int accept_paused;           /* out of descriptors: listeners are not watched until one closes */

    conn **slots;
    uint32_t nslots, cap;
    uint32_t *free_slots;        /* a stack of free slot indices */
    uint32_t nfree;

    uint32_t *ring;              /* slots to look at for input (room for every slot) */
    uint32_t ring_head, ring_count;
    uint32_t round_left;         /* pops until the descriptor is looked at again */

    /* The message being received: its connection, frames still to give. */
    uint32_t cur;
    int frames_left, id_next, rcvmore;
    unsigned char id[ID_LEN];

    conn *sending;               /* the connection a message being sent goes to (NULL: next frame is an id) */
    uint32_t sending_slot;
    int send_skip;               /* ... that message is dropped (no memory, or the peer left meanwhile) */

    int closed;
    fb_zmtp_server_stats st;
    /* Routing ids (slot << 32 | generation) of handshaken connections
     * lost and wholly received, oldest first, for fb_zmtp_server_take_gone:
     * a ring of gone_cap; past GONE_MAX the oldest is forgotten (its peer
     * is then found gone at the next send, as libzmq's would be). */
    uint64_t *gone;
    uint32_t gone_head, gone_count, gone_cap;
};

#define GONE_MAX 65536u

/* -- slots and the ring --------------------------------------------------------- */

static void ring_push(fb_zmtp_server *s, uint32_t k)
{
    conn *c = s->slots[k];
    if (c->in_ring) return;
    c->in_ring = 1;
    s->ring[(s->ring_head + s->ring_count) % s->cap] = k;
    s->ring_count++;
}

static uint32_t ring_pop(fb_zmtp_server *s)
{
    uint32_t k = s->ring[s->ring_head];
    s->ring_head = (s->ring_head + 1) % s->cap;
    s->ring_count--;
    s->slots[k]->in_ring = 0;
    return k;
}

/* A free slot's index, the arrays grown if need be (UINT32_MAX: no memory). */
static uint32_t slot_take(fb_zmtp_server *s)
{
    if (s->nfree) return s->free_slots[--s->nfree];
    if (s->nslots == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 64;
        conn **slots = realloc(s->slots, cap * sizeof *slots);
        if (!slots) return UINT32_MAX;
        s->slots = slots;
        uint32_t *fr = realloc(s->free_slots, cap * sizeof *fr);
        if (!fr) return UINT32_MAX;
        s->free_slots = fr;
        uint32_t *ring = malloc(cap * sizeof *ring);
        if (!ring) return UINT32_MAX;
        for (uint32_t i = 0; i < s->ring_count; i++) ring[i] = s->ring[(s->ring_head + i) % s->cap];
        free(s->ring);
        s->ring = ring;
        s->ring_head = 0;
        s->cap = cap;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c) return UINT32_MAX;
    c->fd = -1;
    s->slots[s->nslots] = c;
    return s->nslots++;
}

static void watch_listeners(fb_zmtp_server *s, int on)
{
    for (int i = 0; i < s->nlisteners; i++) {
        struct epoll_event ev;
        memset(&ev, 0, sizeof ev);
        ev.events = EPOLLIN;
        ev.data.u64 = LISTENER_TAG | (uint64_t)i;
        epoll_ctl(s->efd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, s->lfd[i], &ev);
    }
    s->accept_paused = !on;
}

/* A lost connection whose messages were all received (and that the ring
 * does not hold): its slot is free, and its routing id names nothing any
 * more. */
static void gone_push(fb_zmtp_server *s, uint32_t k, uint32_t gen)
{
    if (s->gone_count == s->gone_cap) {
        if (s->gone_cap >= GONE_MAX) {                       /* forget the oldest */
            s->gone_head = (s->gone_head + 1) % s->gone_cap;
            s->gone_count--;
        } else {
            uint32_t cap = s->gone_cap ? s->gone_cap * 2 : 64;
            uint64_t *g = malloc(cap * sizeof *g);
            if (!g) return;                                  /* (found at the next send instead) */
            for (uint32_t i = 0; i < s->gone_count; i++) g[i] = s->gone[(s->gone_head + i) % s->gone_cap];
            free(s->gone);
            s->gone = g;
            s->gone_head = 0;
            s->gone_cap = cap;
        }
    }
    s->gone[(s->gone_head + s->gone_count) % s->gone_cap] = ((uint64_t)k << 32) | gen;
    s->gone_count++;
}

static void slot_free(fb_zmtp_server *s, uint32_t k)
{
    conn *c = s->slots[k];
    if (c->was_up) gone_push(s, k, c->gen);
    fb_zbuf_free(&c->in);
    fb_zbuf_free(&c->out);
    fb_zbuf_free(&c->frames);
    fb_resp_session_free(c->resp);
    uint32_t gen = c->gen + 1;
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->gen = gen;
    c->state = C_FREE;
    s->free_slots[s->nfree++] = k;
}

static conn *lookup(const fb_zmtp_server *s, const unsigned char *id, size_t len, uint32_t *slot)
{
    if (len != ID_LEN || id[0] != 0) return NULL;
    uint32_t k = ((uint32_t)id[1] << 24) | ((uint32_t)id[2] << 16) | ((uint32_t)id[3] << 8) | id[4];
    uint32_t gen = ((uint32_t)id[5] << 24) | ((uint32_t)id[6] << 16) | ((uint32_t)id[7] << 8) | id[8];
    if (k >= s->nslots || s->slots[k]->gen != gen) return NULL;
    if (slot) *slot = k;
    return s->slots[k];
}

static void make_id(unsigned char *id, uint32_t k, uint32_t gen)
{
    id[0] = 0;
    for (int i = 0; i < 4; i++) {
        id[1 + i] = (unsigned char)(k >> (24 - 8 * i));
        id[5 + i] = (unsigned char)(gen >> (24 - 8 * i));
    }
}

/* -- a connection ------------------------------------------------------------------ */

/* Where the last whole message in c's input ends: what a lost connection
 * leaves to be received. */
static size_t whole_messages_end(const fb_zmtp_server *s, const conn *c)
{
    if (!c->got_greeting) return c->in.off;
    return c->in.off + fb_zmtp_whole_end(c->in.p + c->in.off, c->in.len - c->in.off, 0, s->o.max_msg_bytes);
}

/* The connection is gone: close it; what it read whole stays to be
 * received (its slot is freed once that is done: the ring brings it to a
 * receive). */
static void lost(fb_zmtp_server *s, uint32_t k, int protocol_error)
{
    conn *c = s->slots[k];
    if (c->state == C_LOST || c->state == C_FREE) return;
    epoll_ctl(s->efd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    s->st.disconnects++;
    s->st.connections--;
    if (protocol_error) s->st.protocol_errors++;
    s->st.dropped_messages += (uint64_t)c->out_msgs;
    fb_zbuf_free(&c->out);
    c->out_end = 0;
    c->out_msgs = 0;
    /* (A RESP connection's unparsed requests cannot be answered any more.) */
    c->in.len = c->state == C_UP && !c->resp ? whole_messages_end(s, c) : c->in.off;
    c->state = C_LOST;
    c->more_in_kernel = 0;
    ring_push(s, k);
    if (s->accept_paused) watch_listeners(s, 1);   /* a descriptor is free again */
}

/* What epoll watches on c's descriptor: input unless a RESP connection's
 * input is paused (level-triggered: unread input would wake the poll for
 * ever), room to write while bytes wait. */
static void rewatch(fb_zmtp_server *s, uint32_t k)
{
    conn *c = s->slots[k];
    if (c->fd < 0) return;
    uint32_t want = (c->in_state == IN_READING ? EPOLLIN | EPOLLRDHUP : 0) | (c->watch_out ? EPOLLOUT : 0);
    if (want == c->events) return;
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = want;
    ev.data.u64 = k;
    if (epoll_ctl(s->efd, EPOLL_CTL_MOD, c->fd, &ev) == 0) c->events = want;
}

static void watch_out(fb_zmtp_server *s, uint32_t k, int on)
{
    s->slots[k]->watch_out = on;
    rewatch(s, k);
}

/* A RESP connection reads requests again: what its buffer holds is parsed
 * at its turn. */
static void resume_input(fb_zmtp_server *s, uint32_t k)
{
    conn *c = s->slots[k];
    if (c->in_state == IN_READING) return;
    c->in_state = IN_READING;
    rewatch(s, k);
    ring_push(s, k);
}

/* Write c's whole messages: 0, or -1 if the connection was lost. */
static int flush(fb_zmtp_server *s, uint32_t k)
{
    conn *c = s->slots[k];
    if (c->fd < 0) return -1;
    while (c->out.off < c->out_end) {
        ssize_t w = send(c->fd, c->out.p + c->out.off, c->out_end - c->out.off, MSG_NOSIGNAL | MSG_DONTWAIT);
        s->st.syscalls_send++;
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                watch_out(s, k, 1);              /* wake a poller when there is room */
                return 0;
            }
            lost(s, k, 0);
            return -1;
        }
        c->out.off += (size_t)w;
    }
    c->out_msgs = 0;
    if (c->out_end == c->out.len) c->out.off = c->out.len = c->out_end = 0;
    watch_out(s, k, 0);
    if (c->close_after) {
        lost(s, k, 0);
        return -1;
    }
    if (c->in_state == IN_OUT_FULL) resume_input(s, k);
    return 0;
}

/* Read what the kernel has for c (room for at least `want` more bytes):
 * 1 if bytes came, 0 if none, -1 if the connection was lost. */
static int fill(fb_zmtp_server *s, uint32_t k, size_t want)
{
    conn *c = s->slots[k];
    /* A RESP connection starts with a small buffer (many idle Redis
     * clients, or ones that sent half a request, cost little); one whose
     * read fills it gets the full chunk. */
    size_t floor = (c->resp || c->sniff) && c->in.cap < READ_CHUNK && !c->more_in_kernel ? FIRST_CHUNK : READ_CHUNK;
    if (want < floor) want = floor;
    if (c->in.off == c->in.len && c->in.cap > 16 * READ_CHUNK && want <= READ_CHUNK)
        fb_zbuf_free(&c->in);                    /* after a large message: give it back */
    if (fb_zbuf_reserve(&c->in, want) < 0) {
        lost(s, k, 1);                           /* no memory for it: as if it were bad */
        return -1;
    }
    size_t room = c->in.cap - c->in.len;
    ssize_t r;
    do r = recv(c->fd, c->in.p + c->in.len, room, MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    s->st.syscalls_recv++;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        c->more_in_kernel = 0;
        return 0;
    }
    if (r <= 0) {
        lost(s, k, 0);
        return -1;
    }
    c->in.len += (size_t)r;
    c->more_in_kernel = (size_t)r == room;
    return 1;
}

/* READY from a socket type a ROUTER talks to (ZMTP's table). */
static int peer_type_ok(const unsigned char *body, uint64_t size)
{
    const unsigned char *t;
    size_t n;
    if (!fb_zmtp_ready_type(body, size, &t, &n)) return 0;
    return (n == 6 && (memcmp(t, "DEALER", 6) == 0 || memcmp(t, "ROUTER", 6) == 0)) ||
           (n == 3 && memcmp(t, "REQ", 3) == 0);
}

/* A command from the peer (already consumed).  0, or -1: the connection
 * was closed for it. */
static int on_command(fb_zmtp_server *s, uint32_t k, const unsigned char *body, uint64_t size)
{
    conn *c = s->slots[k];
    if (c->state == C_HANDSHAKE) {
        if (fb_zmtp_is_command(body, size, "READY") && peer_type_ok(body, size)) {
            c->state = C_UP;
            c->was_up = 1;
            return 0;
        }
        lost(s, k, !fb_zmtp_is_command(body, size, "ERROR"));
        return -1;
    }
    unsigned char f[32];
    size_t n = fb_zmtp_pong(f, body, size);
    if (n) {
        /* Between whole messages: before one still being sent (none is,
         * while a receive runs, but the order costs nothing to keep). */
        if (fb_zbuf_insert(&c->out, &c->out_end, f, n) < 0) return 0;
        return flush(s, k);
    }
    return 0;                                    /* PONG, and what later versions add: ignored */
}

/* A RESP connection's next message for the broker: its requests parsed
 * (fb_resp_session.h answers what it can itself, into `out`) until one is
 * the broker's.  1: a message is ready; 0: not now.  Replies are written
 * once no more requests are at hand (one send for a pipeline). */
static int resp_ready(fb_zmtp_server *s, uint32_t k)
{
    conn *c = s->slots[k];
    for (;;) {
        if (c->state != C_UP) return 0;          /* (lost: nothing it sent can be answered) */
        if (c->close_after) {
            flush(s, k);
            return 0;
        }
        if (c->out.len - c->out.off > RESP_OUT_PAUSE) {
            if (flush(s, k) < 0) return 0;
            if (c->out.len - c->out.off > RESP_OUT_PAUSE) {
                c->in_state = IN_OUT_FULL;       /* until flush finds room for it all */
                rewatch(s, k);
                return 0;
            }
        }
        size_t used = 0;
        int rc = fb_resp_session_input(c->resp, c->in.p + c->in.off, c->in.len - c->in.off, &used, &c->out);
        c->in.off += used;
        c->out_end = c->out.len;
        switch (rc) {
        case FB_RESP_MESSAGE:
            return 1;
        case FB_RESP_MORE:
            break;
        case FB_RESP_WAIT:
            c->in_state = IN_WAITING;            /* until the broker's answer (send) */
            rewatch(s, k);
            flush(s, k);
            return 0;
        case FB_RESP_CLOSE:
            c->close_after = 1;
            if (c->out.off == c->out.len) lost(s, k, 0);
            else flush(s, k);
            return 0;
        case FB_RESP_YIELD:
            if (flush(s, k) == 0) ring_push(s, k);
            return 0;
        default:                                 /* no memory: as if it were bad */
            lost(s, k, 1);
            return 0;
        }
        int got = fill(s, k, 0);
        if (got > 0) continue;
        if (got == 0) flush(s, k);               /* nothing more at hand: the replies go */
        return 0;
    }
}

/* The first byte from a connection accepted on a RESP listener: a ZMTP
 * peer's greeting starts with 0xFF, a Redis client's request never does. */
static void sniffed(fb_zmtp_server *s, uint32_t k)
{
    conn *c = s->slots[k];
    c->sniff = 0;
    if (c->in.p[c->in.off] == 0xFF) {
        unsigned char g[FB_ZMTP_GREETING];
        fb_zmtp_greeting(g, 1);
        if (fb_zbuf_put(&c->out, g, sizeof g) < 0 || fb_zmtp_put_ready(&c->out, "ROUTER") < 0) {
            lost(s, k, 1);
            return;
        }
        c->out_end = c->out.len;
        flush(s, k);
        return;
    }
    c->resp = fb_resp_session_new(s->o.max_msg_bytes, s->o.resp_auth_required);
    if (!c->resp) {
        lost(s, k, 1);
        return;
    }
    c->state = C_UP;                             /* (its HELLO is the first message: no handshake) */
    c->was_up = 1;
    s->st.resp_accepted++;
}

/* Is a whole message at the front of c's input (commands before it
 * handled and consumed)?  Reads from the kernel while one is not.  1: yes;
 * 0: not now (or the connection is gone). */
static int message_ready(fb_zmtp_server *s, uint32_t k)
{
    conn *c = s->slots[k];
    for (;;) {
        size_t need = 0, body = 0;
        uint64_t size = 0;
        if (c->resp) return resp_ready(s, k);
        if (c->sniff && c->state == C_HANDSHAKE && c->in.len > c->in.off) {
            sniffed(s, k);
            continue;
        }
        if (c->state == C_LOST) {
            /* Whole messages (checked when it was lost); commands are of
             * no more use. */
            c->in.off += fb_zmtp_skip_commands(c->in.p + c->in.off, c->in.len - c->in.off);
            return c->in.off < c->in.len;
        }
        if (!c->got_greeting) {
            if (c->in.len - c->in.off >= FB_ZMTP_GREETING) {
                if (!fb_zmtp_greeting_ok(c->in.p + c->in.off)) {
                    lost(s, k, 1);
                    continue;
                }
                c->in.off += FB_ZMTP_GREETING;
                c->got_greeting = 1;
                continue;
            }
        } else {
            const unsigned char *p = c->in.p + c->in.off;
            switch (fb_zmtp_next(p, c->in.len - c->in.off, c->state == C_UP, s->o.max_msg_bytes, &body, &size, &need)) {
            case FB_ZMTP_MESSAGE:
                return 1;
            case FB_ZMTP_COMMAND:
                c->in.off += body + (size_t)size;
                on_command(s, k, p + body, size);      /* (a connection it closes: the next turn says so) */
                continue;
            case FB_ZMTP_BAD:
                lost(s, k, 1);
                continue;
            }
        }
        if (fill(s, k, need) <= 0) {
            if (c->state == C_LOST) continue;
            return 0;
        }
    }
}

/* -- accepting ------------------------------------------------------------------ */

static void accept_all(fb_zmtp_server *s, int li)
{
    int lfd = s->lfd[li];
    for (;;) {
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        int fd = accept4(lfd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                watch_listeners(s, 0);           /* until a connection closes */
            return;
        }
        uint32_t k = slot_take(s);
        if (k == UINT32_MAX) {
            close(fd);
            return;
        }
        conn *c = s->slots[k];
        int one = 1;
        if (a.ss_family == AF_INET || a.ss_family == AF_INET6) {
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (s->o.keepalive_idle_s > 0) {
                setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
                setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &s->o.keepalive_idle_s, sizeof(int));
                if (s->o.keepalive_intvl_s > 0)
                    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &s->o.keepalive_intvl_s, sizeof(int));
                if (s->o.keepalive_cnt > 0)
                    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &s->o.keepalive_cnt, sizeof(int));
            }
            const void *ip = a.ss_family == AF_INET ? (const void *)&((struct sockaddr_in *)&a)->sin_addr
                                                    : (const void *)&((struct sockaddr_in6 *)&a)->sin6_addr;
            if (!inet_ntop(a.ss_family, ip, c->peer, sizeof c->peer)) c->peer[0] = 0;
        }
        if (s->o.sndbuf > 0) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &s->o.sndbuf, sizeof(int));
        if (s->o.rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &s->o.rcvbuf, sizeof(int));
        unsigned char g[FB_ZMTP_GREETING];
        fb_zmtp_greeting(g, 1);
        struct epoll_event ev;
        memset(&ev, 0, sizeof ev);
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.u64 = k;
        /* On a RESP listener our greeting waits for the peer's first byte
         * (a Redis client speaks first, and would take ours for a reply). */
        c->sniff = s->lresp[li];
        if ((!c->sniff && (fb_zbuf_put(&c->out, g, sizeof g) < 0 || fb_zmtp_put_ready(&c->out, "ROUTER") < 0))
            || epoll_ctl(s->efd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            close(fd);
            fb_zbuf_free(&c->out);
            slot_free(s, k);
            continue;
        }
        c->events = ev.events;
        c->fd = fd;
        c->state = C_HANDSHAKE;
        c->since_ns = fb_now_ns();
        c->out_end = c->out.len;
        s->st.accepted++;
        s->st.connections++;
        flush(s, k);
    }
}

/* Take in what the descriptor reports: accept, write what has room, and
 * put connections with input in the ring (read by a receive). */
static void service(fb_zmtp_server *s)
{
    struct epoll_event ev[EVENTS_PER_WAIT];
    int n = epoll_wait(s->efd, ev, EVENTS_PER_WAIT, 0);
    s->st.syscalls_poll++;
    for (int i = 0; i < n; i++) {
        uint64_t d = ev[i].data.u64;
        if (d & LISTENER_TAG) {
            if (!s->accept_paused) accept_all(s, (int)(d & 0xffffffffu));
            continue;
        }
        uint32_t k = (uint32_t)d;
        if (k >= s->nslots || s->slots[k]->fd < 0) continue;
        if ((ev[i].events & EPOLLOUT) && flush(s, k) < 0) continue;
        if (ev[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) ring_push(s, k);
    }
}

/* The slot of a connection with a whole message at the front of its
 * input, or UINT32_MAX: connections taken in turn from the ring; lost
 * ones whose messages were all received are freed on the way.  The
 * descriptor is looked at (service) when the ring is empty and once every
 * round of it: a peer that always has more to send must not keep the
 * others' input, their room to write and new connections waiting. */
static uint32_t next_message(fb_zmtp_server *s)
{
    int serviced = 0;
    for (;;) {
        if (!s->ring_count || !s->round_left) {
            if (serviced && !s->ring_count) return UINT32_MAX;
            if (!serviced) {
                service(s);
                serviced = 1;
            }
            s->round_left = s->ring_count;
            continue;
        }
        s->round_left--;
        uint32_t k = ring_pop(s);
        if (message_ready(s, k)) return k;
        /* (A connection lost just now is back in the ring: freed when
         * its turn comes, never while the ring holds its index.) */
        if (s->slots[k]->state == C_LOST && !s->slots[k]->in_ring) slot_free(s, k);
    }
}

/* -- the calls --------------------------------------------------------------------- */

fb_zmtp_server *fb_zmtp_server_new(const fb_zmtp_server_options *opts, int *err)
{
    if (!opts || opts->sndhwm < 1 || opts->max_msg_bytes == 0) {
        *err = EINVAL;
        return NULL;
    }
    fb_zmtp_server *s = calloc(1, sizeof *s);
    if (!s) {
        *err = ENOMEM;
        return NULL;
    }
    s->o = *opts;
    s->efd = epoll_create1(EPOLL_CLOEXEC);
    if (s->efd < 0) {
        *err = errno;
        free(s);
        return NULL;
    }
    return s;
}

/* A Unix socket file that nobody accepts on (left by a process that
 * died): it may be replaced. */
static int stale_unix_socket(const void *addr, size_t addrlen)
{
    const struct sockaddr_un *un = addr;
    if (addrlen <= sizeof(sa_family_t) || un->sun_path[0] == 0) return 0;   /* abstract: never a file */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    int refused = connect(fd, addr, (socklen_t)addrlen) < 0 && errno == ECONNREFUSED;
    close(fd);
    return refused && unlink(un->sun_path) == 0;
}

static int listen_on(fb_zmtp_server *s, const void *addr, size_t addrlen, void *bound, size_t *boundlen, int resp);

int fb_zmtp_server_listen(fb_zmtp_server *s, const void *addr, size_t addrlen, void *bound, size_t *boundlen)
{
    return listen_on(s, addr, addrlen, bound, boundlen, 0);
}

int fb_zmtp_server_listen_resp(fb_zmtp_server *s, const void *addr, size_t addrlen, void *bound, size_t *boundlen)
{
    return listen_on(s, addr, addrlen, bound, boundlen, 1);
}

/* How many connections the kernel completes before the relay accepts them.
 * A storm of connects (every client of a restarted broker reconnecting at
 * once, 10,000 Redis clients opened together) fills a short queue while the
 * relay is busy with a turn, and the kernel then drops SYNs: each dropped one
 * costs its client a 1 s, then 3 s, retransmit.  Redis's tcp-backlog is 511;
 * the kernel caps this at net.core.somaxconn (4096 on current kernels). */
#define LISTEN_BACKLOG 4096

static int listen_on(fb_zmtp_server *s, const void *addr, size_t addrlen, void *bound, size_t *boundlen, int resp)
{
    if (!s || s->closed) return ENOTSOCK;
    if (!addr || addrlen < sizeof(sa_family_t) || addrlen > sizeof(struct sockaddr_storage)) return EINVAL;
    if (s->nlisteners == MAX_LISTENERS) return EMFILE;
    int family = ((const struct sockaddr *)addr)->sa_family;
    if (family != AF_INET && family != AF_INET6 && family != AF_UNIX) return EAFNOSUPPORT;
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno;
    int one = 1;
    if (family != AF_UNIX) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc = bind(fd, addr, (socklen_t)addrlen);
    if (rc < 0 && errno == EADDRINUSE && family == AF_UNIX && stale_unix_socket(addr, addrlen))
        rc = bind(fd, addr, (socklen_t)addrlen);
    if (rc < 0 || listen(fd, LISTEN_BACKLOG) < 0) {
        int e = errno;
        close(fd);
        return e;
    }
    if (bound && boundlen) {
        socklen_t bl = (socklen_t)*boundlen;
        if (getsockname(fd, bound, &bl) < 0) bl = 0;
        *boundlen = bl;
    }
    int i = s->nlisteners++;
    s->lfd[i] = fd;
    s->lresp[i] = resp;
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.u64 = LISTENER_TAG | (uint64_t)i;
    if (!s->accept_paused && epoll_ctl(s->efd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        int e = errno;
        close(fd);
        s->nlisteners--;
        return e;
    }
    return 0;
}

void fb_zmtp_server_close(fb_zmtp_server *s, int linger_ms)
{
    if (!s || s->closed) return;
    for (int i = 0; i < s->nlisteners; i++) close(s->lfd[i]);
    s->nlisteners = 0;
    if (linger_ms > 0) {
        uint64_t until = fb_now_ns() + (uint64_t)linger_ms * 1000000u;
        for (;;) {
            int waiting = 0;
            for (uint32_t k = 0; k < s->nslots; k++) {
                conn *c = s->slots[k];
                if (c->state == C_UP && c->out.off < c->out_end && flush(s, k) == 0 && c->out.off < c->out_end)
                    waiting = 1;
            }
            uint64_t now = fb_now_ns();
            if (!waiting || now >= until) break;
            struct pollfd p = {s->efd, POLLIN, 0};
            int ms = (int)((until - now) / 1000000u) + 1;
            poll(&p, 1, ms > 10 ? 10 : ms);
        }
    }
    for (uint32_t k = 0; k < s->nslots; k++) {
        conn *c = s->slots[k];
        if (c->fd >= 0) close(c->fd);
        fb_zbuf_free(&c->in);
        fb_zbuf_free(&c->out);
        fb_zbuf_free(&c->frames);
        fb_resp_session_free(c->resp);
        free(c);
    }
    close(s->efd);
    s->efd = -1;
    free(s->slots);
    free(s->free_slots);
    free(s->ring);
    free(s->gone);
    s->gone = NULL;
    s->gone_head = s->gone_count = s->gone_cap = 0;
    s->slots = NULL;
    s->free_slots = s->ring = NULL;
    s->nslots = s->cap = s->nfree = s->ring_count = 0;
    s->sending = NULL;
    s->frames_left = 0;
    s->closed = 1;
}

void fb_zmtp_server_free(fb_zmtp_server *s)
{
    if (!s) return;
    fb_zmtp_server_close(s, 0);
    free(s);
}

/* A frame of a message to a RESP connection: the frames are kept until
 * the last, then the whole message is translated (fb_resp_session_deliver)
 * into its replies.  0, or -1 with errno. */
static int send_resp(fb_zmtp_server *s, conn *c, const void *buf, size_t len, int flags)
{
    uint32_t k = s->sending_slot;
    if (flags & FB_ZMTP_SNDMORE) {
        uint64_t n = len;
        if (!s->send_skip && (fb_zbuf_put(&c->frames, &n, sizeof n) < 0 || fb_zbuf_put(&c->frames, buf, len) < 0))
            s->send_skip = 1;
        return 0;
    }
    s->sending = NULL;
    fb_resp_frame f[MAX_FRAMES];
    int nf = 0;
    const unsigned char *q = c->frames.p + c->frames.off, *end = c->frames.p + c->frames.len;
    while (q < end && nf < MAX_FRAMES - 1) {
        uint64_t n;
        memcpy(&n, q, sizeof n);
        f[nf].p = q + sizeof n;
        f[nf].n = (size_t)n;
        nf++;
        q += sizeof n + n;
    }
    f[nf].p = buf;
    f[nf].n = len;
    nf++;
    int rc = s->send_skip || c->state != C_UP ? 0 : fb_resp_session_deliver(c->resp, f, nf, &c->out);
    c->frames.off = c->frames.len = 0;
    if (s->send_skip) {
        s->st.dropped_messages++;
        return 0;
    }
    if (c->state != C_UP) return 0;
    c->out_end = c->out.len;
    c->out_msgs++;
    if (rc == FB_ENOMEM) {
        lost(s, k, 1);
        return 0;
    }
    if (rc == FB_RESP_CLOSE) c->close_after = 1;
    if (rc == FB_RESP_RESUME) resume_input(s, k);
    if (c->out.off == c->out.len && c->close_after) lost(s, k, 0);
    else flush(s, k);
    return 0;
}

int fb_zmtp_server_send(void *sock, const void *buf, size_t len, int flags)
{
    fb_zmtp_server *s = sock;
    int r = len > INT32_MAX ? INT32_MAX : (int)len;
    if (!s || s->closed) {
        errno = ENOTSOCK;
        return -1;
    }
    if (!s->sending) {                           /* a routing id */
        uint32_t k = 0;
        conn *c = lookup(s, buf, len, &k);
        if (!c || c->state != C_UP) {
            errno = EHOSTUNREACH;
            return -1;
        }
        if (!(flags & FB_ZMTP_SNDMORE)) return r;   /* an id alone: nothing to send (as libzmq) */
        if (c->out_msgs >= s->o.sndhwm) {
            flush(s, k);                         /* room now? */
            if (c->state != C_UP) {
                errno = EHOSTUNREACH;
                return -1;
            }
            if (c->out_msgs >= s->o.sndhwm) {
                errno = EAGAIN;
                return -1;
            }
        }
        s->sending = c;
        s->sending_slot = k;
        s->send_skip = 0;
        return r;
    }
    conn *c = s->sending;
    if (c->state != C_UP) s->send_skip = 1;      /* lost while the message was being given */
    if (c->resp) return send_resp(s, c, buf, len, flags) < 0 ? -1 : r;
    if (!s->send_skip) {
        unsigned char h[9];
        size_t hl = fb_zmtp_frame_header(h, (flags & FB_ZMTP_SNDMORE) ? 1 : 0, len);
        size_t before = c->out.off;
        if (fb_zbuf_reserve(&c->out, hl + len) < 0) {
            s->send_skip = 1;
            c->out.len = c->out_end;             /* the frames given so far go too */
        } else {
            c->out_end -= before - c->out.off;
            fb_zbuf_put(&c->out, h, hl);
            fb_zbuf_put(&c->out, buf, len);
        }
    }
    if (!(flags & FB_ZMTP_SNDMORE)) {
        s->sending = NULL;
        if (s->send_skip) {
            if (c->state == C_UP) c->out.len = c->out_end;
            s->st.dropped_messages++;
        } else {
            c->out_end = c->out.len;
            c->out_msgs++;
            flush(s, s->sending_slot);
        }
    }
    return r;
}

int fb_zmtp_server_getsockopt(void *sock, int option, void *value, size_t *len)
{
    fb_zmtp_server *s = sock;
    if (!s || s->closed || !value || !len || *len < sizeof(int)) {
        errno = s && !s->closed ? EINVAL : ENOTSOCK;
        return -1;
    }
    int v = 0;
    if (option == FB_ZMTP_FD) {
        v = s->efd;
    } else if (option == FB_ZMTP_RCVMORE) {
        v = s->rcvmore;
    } else if (option == FB_ZMTP_EVENTS) {
        service(s);
        if (s->frames_left || s->ring_count) v |= FB_ZMTP_POLLIN;
        v |= FB_ZMTP_POLLOUT;                    /* (a ROUTER's: per peer, said by send) */
    } else {
        errno = EINVAL;
        return -1;
    }
    memcpy(value, &v, sizeof v);
    *len = sizeof v;
    return 0;
}

int fb_zmtp_server_msg_recv(fb_zmq_msg *msg, void *sock, int flags)
{
    (void)flags;
    fb_zmtp_server *s = sock;
    fb_zmtp_view *m = (fb_zmtp_view *)msg;
    if (!s || s->closed) {
        errno = ENOTSOCK;
        return -1;
    }
    if (!s->frames_left) {
        uint32_t k = next_message(s);
        if (k == UINT32_MAX) {
            errno = EAGAIN;
            return -1;
        }
        s->cur = k;
        s->frames_left = 1;
        make_id(s->id, k, s->slots[k]->gen);
        m->data = s->id;
        m->size = ID_LEN;
        m->more = 1;
        m->peer = s->slots[k]->peer[0] ? s->slots[k]->peer : NULL;
        s->rcvmore = 1;
        return ID_LEN;
    }
    conn *c = s->slots[s->cur];
    if (c->resp) {                               /* the message its session made */
        const unsigned char *p = NULL;
        size_t n = 0;
        int more = fb_resp_session_frame(c->resp, &p, &n);
        m->data = (void *)p;
        m->size = n;
        m->more = more == 1;
        m->peer = c->peer[0] ? c->peer : NULL;
        s->rcvmore = m->more;
        s->frames_left = m->more;
        if (!m->more) ring_push(s, s->cur);      /* its next request's turn */
        return (int)n;
    }
    /* A whole message is here (message_ready checked every header). */
    int f = 0;
    size_t hl = 0;
    uint64_t size = 0;
    fb_zmtp_parse_header(c->in.p + c->in.off, c->in.len - c->in.off, &f, &hl, &size);
    m->data = c->in.p + c->in.off + hl;
    m->size = (size_t)size;
    m->more = f & 1;
    m->peer = c->peer[0] ? c->peer : NULL;
    c->in.off += hl + (size_t)size;
    s->rcvmore = m->more;
    s->frames_left = m->more;
    if (!m->more && (c->in.off < c->in.len || c->more_in_kernel || c->state == C_LOST))
        ring_push(s, s->cur);                    /* more may be there: its turn comes again */
    return size > INT32_MAX ? INT32_MAX : (int)size;
}

const char *fb_zmtp_server_msg_gets(const fb_zmq_msg *msg, const char *property)
{
    const fb_zmtp_view *m = (const fb_zmtp_view *)msg;
    if (strcmp(property, "Peer-Address") == 0) return m->peer;
    errno = EINVAL;
    return NULL;
}

int fb_zmtp_server_expire(fb_zmtp_server *s, uint64_t handshake_ns)
{
    if (!s || s->closed) return 0;
    uint64_t now = fb_now_ns();
    int n = 0;
    for (uint32_t k = 0; k < s->nslots; k++) {
        conn *c = s->slots[k];
        /* (A connection to a RESP listener that has said nothing yet may be
         * a Redis client's pooled one: Redis keeps those.) */
        if (c->state != C_HANDSHAKE || c->sniff || now - c->since_ns < handshake_ns) continue;
        /* What it sent may be waiting unread (no receive since): take it
         * in first; a message that is then whole waits in the ring. */
        if (message_ready(s, k)) ring_push(s, k);
        if (c->state == C_HANDSHAKE) {
            lost(s, k, 0);
            s->st.handshake_timeouts++;
            n++;
        }
    }
    return n;
}

int fb_zmtp_server_close_peer(fb_zmtp_server *s, const unsigned char *id, size_t len, int any)
{
    uint32_t k = 0;
    conn *c = s && !s->closed ? lookup(s, id, len, &k) : NULL;
    if (!c || (!c->resp && !any) || c->state != C_UP || s->sending == c) return 0;
    /* Reset, not a graceful close: what the kernel still holds for a
     * client too slow to read it would otherwise trickle out first. */
    struct linger lg = {1, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    lost(s, k, 0);
    return 1;
}

void fb_zmtp_server_routed(fb_zmtp_server *s, uint64_t receivers, uint64_t over)
{
    if (!s || s->closed || s->frames_left || s->cur >= s->nslots) return;
    conn *c = s->slots[s->cur];
    if (!c->resp || c->state != C_UP) return;
    fb_resp_session_routed(c->resp, receivers, over, &c->out);
    c->out_end = c->out.len;                     /* (written with what its next requests get: resp_ready) */
}

int fb_zmtp_server_take_gone(fb_zmtp_server *s, unsigned char *id)
{
    if (!s->gone_count) return 0;
    uint64_t v = s->gone[s->gone_head];
    s->gone_head = (s->gone_head + 1) % s->gone_cap;
    s->gone_count--;
    make_id(id, (uint32_t)(v >> 32), (uint32_t)v);
    return FB_ZMTP_SERVER_ID_LEN;
}

int fb_zmtp_server_buffered(const fb_zmtp_server *s)
{
    return s && !s->closed && (s->frames_left || s->ring_count);
}

int64_t fb_zmtp_server_unsent(const fb_zmtp_server *s, const unsigned char *id, size_t len)
{
    if (!s || s->closed) return -1;
    const conn *c = lookup(s, id, len, NULL);
    if (!c || c->fd < 0) return -1;
    int queued = 0;
    if (ioctl(c->fd, SIOCOUTQ, &queued) < 0) queued = 0;
    return (int64_t)(c->out.len - c->out.off) + (queued > 0 ? queued : 0);
}

void fb_zmtp_server_get_stats(const fb_zmtp_server *s, fb_zmtp_server_stats *out)
{
    *out = s->st;
}

#else /* not Linux: the broker uses libzmq */

fb_zmtp_server *fb_zmtp_server_new(const fb_zmtp_server_options *opts, int *err)
{
    (void)opts;
    *err = ENOSYS;
    return NULL;
}
int fb_zmtp_server_listen(fb_zmtp_server *s, const void *addr, size_t addrlen, void *bound, size_t *boundlen)
{ (void)s; (void)addr; (void)addrlen; (void)bound; (void)boundlen; return ENOSYS; }
void fb_zmtp_server_close(fb_zmtp_server *s, int linger_ms) { (void)s; (void)linger_ms; }
void fb_zmtp_server_free(fb_zmtp_server *s) { (void)s; }
int fb_zmtp_server_send(void *s, const void *buf, size_t len, int flags)
{ (void)s; (void)buf; (void)len; (void)flags; errno = ENOTSOCK; return -1; }
int fb_zmtp_server_getsockopt(void *s, int option, void *value, size_t *len)
{ (void)s; (void)option; (void)value; (void)len; errno = ENOTSOCK; return -1; }
int fb_zmtp_server_msg_recv(fb_zmq_msg *msg, void *s, int flags)
{ (void)msg; (void)s; (void)flags; errno = ENOTSOCK; return -1; }
const char *fb_zmtp_server_msg_gets(const fb_zmq_msg *msg, const char *property)
{ (void)msg; (void)property; errno = EINVAL; return NULL; }
int fb_zmtp_server_expire(fb_zmtp_server *s, uint64_t handshake_ns) { (void)s; (void)handshake_ns; return 0; }
int fb_zmtp_server_buffered(const fb_zmtp_server *s) { (void)s; return 0; }
int64_t fb_zmtp_server_unsent(const fb_zmtp_server *s, const unsigned char *id, size_t len)
{ (void)s; (void)id; (void)len; return -1; }
int fb_zmtp_server_take_gone(fb_zmtp_server *s, unsigned char *id) { (void)s; (void)id; return 0; }
int fb_zmtp_server_listen_resp(fb_zmtp_server *s, const void *addr, size_t addrlen, void *bound, size_t *boundlen)
{ (void)s; (void)addr; (void)addrlen; (void)bound; (void)boundlen; return ENOSYS; }
void fb_zmtp_server_routed(fb_zmtp_server *s, uint64_t receivers, uint64_t over)
{ (void)s; (void)receivers; (void)over; }
int fb_zmtp_server_close_peer(fb_zmtp_server *s, const unsigned char *id, size_t len, int any)
{ (void)s; (void)id; (void)len; (void)any; return 0; }
void fb_zmtp_server_get_stats(const fb_zmtp_server *s, fb_zmtp_server_stats *out)
{ (void)s; memset(out, 0, sizeof *out); }

#endif
