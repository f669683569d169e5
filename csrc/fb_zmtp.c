/* fb_zmtp.c - see fb_zmtp.h.
 *
 * ZMTP 3.0 as a client with the NULL mechanism (the wire format:
 * fb_zmtp_wire.h).  A PING command (ZMTP 3.1 heartbeats, which a libzmq
 * peer may be configured to send) is answered with a PONG.
 *
 * (Over 700 lines because the client connection's lifecycle (connect,
 * handshake, reconnect, keep and resend, the host looked up again) is one
 * state machine; the wire format is fb_zmtp_wire.c, the resolver
 * fb_resolve.c.)
 */
#define _GNU_SOURCE
#include "fb_zmtp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef __linux__
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>
#endif

#include "fb_common.h"
#include "fb_resolve.h"
#include "fb_zmtp_wire.h"

/* What a read asks of the kernel at least (the buffer grows past it only
 * for a message larger than that). */
#define READ_CHUNK 65536

enum { DOWN, CONNECTING, HANDSHAKE, UP, CLOSED };

/* A counted message kept until the peer acknowledges it (resend). */
typedef struct fb_kept {
    struct fb_kept *next;
    uint64_t num;                /* its number among the counted messages */
    size_t len;
    unsigned char bytes[];       /* the message, framed */
} fb_kept;


struct fb_zmtp {
    unsigned char addr[128];
    size_t addrlen;
    fb_zmtp_options o;
    int efd, tfd, fd;
    int state;
    uint64_t ivl;                /* the next wait before connecting again */

    fb_zbuf hs;                     /* our greeting and READY (before `out`) */
    fb_zbuf again;                  /* framed: sent first on every connection after the first */
    fb_zbuf out;                    /* messages, framed: [off, out_end) complete ones */
    size_t out_end;
    int out_msgs;                /* messages in `out` not yet wholly written */

    fb_zbuf in;
    int got_greeting;
    int watch_out;               /* EPOLLOUT is asked (connecting, or bytes wait for room) */
    int timer_armed;
    int frames_left;             /* of the message being handed out: frames still to give */
    int rcvmore;
    int stale;                   /* `in` holds whole messages of a lost connection: they go first */
    int more_in_kernel;          /* the last read filled all its room: the kernel may hold more */
    fb_zmtp_stats st;

    /* Resend (fb_zmtp_set_resend): counted messages, numbered and kept
     * until acknowledged; after a loss, held (kept only) until resumed. */
    unsigned char counted[8];
    size_t ncounted;
    size_t kept_max, kept_bytes;
    fb_kept *kept_head, *kept_tail;
    uint64_t counted_n, acked_n;
    int held;
    uint64_t held_from;          /* counted_n at the loss: what followed was never written */
    size_t msg_bytes;            /* of the message being built: bytes in `out` so far */
    int msg_counted;             /* ... and whether it is counted */
    int lost_untold;             /* a connection that was up went: fb_zmtp_take_lost says it once */
    fb_resolver *resolver;       /* the host name looked up again after each loss (fb_zmtp_set_host) */
};

#ifdef __linux__

static int keep(fb_zmtp *z);
static void kept_pop(fb_zmtp *z);

/* -- buffers ----------------------------------------------------------------- */

/* fb_zbuf_reserve for `out`, whose out_end moves with its bytes. */
static int out_reserve(fb_zmtp *z, size_t more)
{
    size_t before = z->out.off;
    if (fb_zbuf_reserve(&z->out, more) < 0) return -1;
    z->out_end -= before - z->out.off;
    return 0;
}

/* -- the connection ---------------------------------------------------------- */

/* Where the last whole message in the input ends: what a lost connection
 * leaves to be read. */
static size_t whole_messages_end(const fb_zmtp *z)
{
    if (!z->got_greeting) return z->in.off;
    return z->in.off + fb_zmtp_whole_end(z->in.p + z->in.off, z->in.len - z->in.off, z->frames_left > 0,
                                         z->o.max_msg_bytes);
}

static void arm_timer(fb_zmtp *z, uint64_t ns)
{
    struct itimerspec t;
    memset(&t, 0, sizeof t);
    if (ns == 0) ns = 1;
    t.it_value.tv_sec = (time_t)(ns / 1000000000u);
    t.it_value.tv_nsec = (long)(ns % 1000000000u);
    z->timer_armed = timerfd_settime(z->tfd, 0, &t, NULL) == 0;
}

/* The connection is gone (or never came): close it, drop what a new one
 * must not get (a message half written, what the peer half sent), and
 * connect again after the interval. */
static void lost(fb_zmtp *z, int protocol_error)
{
    if (z->fd >= 0) {
        epoll_ctl(z->efd, EPOLL_CTL_DEL, z->fd, NULL);
        close(z->fd);
        z->fd = -1;
    }
    z->st.disconnects++;
    if (protocol_error) z->st.protocol_errors++;
    if (z->state == UP) z->lost_untold = 1;
    if (z->state == UP && z->ncounted && !z->held) {
        /* What was counted may not have arrived: kept, and held from now
         * on, until the caller says what the peer has (fb_zmtp_resume). */
        z->held = 1;
        z->held_from = z->counted_n;
    }
    if (z->state == UP && z->out_msgs) {
        /* The messages we had queued were meant for this connection's
         * session; a new connection is a new session at the broker. */
        z->st.dropped_messages += (uint64_t)z->out_msgs;
        size_t partial = z->out.len - z->out_end;   /* a message still being built stays */
        memmove(z->out.p, z->out.p + z->out_end, partial);
        z->out.off = 0;
        z->out.len = z->out_end = partial;
        z->out_msgs = 0;
    }
    z->hs.off = z->hs.len = 0;
    /* Whole messages already read are still the caller's (as libzmq's
     * are); the end of a message the peer did not finish is not. */
    z->in.len = z->state == UP ? whole_messages_end(z) : z->in.off;
    z->stale = z->in.off < z->in.len;
    if (!z->stale) z->in.off = z->in.len = 0;
    z->got_greeting = 0;
    z->watch_out = 0;
    z->state = DOWN;
    /* The name may point elsewhere now: ask again while the interval runs
     * (in a thread of its own: a lookup may block for seconds). */
    if (z->resolver) fb_resolver_start(z->resolver);
    arm_timer(z, z->ivl);
    if (z->ivl < z->o.reconnect_ivl_max_ns) {
        z->ivl *= 2;
        if (z->ivl > z->o.reconnect_ivl_max_ns) z->ivl = z->o.reconnect_ivl_max_ns;
    }
}

/* A TCP connect to a port of this host that nobody listens on can meet
 * itself (the kernel may pick the same port as the local end: a
 * "simultaneous open" with itself). */
static int connected_to_itself(const fb_zmtp *z)
{
    struct sockaddr_storage a, b;
    socklen_t al = sizeof a, bl = sizeof b;
    if (((const struct sockaddr *)z->addr)->sa_family == AF_UNIX) return 0;
    if (getsockname(z->fd, (struct sockaddr *)&a, &al) < 0 || getpeername(z->fd, (struct sockaddr *)&b, &bl) < 0)
        return 0;
    return al == bl && memcmp(&a, &b, al) == 0;
}

static void start_handshake(fb_zmtp *z)
{
    unsigned char g[FB_ZMTP_GREETING];
    if (connected_to_itself(z)) {
        lost(z, 0);
        return;
    }
    fb_zmtp_greeting(g, 0);
    z->hs.off = z->hs.len = 0;
    if (fb_zbuf_put(&z->hs, g, sizeof g) < 0 || fb_zmtp_put_ready(&z->hs, "DEALER") < 0) {
        lost(z, 0);
        return;
    }
    z->state = HANDSHAKE;
}

static void try_connect(fb_zmtp *z)
{
    const struct sockaddr *sa = (const struct sockaddr *)z->addr;
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        lost(z, 0);
        return;
    }
    int one = 1;
    if (sa->sa_family != AF_UNIX) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (z->o.keepalive) setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    if (z->o.sndbuf > 0) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &z->o.sndbuf, sizeof z->o.sndbuf);
    if (z->o.rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &z->o.rcvbuf, sizeof z->o.rcvbuf);
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;   /* room: until connected */
    ev.data.fd = fd;
    if (epoll_ctl(z->efd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        close(fd);
        lost(z, 0);
        return;
    }
    z->fd = fd;
    z->watch_out = 1;
    int rc;
    do rc = connect(fd, sa, (socklen_t)z->addrlen);
    while (rc < 0 && errno == EINTR);
    if (rc == 0) start_handshake(z);
    else if (errno == EINPROGRESS || errno == EAGAIN) z->state = CONNECTING;
    else lost(z, 0);
}

/* Ask for room (EPOLLOUT) only while bytes wait for it: the descriptor
 * is level-triggered, and a socket with room would keep it readable. */
static void watch_out(fb_zmtp *z, int on)
{
    if (z->fd < 0 || z->watch_out == on) return;
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0);
    ev.data.fd = z->fd;
    if (epoll_ctl(z->efd, EPOLL_CTL_MOD, z->fd, &ev) == 0) z->watch_out = on;
}

/* Write b's bytes up to `end`: 1 all written, 0 the kernel is full, -1
 * the connection was lost. */
static int write_some(fb_zmtp *z, fb_zbuf *b, size_t end)
{
    while (b->off < end) {
        ssize_t w = send(z->fd, b->p + b->off, end - b->off, MSG_NOSIGNAL | MSG_DONTWAIT);
        z->st.syscalls_send++;
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            lost(z, 0);
            return -1;
        }
        b->off += (size_t)w;
    }
    return 1;
}

/* Write what may go: the handshake, then (once it is done) whole messages.
 * 0, or -1 if the connection was lost. */
static int flush(fb_zmtp *z)
{
    if (z->fd < 0 || (z->state != HANDSHAKE && z->state != UP)) return 0;
    int rc = write_some(z, &z->hs, z->hs.len);
    if (rc == 1 && z->state == UP) {
        rc = write_some(z, &z->out, z->out_end);
        if (rc == 1) {
            z->out_msgs = 0;
            if (z->out_end == z->out.len) z->out.off = z->out.len = z->out_end = 0;
        }
    }
    if (rc < 0) return -1;
    watch_out(z, rc == 0);                       /* the kernel was full: wake a poller when it has room */
    return 0;
}

/* Move a connect or a reconnect on. */
static void progress(fb_zmtp *z)
{
    if (z->state == DOWN) {
        uint64_t expirations;
        if (z->timer_armed && read(z->tfd, &expirations, sizeof expirations) != sizeof expirations) return;
        z->timer_armed = 0;
        if (z->resolver) fb_resolver_take(z->resolver, z->addr, &z->addrlen, sizeof z->addr);
        try_connect(z);
    }
    if (z->state == CONNECTING) {
        struct pollfd p = {z->fd, POLLOUT, 0};
        if (poll(&p, 1, 0) <= 0) return;
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(z->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
            lost(z, 0);
            return;
        }
        start_handshake(z);
    }
    if (z->state == HANDSHAKE || z->state == UP) flush(z);
}

/* Read what the kernel has (at least `want` bytes of room).  1 if bytes
 * came, 0 if none, -1 if the connection was lost. */
static int fill(fb_zmtp *z, size_t want)
{
    if (want < READ_CHUNK) want = READ_CHUNK;
    if (z->in.off == z->in.len && z->in.cap > 16 * READ_CHUNK && want <= READ_CHUNK) {
        fb_zbuf_free(&z->in);                       /* after a large message: give it back */
    }
    if (fb_zbuf_reserve(&z->in, want) < 0) {
        lost(z, 1);                              /* no memory for it: as if it were bad */
        return -1;
    }
    size_t room = z->in.cap - z->in.len;
    ssize_t r;
    do r = recv(z->fd, z->in.p + z->in.len, room, MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    z->st.syscalls_recv++;
    z->more_in_kernel = r > 0 && (size_t)r == room;
    if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        lost(z, 0);
        return -1;
    }
    if (r == 0) {
        lost(z, 0);
        return -1;
    }
    z->in.len += (size_t)r;
    return 1;
}

/* READY's Socket-Type is a ROUTER's (a broker's; a DEALER could also
 * talk to a DEALER or a REP, but this one is for brokers only, and a
 * connection that came back to itself would say DEALER). */
static int ready_ok(const unsigned char *p, uint64_t size)
{
    const unsigned char *type;
    size_t len;
    return fb_zmtp_ready_type(p, size, &type, &len) && len == 6 && memcmp(type, "ROUTER", 6) == 0;
}

/* A command from the peer (consumed by the caller).  0, or -1: the
 * connection was closed for it. */
static int on_command(fb_zmtp *z, const unsigned char *body, uint64_t size)
{
    if (z->state == HANDSHAKE) {
        if (fb_zmtp_is_command(body, size, "READY") && ready_ok(body, size)) {
            z->state = UP;
            z->ivl = z->o.reconnect_ivl_ns;
            z->st.connects++;
            if (z->st.connects > 1 && z->again.len > z->again.off) {
                /* Ahead of what waits: nothing of `out` went on this connection yet. */
                size_t n = z->again.len - z->again.off, at;
                if (out_reserve(z, n) == 0) {
                    at = z->out.off;
                    fb_zbuf_insert(&z->out, &at, z->again.p + z->again.off, n);
                    z->out_end += n;
                    z->out_msgs++;
                }
            }
            return flush(z);
        }
        lost(z, !fb_zmtp_is_command(body, size, "ERROR"));   /* ERROR: the peer refused us */
        return -1;
    }
    unsigned char f[32];
    size_t n = fb_zmtp_pong(f, body, size);
    if (n) {
        /* The PONG goes between whole messages: before one still being built. */
        if (fb_zbuf_insert(&z->out, &z->out_end, f, n) < 0) return 0;
        z->out_msgs++;
        flush(z);
        return z->state == UP ? 0 : -1;
    }
    return 0;                                    /* PONG, and what later versions add: ignored */
}

/* Is a whole message at the front of the input (commands before it are
 * handled and consumed)?  Reads from the kernel while one is not, if
 * `read`.  1: yes; 0: not now. */
static int message_ready(fb_zmtp *z, int read)
{
    if (z->stale) {
        /* What a lost connection left: whole messages (checked when it
         * was lost); its commands are of no more use. */
        z->in.off += fb_zmtp_skip_commands(z->in.p + z->in.off, z->in.len - z->in.off);
        if (z->in.off < z->in.len) return 1;
        z->stale = 0;
        z->in.off = z->in.len = 0;
    }
    progress(z);
    for (;;) {
        if (z->state != HANDSHAKE && z->state != UP) return 0;
        size_t need = 0, body = 0;               /* need: room to read the rest of a frame */
        uint64_t size = 0;
        if (!z->got_greeting) {
            if (z->in.len - z->in.off >= FB_ZMTP_GREETING) {
                if (!fb_zmtp_greeting_ok(z->in.p + z->in.off)) {
                    lost(z, 1);
                    return 0;
                }
                z->in.off += FB_ZMTP_GREETING;
                z->got_greeting = 1;
                continue;
            }
        } else {
            const unsigned char *p = z->in.p + z->in.off;
            switch (fb_zmtp_next(p, z->in.len - z->in.off, z->state == UP, z->o.max_msg_bytes, &body, &size, &need)) {
            case FB_ZMTP_MESSAGE:
                return 1;
            case FB_ZMTP_COMMAND:
                z->in.off += body + (size_t)size;
                if (on_command(z, p + body, size) < 0) return 0;
                continue;
            case FB_ZMTP_BAD:
                lost(z, 1);
                return 0;
            }
        }
        if (!read || fill(z, need) <= 0) return 0;
    }
}

/* -- the calls ---------------------------------------------------------------- */

fb_zmtp *fb_zmtp_open(const void *addr, size_t addrlen, const fb_zmtp_options *opts, int *err)
{
    if (!addr || addrlen < sizeof(sa_family_t) || addrlen > sizeof ((fb_zmtp *)0)->addr || !opts
        || opts->sndhwm < 1 || opts->max_msg_bytes == 0) {
        *err = EINVAL;
        return NULL;
    }
    fb_zmtp *z = calloc(1, sizeof *z);
    if (!z) {
        *err = ENOMEM;
        return NULL;
    }
    memcpy(z->addr, addr, addrlen);
    z->addrlen = addrlen;
    z->o = *opts;
    if (z->o.reconnect_ivl_ns == 0) z->o.reconnect_ivl_ns = 100000000u;
    if (z->o.reconnect_ivl_max_ns < z->o.reconnect_ivl_ns) z->o.reconnect_ivl_max_ns = z->o.reconnect_ivl_ns;
    z->ivl = z->o.reconnect_ivl_ns;
    z->fd = -1;
    z->efd = epoll_create1(EPOLL_CLOEXEC);
    z->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.fd = z->tfd;
    if (z->efd < 0 || z->tfd < 0 || epoll_ctl(z->efd, EPOLL_CTL_ADD, z->tfd, &ev) < 0) {
        *err = errno ? errno : EMFILE;
        if (z->efd >= 0) close(z->efd);
        if (z->tfd >= 0) close(z->tfd);
        free(z);
        return NULL;
    }
    z->state = DOWN;
    try_connect(z);
    if (z->state == DOWN) z->st.disconnects--;   /* the first try is not a lost connection */
    return z;
}

void fb_zmtp_close(fb_zmtp *z, int linger_ms)
{
    if (!z) return;
    if (linger_ms > 0 && z->state != CLOSED) {
        uint64_t until = fb_now_ns() + (uint64_t)linger_ms * 1000000u;
        for (;;) {
            progress(z);
            if (z->out.off == z->out_end) break;       /* every whole message written (or none queued) */
            uint64_t now = fb_now_ns();
            if (now >= until) break;
            struct pollfd p = {z->efd, POLLIN, 0};
            int ms = (int)((until - now) / 1000000u) + 1;
            poll(&p, 1, ms > 10 ? 10 : ms);
        }
    }
    if (z->fd >= 0) close(z->fd);
    close(z->efd);
    close(z->tfd);
    fb_zbuf_free(&z->hs);
    fb_zbuf_free(&z->again);
    fb_zbuf_free(&z->out);
    fb_zbuf_free(&z->in);
    while (z->kept_head) kept_pop(z);
    fb_resolver_free(z->resolver);
    free(z);
}

int fb_zmtp_set_host(fb_zmtp *z, const char *host)
{
    int family = ((const struct sockaddr *)z->addr)->sa_family;
    if (!host || !*host || (family != AF_INET && family != AF_INET6)) {
        errno = EINVAL;
        return -1;
    }
    uint16_t port = ntohs(family == AF_INET ? ((const struct sockaddr_in *)z->addr)->sin_port
                                            : ((const struct sockaddr_in6 *)z->addr)->sin6_port);
    fb_resolver *r = fb_resolver_new(host, port);
    if (!r) return -1;
    fb_resolver_free(z->resolver);
    z->resolver = r;
    return 0;
}

int fb_zmtp_address(const fb_zmtp *z, void *addr, size_t *len)
{
    if (*len < z->addrlen) {
        errno = ENOSPC;
        return -1;
    }
    memcpy(addr, z->addr, z->addrlen);
    *len = z->addrlen;
    return 0;
}

/* -- resend ------------------------------------------------------------------ */

/* Keep the counted message just built (the last msg_bytes of `out`),
 * numbered.  1 if kept; 0 for want of memory (then it goes unkept, as
 * without resend, and is counted: st.unkept). */
static int keep(fb_zmtp *z)
{
    fb_kept *k = malloc(sizeof *k + z->msg_bytes);
    z->counted_n++;
    if (!k) {
        z->st.unkept++;
        return 0;
    }
    k->next = NULL;
    k->num = z->counted_n;
    k->len = z->msg_bytes;
    memcpy(k->bytes, z->out.p + z->out.len - z->msg_bytes, z->msg_bytes);
    if (z->kept_tail) z->kept_tail->next = k;
    else z->kept_head = k;
    z->kept_tail = k;
    z->kept_bytes += k->len;
    return 1;
}

static void kept_pop(fb_zmtp *z)
{
    fb_kept *k = z->kept_head;
    z->kept_head = k->next;
    if (!z->kept_head) z->kept_tail = NULL;
    z->kept_bytes -= k->len;
    free(k);
}

int fb_zmtp_set_resend(fb_zmtp *z, const unsigned char *commands, size_t n, size_t max_bytes)
{
    if (!z || n > sizeof z->counted || (n && (!commands || z->counted_n))) {
        errno = EINVAL;
        return -1;
    }
    if (n == 0) {                                 /* off: nothing kept, nothing held */
        while (z->kept_head) kept_pop(z);
        z->counted_n = z->acked_n = 0;
        z->held = 0;
    }
    memcpy(z->counted, commands, n);
    z->ncounted = n;
    z->kept_max = max_bytes ? max_bytes : 1;
    return 0;
}

void fb_zmtp_acked(fb_zmtp *z, uint64_t n)
{
    if (!z || n <= z->acked_n) return;
    if (n > z->counted_n) n = z->counted_n;      /* (a peer's count past ours: what we sent, at most) */
    z->acked_n = n;
    while (z->kept_head && z->kept_head->num <= n) kept_pop(z);
}

uint64_t fb_zmtp_resume(fb_zmtp *z, uint64_t received, int how)
{
    uint64_t dropped = 0;
    if (!z || z->state == CLOSED) return 0;
    if (!z->held) {                               /* nothing was lost: only what it acknowledges */
        fb_zmtp_acked(z, received);
        return 0;
    }
    if (how == FB_ZMTP_RESUMED) {
        fb_zmtp_acked(z, received);
    } else {
        /* A new session: what went on the old connection is not sent
         * again (counted as dropped); what never went is, numbered anew
         * (unless it is all to go: FB_ZMTP_FRESH_DROP). */
        while (z->kept_head && (how == FB_ZMTP_FRESH_DROP || z->kept_head->num <= z->held_from)) {
            kept_pop(z);
            dropped++;
        }
        uint64_t num = 0;
        for (fb_kept *k = z->kept_head; k; k = k->next) k->num = ++num;
        z->counted_n = num;
        z->acked_n = 0;
    }
    z->held = 0;
    /* Ahead of a message still being built; behind the whole ones queued
     * since (the HELLO that this resume answers). */
    size_t partial = z->out.len - z->out_end;
    for (fb_kept *k = z->kept_head; k; k = k->next) {
        size_t at = z->out_end;
        if (fb_zbuf_insert(&z->out, &at, k->bytes, k->len) < 0) break;   /* (no memory: the next resume) */
        z->out_end = z->out.len - partial;
        z->out_msgs++;
    }
    if (z->state == UP) flush(z);
    return dropped;
}

void fb_zmtp_resend_state(const fb_zmtp *z, uint64_t *counted, uint64_t *acked, size_t *kept_bytes, int *held)
{
    *counted = z->counted_n;
    *acked = z->acked_n;
    *kept_bytes = z->kept_bytes;
    *held = z->held;
}

int fb_zmtp_take_lost(void *sock)
{
    fb_zmtp *z = sock;
    if (!z || !z->lost_untold) return 0;
    z->lost_untold = 0;
    return 1;
}

size_t fb_zmtp_kept_each(const fb_zmtp *z, fb_zmtp_kept_fn fn, void *arg)
{
    size_t n = 0;
    for (const fb_kept *k = z->kept_head; k; k = k->next) {
        /* Our own framing (fb_zmtp_send): whole frames, each header parsed. */
        const unsigned char *first = NULL, *last = NULL;
        size_t first_len = 0, last_len = 0, at = 0;
        while (at < k->len) {
            int flags;
            size_t hl;
            uint64_t size;
            if (fb_zmtp_parse_header(k->bytes + at, k->len - at, &flags, &hl, &size) != 1 ||
                size > k->len - at - hl)
                break;
            last = k->bytes + at + hl;
            last_len = (size_t)size;
            if (!first) {
                first = last;
                first_len = last_len;
            }
            at += hl + (size_t)size;
        }
        n++;
        if (fn && first && fn(arg, first, first_len, last, last_len)) break;
    }
    return n;
}

int fb_zmtp_send(void *sock, const void *buf, size_t len, int flags)
{
    fb_zmtp *z = sock;
    if (!z || z->state == CLOSED) {
        errno = ENOTSOCK;
        return -1;
    }
    int first = z->out.len == z->out_end;        /* no message being built */
    if (first && z->out_msgs >= z->o.sndhwm) {
        progress(z);                             /* room now? */
        if (z->out_msgs >= z->o.sndhwm) {
            errno = EAGAIN;
            return -1;
        }
    }
    if (first) {
        z->msg_counted = z->ncounted && len && memchr(z->counted, ((const unsigned char *)buf)[0], z->ncounted);
        z->msg_bytes = 0;
        if (z->msg_counted && z->kept_bytes >= z->kept_max) {
            errno = EAGAIN;                      /* until the peer acknowledges what is kept */
            return -1;
        }
    }
    unsigned char h[9];
    size_t hl = fb_zmtp_frame_header(h, (flags & FB_ZMTP_SNDMORE) ? 1 : 0, len);
    if (out_reserve(z, hl + len) < 0) {
        errno = ENOMEM;
        return -1;
    }
    fb_zbuf_put(&z->out, h, hl);
    fb_zbuf_put(&z->out, buf, len);
    z->msg_bytes += hl + len;
    if (!(flags & FB_ZMTP_SNDMORE)) {
        if (z->msg_counted && keep(z) && z->held) {
            z->out.len = z->out_end;             /* held: it goes at the resume */
            return len > INT32_MAX ? INT32_MAX : (int)len;
        }
        z->out_end = z->out.len;
        z->out_msgs++;
        if (z->state == UP) flush(z);
        else progress(z);
    }
    return len > INT32_MAX ? INT32_MAX : (int)len;
}

int fb_zmtp_set_reconnect_message(fb_zmtp *z, const void *const *frames, const size_t *lens, int n)
{
    unsigned char h[9];
    if (!z || n < 0 || (n > 0 && (!frames || !lens))) {
        errno = EINVAL;
        return -1;
    }
    z->again.off = z->again.len = 0;
    for (int i = 0; i < n; i++) {
        size_t hl = fb_zmtp_frame_header(h, i < n - 1 ? 1 : 0, lens[i]);
        if (fb_zbuf_put(&z->again, h, hl) < 0 || fb_zbuf_put(&z->again, frames[i], lens[i]) < 0) {
            z->again.off = z->again.len = 0;
            errno = ENOMEM;
            return -1;
        }
    }
    return 0;
}

int fb_zmtp_getsockopt(void *sock, int option, void *value, size_t *len)
{
    fb_zmtp *z = sock;
    if (!z || z->state == CLOSED || !value || !len || *len < sizeof(int)) {
        errno = z && z->state != CLOSED ? EINVAL : ENOTSOCK;
        return -1;
    }
    int v = 0;
    if (option == FB_ZMTP_FD) {
        v = z->efd;
    } else if (option == FB_ZMTP_RCVMORE) {
        v = z->rcvmore;
    } else if (option == FB_ZMTP_EVENTS) {
        if (z->frames_left || message_ready(z, 1)) v |= FB_ZMTP_POLLIN;
        if (z->out_msgs < z->o.sndhwm || z->out.len != z->out_end) v |= FB_ZMTP_POLLOUT;
    } else {
        errno = EINVAL;
        return -1;
    }
    memcpy(value, &v, sizeof v);
    *len = sizeof v;
    return 0;
}

int fb_zmtp_msg_init(fb_zmq_msg *msg)
{
    memset(msg, 0, sizeof *msg);
    return 0;
}

int fb_zmtp_msg_recv(fb_zmq_msg *msg, void *sock, int flags)
{
    (void)flags;
    fb_zmtp *z = sock;
    fb_zmtp_view *m = (fb_zmtp_view *)msg;
    if (!z || z->state == CLOSED) {
        errno = ENOTSOCK;
        return -1;
    }
    if (!z->frames_left) {
        if (!message_ready(z, 1)) {
            errno = EAGAIN;
            return -1;
        }
        z->frames_left = 1;
    }
    /* A whole message is here (message_ready checked every header). */
    int f = 0;
    size_t hl = 0;
    uint64_t size = 0;
    fb_zmtp_parse_header(z->in.p + z->in.off, z->in.len - z->in.off, &f, &hl, &size);
    m->data = z->in.p + z->in.off + hl;
    m->size = (size_t)size;
    m->more = f & 1;
    z->in.off += hl + (size_t)size;
    z->rcvmore = m->more;
    z->frames_left = m->more;
    return size > INT32_MAX ? INT32_MAX : (int)size;
}

void *fb_zmtp_msg_data(fb_zmq_msg *msg)
{
    return ((fb_zmtp_view *)msg)->data;
}

size_t fb_zmtp_msg_size(const fb_zmq_msg *msg)
{
    return ((const fb_zmtp_view *)msg)->size;
}

int fb_zmtp_msg_more(const fb_zmq_msg *msg)
{
    return ((const fb_zmtp_view *)msg)->more;
}

int fb_zmtp_msg_close(fb_zmq_msg *msg)
{
    memset(msg, 0, sizeof(fb_zmtp_view));
    return 0;
}

int fb_zmtp_buffered(fb_zmtp *z)
{
    if (!z || z->state == CLOSED) return 0;
    return z->frames_left || message_ready(z, 0);
}

int fb_zmtp_pending(fb_zmtp *z)
{
    if (!z || z->state == CLOSED) return 0;
    return z->frames_left || z->more_in_kernel || message_ready(z, 0);
}

int fb_zmtp_connected(const fb_zmtp *z)
{
    return z && z->state == UP;
}

void fb_zmtp_get_stats(const fb_zmtp *z, fb_zmtp_stats *out)
{
    *out = z->st;
    if (z->resolver) {
        fb_resolver_stats r;
        fb_resolver_get_stats(z->resolver, &r);
        out->lookups = r.lookups;
        out->lookup_failures = r.failures;
        out->address_changes = r.changes;
    }
}

#else /* not Linux: the client uses libzmq */

fb_zmtp *fb_zmtp_open(const void *addr, size_t addrlen, const fb_zmtp_options *opts, int *err)
{
    (void)addr; (void)addrlen; (void)opts;
    *err = ENOSYS;
    return NULL;
}
void fb_zmtp_close(fb_zmtp *z, int linger_ms) { (void)z; (void)linger_ms; }
int fb_zmtp_set_reconnect_message(fb_zmtp *z, const void *const *frames, const size_t *lens, int n)
{ (void)z; (void)frames; (void)lens; (void)n; errno = ENOTSOCK; return -1; }
int fb_zmtp_set_resend(fb_zmtp *z, const unsigned char *commands, size_t n, size_t max_bytes)
{ (void)z; (void)commands; (void)n; (void)max_bytes; errno = ENOTSOCK; return -1; }
void fb_zmtp_acked(fb_zmtp *z, uint64_t n) { (void)z; (void)n; }
uint64_t fb_zmtp_resume(fb_zmtp *z, uint64_t received, int how) { (void)z; (void)received; (void)how; return 0; }
void fb_zmtp_resend_state(const fb_zmtp *z, uint64_t *counted, uint64_t *acked, size_t *kept_bytes, int *held)
{ (void)z; *counted = *acked = 0; *kept_bytes = 0; *held = 0; }
size_t fb_zmtp_kept_each(const fb_zmtp *z, fb_zmtp_kept_fn fn, void *arg)
{ (void)z; (void)fn; (void)arg; return 0; }
int fb_zmtp_take_lost(void *sock) { (void)sock; return 0; }
int fb_zmtp_send(void *z, const void *buf, size_t len, int flags)
{ (void)z; (void)buf; (void)len; (void)flags; errno = ENOTSOCK; return -1; }
int fb_zmtp_getsockopt(void *z, int option, void *value, size_t *len)
{ (void)z; (void)option; (void)value; (void)len; errno = ENOTSOCK; return -1; }
int fb_zmtp_msg_init(fb_zmq_msg *msg) { memset(msg, 0, sizeof *msg); return 0; }
int fb_zmtp_msg_recv(fb_zmq_msg *msg, void *z, int flags)
{ (void)msg; (void)z; (void)flags; errno = ENOTSOCK; return -1; }
void *fb_zmtp_msg_data(fb_zmq_msg *msg) { return msg; }
size_t fb_zmtp_msg_size(const fb_zmq_msg *msg) { (void)msg; return 0; }
int fb_zmtp_msg_more(const fb_zmq_msg *msg) { (void)msg; return 0; }
int fb_zmtp_msg_close(fb_zmq_msg *msg) { (void)msg; return 0; }
int fb_zmtp_buffered(fb_zmtp *z) { (void)z; return 0; }
int fb_zmtp_pending(fb_zmtp *z) { (void)z; return 0; }
int fb_zmtp_connected(const fb_zmtp *z) { (void)z; return 0; }
void fb_zmtp_get_stats(const fb_zmtp *z, fb_zmtp_stats *out) { (void)z; memset(out, 0, sizeof *out); }
int fb_zmtp_set_host(fb_zmtp *z, const char *host) { (void)z; (void)host; errno = ENOSYS; return -1; }
int fb_zmtp_address(const fb_zmtp *z, void *addr, size_t *len) { (void)z; (void)addr; (void)len; errno = ENOSYS; return -1; }

#endif
