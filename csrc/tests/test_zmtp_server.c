/* Tests of fb_zmtp_server: the broker's ROUTER end, over real loopback
 * sockets, with fb_zmtp clients (and, for bad input, raw sockets) as its
 * peers, all driven by this one thread (tests/test_listener.py checks the
 * same against libzmq's DEALER). */
#define _GNU_SOURCE
#include "ctest.h"
#include "fb_common.h"
#include "fb_zmtp.h"
#include "fb_zmtp_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAXC 100

typedef struct rig {
    fb_zmtp_server *s;
    struct sockaddr_in addr;
    fb_zmtp *c[MAXC];
    int nc;
} rig;

static fb_zmtp_server *server(int sndhwm, uint64_t max_msg, struct sockaddr_in *addr)
{
    fb_zmtp_server_options o;
    memset(&o, 0, sizeof o);
    o.sndhwm = sndhwm;
    o.max_msg_bytes = max_msg;
    o.keepalive_idle_s = 30;
    int err = 0;
    fb_zmtp_server *s = fb_zmtp_server_new(&o, &err);
    REQUIRE(s != NULL);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    size_t bl = sizeof *addr;
    REQUIRE(fb_zmtp_server_listen(s, &a, sizeof a, addr, &bl) == 0);
    REQUIRE(bl == sizeof *addr && addr->sin_port != 0);
    return s;
}

/* A client (fb_zmtp) of the server at addr. */
static fb_zmtp *client_to(const void *addr, size_t len)
{
    fb_zmtp_options o;
    memset(&o, 0, sizeof o);
    o.sndhwm = 1000;
    o.max_msg_bytes = 1 << 20;
    o.reconnect_ivl_ns = 10000000u;
    int err = 0;
    fb_zmtp *c = fb_zmtp_open(addr, len, &o, &err);
    REQUIRE(c != NULL);
    return c;
}

static void rig_open(rig *r, int sndhwm, uint64_t max_msg, int clients)
{
    memset(r, 0, sizeof *r);
    r->s = server(sndhwm, max_msg, &r->addr);
    for (int i = 0; i < clients; i++) r->c[i] = client_to(&r->addr, sizeof r->addr);
    r->nc = clients;
}

static void rig_close(rig *r)
{
    for (int i = 0; i < r->nc; i++)
        if (r->c[i]) fb_zmtp_close(r->c[i], 0);
    fb_zmtp_server_free(r->s);
}

/* Let every party move (each moves in its own calls): a poll of their
 * descriptors, then ZMQ_EVENTS on each. */
static void pump(rig *r, int ms)
{
    struct pollfd p[MAXC + 1];
    int n = 0, v;
    size_t len = sizeof v;
    fb_zmtp_server_getsockopt(r->s, FB_ZMTP_FD, &v, &len);
    p[n++] = (struct pollfd){v, POLLIN, 0};
    for (int i = 0; i < r->nc; i++) {
        if (!r->c[i]) continue;
        len = sizeof v;
        fb_zmtp_getsockopt(r->c[i], FB_ZMTP_FD, &v, &len);
        p[n++] = (struct pollfd){v, POLLIN, 0};
    }
    poll(p, (nfds_t)n, ms);
    len = sizeof v;
    fb_zmtp_server_getsockopt(r->s, FB_ZMTP_EVENTS, &v, &len);   /* writes what has room */
    for (int i = 0; i < r->nc; i++) {
        if (!r->c[i]) continue;
        len = sizeof v;
        fb_zmtp_getsockopt(r->c[i], FB_ZMTP_EVENTS, &v, &len);
    }
}

/* Until every client's handshake is done. */
static void connect_all(rig *r)
{
    uint64_t until = fb_now_ns() + 2000000000u;
    for (;;) {
        int up = 0;
        for (int i = 0; i < r->nc; i++) up += fb_zmtp_connected(r->c[i]);
        if (up == r->nc) break;
        REQUIRE(fb_now_ns() < until);
        int v;
        size_t len = sizeof v;
        fb_zmtp_server_getsockopt(r->s, FB_ZMTP_EVENTS, &v, &len);
        pump(r, 5);
    }
}

/* One message from the server: its frame count (the routing id first),
 * 0 if none within ms. */
static int srecv(rig *r, unsigned char frames[][512], size_t *lens, int max, int ms)
{
    uint64_t until = fb_now_ns() + (uint64_t)ms * 1000000u;
    for (;;) {
        fb_zmq_msg m;
        fb_zmtp_msg_init(&m);
        if (fb_zmtp_server_msg_recv(&m, r->s, FB_ZMTP_DONTWAIT) >= 0) {
            int n = 0;
            for (;;) {
                REQUIRE(n < max);
                size_t sz = fb_zmtp_msg_size(&m);
                memcpy(frames[n], fb_zmtp_msg_data(&m), sz < 512 ? sz : 512);   /* (the size says the rest) */
                lens[n++] = sz;
                if (!fb_zmtp_msg_more(&m)) return n;
                REQUIRE(fb_zmtp_server_msg_recv(&m, r->s, FB_ZMTP_DONTWAIT) >= 0);
            }
        }
        CHECK_EQ(errno, EAGAIN);
        if (fb_now_ns() >= until) return 0;
        pump(r, 5);
    }
}

/* One message for client i: its frame count, 0 if none within ms. */
static int crecv(rig *r, int i, unsigned char frames[][512], size_t *lens, int max, int ms)
{
    uint64_t until = fb_now_ns() + (uint64_t)ms * 1000000u;
    for (;;) {
        fb_zmq_msg m;
        fb_zmtp_msg_init(&m);
        if (fb_zmtp_msg_recv(&m, r->c[i], FB_ZMTP_DONTWAIT) >= 0) {
            int n = 0;
            for (;;) {
                REQUIRE(n < max);
                size_t sz = fb_zmtp_msg_size(&m);
                memcpy(frames[n], fb_zmtp_msg_data(&m), sz < 512 ? sz : 512);   /* (the size says the rest) */
                lens[n++] = sz;
                if (!fb_zmtp_msg_more(&m)) return n;
                REQUIRE(fb_zmtp_msg_recv(&m, r->c[i], FB_ZMTP_DONTWAIT) >= 0);
            }
        }
        if (fb_now_ns() >= until) return 0;
        pump(r, 5);
    }
}

static int ssend(rig *r, const unsigned char *id, size_t idlen, const char *a, const char *b)
{
    if (fb_zmtp_server_send(r->s, id, idlen, FB_ZMTP_SNDMORE) < 0) return errno;
    CHECK(fb_zmtp_server_send(r->s, a, strlen(a), FB_ZMTP_SNDMORE) >= 0);
    CHECK(fb_zmtp_server_send(r->s, b, strlen(b), 0) >= 0);
    return 0;
}

static void csend(fb_zmtp *c, const char *a, const char *b)
{
    CHECK(fb_zmtp_send(c, a, strlen(a), FB_ZMTP_SNDMORE) >= 0);
    CHECK(fb_zmtp_send(c, b, strlen(b), 0) >= 0);
}

/* Client i says something: its routing id, as the server sees it. */
static void id_of(rig *r, int i, unsigned char id[9])
{
    unsigned char f[8][512];
    size_t l[8];
    csend(r->c[i], "hello", "");
    REQUIRE(srecv(r, f, l, 8, 2000) == 3);
    memcpy(id, f[0], 9);
}

/* -- tests --------------------------------------------------------------------- */

static void test_messages_both_ways_behind_a_routing_id(void)
{
    rig r;
    rig_open(&r, 16, 1 << 20, 1);
    csend(r.c[0], "HELLO", "sent before the handshake");   /* queued by the client */
    unsigned char f[8][512];
    size_t l[8];
    fb_zmq_msg m;
    CHECK_EQ(srecv(&r, f, l, 8, 2000), 3);
    CHECK_EQ(l[0], 9);
    CHECK_EQ(f[0][0], 0);
    CHECK(l[1] == 5 && memcmp(f[1], "HELLO", 5) == 0);
    CHECK(l[2] == 25 && memcmp(f[2], "sent before the handshake", 25) == 0);
    unsigned char id[9];
    memcpy(id, f[0], 9);
    /* Peer-Address: the client's IP. */
    csend(r.c[0], "A", "B");
    fb_zmtp_msg_init(&m);
    for (int tries = 0; fb_zmtp_server_msg_recv(&m, r.s, FB_ZMTP_DONTWAIT) < 0 && tries < 400; tries++) pump(&r, 5);
    const char *peer = fb_zmtp_server_msg_gets(&m, "Peer-Address");
    CHECK(peer != NULL && strcmp(peer, "127.0.0.1") == 0);
    CHECK(fb_zmtp_server_msg_gets(&m, "User-Id") == NULL);
    CHECK(memcmp(fb_zmtp_msg_data(&m), id, 9) == 0);
    while (fb_zmtp_msg_more(&m)) CHECK(fb_zmtp_server_msg_recv(&m, r.s, 0) >= 0);
    /* And back, 300-byte frames included (8-byte sizes). */
    char big[301];
    memset(big, 'x', 300);
    big[300] = 0;
    CHECK_EQ(ssend(&r, id, 9, "D", big), 0);
    CHECK_EQ(crecv(&r, 0, f, l, 8, 2000), 2);
    CHECK(l[0] == 1 && f[0][0] == 'D');
    CHECK_EQ(l[1], 300);
    /* An id that is no connection: EHOSTUNREACH (ROUTER_MANDATORY). */
    unsigned char other[9] = {0, 0, 0, 0, 7, 0, 0, 0, 0};
    CHECK_EQ(ssend(&r, other, 9, "x", "y"), EHOSTUNREACH);
    CHECK_EQ(ssend(&r, (const unsigned char *)"abc", 3, "x", "y"), EHOSTUNREACH);
    fb_zmtp_server_stats st;
    fb_zmtp_server_get_stats(r.s, &st);
    CHECK_EQ(st.accepted, 1);
    CHECK_EQ(st.connections, 1);
    rig_close(&r);
}

static void test_peers_are_read_in_turn(void)
{
    rig r;
    rig_open(&r, 16, 1 << 20, 3);
    connect_all(&r);
    char b[16];
    for (int k = 0; k < 20; k++)
        for (int i = 0; i < 3; i++) {
            snprintf(b, sizeof b, "%d", k);
            csend(r.c[i], "P", b);
        }
    usleep(20000);                               /* all of it in the server's kernel buffers */
    unsigned char f[8][512], ids[3][9];
    size_t l[8];
    int next[3] = {0, 0, 0}, nids = 0, first_ten[3] = {0, 0, 0};
    for (int got = 0; got < 60; got++) {
        REQUIRE(srecv(&r, f, l, 8, 2000) == 3);
        int who = -1;
        for (int i = 0; i < nids; i++)
            if (memcmp(ids[i], f[0], 9) == 0) who = i;
        if (who < 0) {
            REQUIRE(nids < 3);
            memcpy(ids[nids], f[0], 9);
            who = nids++;
        }
        f[2][l[2]] = 0;
        CHECK_EQ(atoi((char *)f[2]), next[who]);   /* each peer's messages in order */
        next[who]++;
        if (got < 12) first_ten[who]++;
    }
    /* Taken in turn: no peer waited for another's twenty. */
    for (int i = 0; i < 3; i++) CHECK(first_ten[i] >= 2);
    rig_close(&r);
}

/* A peer that writes as fast as the kernel takes: a thread with a
 * blocking socket (it never reads: the server's greeting fits in the
 * buffers). */
typedef struct flooder {
    struct sockaddr_in addr;
    int count, size;
} flooder;

static void *flood(void *arg)
{
    flooder *fl = arg;
    static const unsigned char G[64] = {0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 3, 0, 'N', 'U', 'L', 'L'};
    static const unsigned char READY[] = "\x04\x1c\x05READY\x0bSocket-Type\x00\x00\x00\x06" "DEALER";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(connect(fd, (struct sockaddr *)&fl->addr, sizeof fl->addr) == 0);
    REQUIRE(write(fd, G, 64) == 64);
    REQUIRE(write(fd, READY, sizeof READY - 1) == (ssize_t)(sizeof READY - 1));
    unsigned char *m = calloc(1, 16 + (size_t)fl->size);
    memcpy(m, "\x01\x01" "A", 3);
    m[3] = 2;                                    /* an 8-byte size */
    for (int i = 0; i < 8; i++) m[4 + i] = (unsigned char)((uint64_t)fl->size >> (56 - 8 * i));
    for (int k = 0; k < fl->count; k++) {
        size_t left = 12 + (size_t)fl->size, off = 0;
        while (left) {
            ssize_t w = write(fd, m + off, left);
            if (w <= 0) break;
            off += (size_t)w;
            left -= (size_t)w;
        }
    }
    free(m);
    shutdown(fd, SHUT_WR);
    return (void *)(intptr_t)fd;
}

static void test_a_busy_peer_does_not_shut_out_the_others(void)
{
    /* One peer always has more to send (its kernel buffer never drains);
     * another connects meanwhile: its connection is accepted and its
     * message read long before the first peer is done. */
    rig r;
    rig_open(&r, 16, 1 << 20, 0);
    flooder fl = {r.addr, 5000, 4000};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, flood, &fl) == 0);
    unsigned char f[8][512];
    size_t l[8];
    REQUIRE(srecv(&r, f, l, 8, 5000) == 3);      /* the flood has begun */
    r.c[0] = client_to(&r.addr, sizeof r.addr);
    r.nc = 1;
    csend(r.c[0], "B", "hello");
    int from_a = 1, b_after = -1;
    while (from_a < fl.count && b_after < 0) {
        usleep(100);                             /* a reader slower than the flood: its buffer stays full */
        int v;
        size_t len = sizeof v;
        fb_zmtp_getsockopt(r.c[0], FB_ZMTP_EVENTS, &v, &len);   /* B moves (the server only receives) */
        REQUIRE(srecv(&r, f, l, 8, 5000) == 3);
        if (f[1][0] == 'B') b_after = from_a;
        else from_a++;
    }
    CHECK(b_after >= 0 && b_after < fl.count / 2);
    while (from_a < fl.count && srecv(&r, f, l, 8, 5000) == 3) from_a++;
    CHECK_EQ(from_a, fl.count);
    void *fd;
    pthread_join(t, &fd);
    close((int)(intptr_t)fd);
    rig_close(&r);
}

static void test_a_peer_that_leaves(void)
{
    rig r;
    rig_open(&r, 16, 1 << 20, 2);
    connect_all(&r);
    unsigned char f[8][512], id[9];
    size_t l[8];
    id_of(&r, 0, id);
    /* Its last messages, then it closes: they are still received. */
    csend(r.c[0], "last", "2");
    csend(r.c[0], "last", "3");
    fb_zmtp_close(r.c[0], 1000);
    r.c[0] = NULL;
    usleep(20000);
    unsigned char gone[FB_ZMTP_SERVER_ID_LEN];
    CHECK_EQ(fb_zmtp_server_take_gone(r.s, gone), 0);      /* not before what it sent is read */
    CHECK_EQ(srecv(&r, f, l, 8, 2000), 3);
    CHECK(memcmp(f[0], id, 9) == 0 && f[2][0] == '2');
    CHECK_EQ(srecv(&r, f, l, 8, 2000), 3);
    CHECK(memcmp(f[0], id, 9) == 0 && f[2][0] == '3');
    CHECK_EQ(srecv(&r, f, l, 8, 200), 0);
    /* Then its loss is said, once: its id. */
    CHECK_EQ(fb_zmtp_server_take_gone(r.s, gone), FB_ZMTP_SERVER_ID_LEN);
    CHECK(memcmp(gone, id, 9) == 0);
    CHECK_EQ(fb_zmtp_server_take_gone(r.s, gone), 0);
    /* Its id names nothing now, even once its slot serves another peer. */
    CHECK_EQ(ssend(&r, id, 9, "x", "y"), EHOSTUNREACH);
    r.c[0] = client_to(&r.addr, sizeof r.addr);
    connect_all(&r);
    csend(r.c[0], "new", "4");
    CHECK_EQ(srecv(&r, f, l, 8, 2000), 3);
    CHECK(memcmp(f[0], id, 9) != 0);
    CHECK_EQ(ssend(&r, id, 9, "x", "y"), EHOSTUNREACH);
    CHECK_EQ(ssend(&r, f[0], 9, "x", "y"), 0);
    CHECK_EQ(crecv(&r, 0, f, l, 8, 2000), 2);
    fb_zmtp_server_stats st;
    fb_zmtp_server_get_stats(r.s, &st);
    CHECK_EQ(st.disconnects, 1);
    CHECK_EQ(st.connections, 2);
    rig_close(&r);
}

static void test_sndhwm_then_room_again(void)
{
    rig r;
    rig_open(&r, 4, 1 << 20, 1);
    connect_all(&r);
    unsigned char f[8][512], id[9];
    size_t l[8];
    id_of(&r, 0, id);
    /* The client does not read: the kernel's buffers fill, then sndhwm. */
    static char chunk[60000];
    memset(chunk, 'c', sizeof chunk - 1);
    int sent = 0, rc = 0;
    while (sent < 10000 && (rc = ssend(&r, id, 9, "D", chunk)) == 0) sent++;
    CHECK_EQ(rc, EAGAIN);
    CHECK(sent >= 4 && sent < 10000);
    /* The client reads: the descriptor says there is room, and all of it
     * arrives, in order. */
    int got = 0;
    while (got < sent) {
        int n = crecv(&r, 0, f, l, 8, 2000);
        if (n == 0) break;
        got++;
    }
    CHECK_EQ(got, sent);
    CHECK_EQ(ssend(&r, id, 9, "D", "again"), 0);
    CHECK_EQ(crecv(&r, 0, f, l, 8, 2000), 2);
    CHECK(l[1] == 5 && memcmp(f[1], "again", 5) == 0);
    rig_close(&r);
}

/* A raw peer: connect, write bytes, and see whether the server closed it. */
static int raw_peer(const struct sockaddr_in *a, const void *bytes, size_t n)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    REQUIRE(connect(fd, (const struct sockaddr *)a, sizeof *a) == 0);
    REQUIRE(write(fd, bytes, n) == (ssize_t)n);
    return fd;
}

static int closed_by_server(rig *r, int fd)
{
    unsigned char buf[4096];
    uint64_t until = fb_now_ns() + 2000000000u;
    while (fb_now_ns() < until) {
        unsigned char f[8][512];
        size_t l[8];
        CHECK_EQ(srecv(r, f, l, 8, 5), 0);         /* nothing of it is ever a message */
        ssize_t got = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (got == 0 || (got < 0 && errno == ECONNRESET)) return 1;
    }
    return 0;
}

static void test_bad_input_closes_that_connection(void)
{
    rig r;
    rig_open(&r, 16, 1000, 1);
    connect_all(&r);
    static const unsigned char G[64] = {0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 3, 0, 'N', 'U', 'L', 'L'};
    static const unsigned char READY[] = "\x04\x1c\x05READY\x0bSocket-Type\x00\x00\x00\x06" "DEALER";
    static const unsigned char READY_PUB[] = "\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB";
    unsigned char msg[64 + 64 + 16];
    int fd;
    /* Not ZMTP at all. */
    fd = raw_peer(&r.addr, "GET / HTTP/1.1\r\n\r\n" "0123456789012345678901234567890123456789012345678901234567890", 79);
    CHECK(closed_by_server(&r, fd));
    close(fd);
    /* Data before READY. */
    memcpy(msg, G, 64);
    memcpy(msg + 64, "\x00\x01x", 3);
    fd = raw_peer(&r.addr, msg, 67);
    CHECK(closed_by_server(&r, fd));
    close(fd);
    /* A socket type a ROUTER does not talk to. */
    memcpy(msg + 64, READY_PUB, sizeof READY_PUB - 1);
    fd = raw_peer(&r.addr, msg, 64 + sizeof READY_PUB - 1);
    CHECK(closed_by_server(&r, fd));
    close(fd);
    /* A frame over max_msg_bytes (1000), said by its 8-byte size. */
    memcpy(msg + 64, READY, sizeof READY - 1);
    size_t n = 64 + sizeof READY - 1;
    memcpy(msg + n, "\x02\x00\x00\x00\x00\x00\x00\x10\x00", 9);
    fd = raw_peer(&r.addr, msg, n + 9);
    CHECK(closed_by_server(&r, fd));
    close(fd);
    /* Reserved flag bits. */
    memcpy(msg + n, "\x40\x01x", 3);
    fd = raw_peer(&r.addr, msg, n + 3);
    CHECK(closed_by_server(&r, fd));
    close(fd);
    fb_zmtp_server_stats st;
    fb_zmtp_server_get_stats(r.s, &st);
    CHECK_EQ(st.protocol_errors, 5);
    /* The good peer was not disturbed. */
    csend(r.c[0], "still", "here");
    unsigned char f[8][512];
    size_t l[8];
    CHECK_EQ(srecv(&r, f, l, 8, 2000), 3);
    CHECK(l[1] == 5 && memcmp(f[1], "still", 5) == 0);
    rig_close(&r);
}

static void test_a_silent_connection_is_closed_after_the_handshake_time(void)
{
    rig r;
    rig_open(&r, 16, 1 << 20, 1);
    connect_all(&r);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(connect(fd, (struct sockaddr *)&r.addr, sizeof r.addr) == 0);
    int half = raw_peer(&r.addr, "\xff\0\0\0", 4);      /* a greeting begun, never finished */
    fb_zmtp_server_stats st;
    for (int i = 0; i < 200; i++) {
        pump(&r, 5);
        fb_zmtp_server_get_stats(r.s, &st);
        if (st.accepted == 3) break;
    }
    REQUIRE(st.accepted == 3);
    CHECK_EQ(fb_zmtp_server_expire(r.s, 10000000000ull), 0);   /* not yet */
    usleep(20000);
    CHECK_EQ(fb_zmtp_server_expire(r.s, 10000000u), 2);          /* 10 ms: both */
    CHECK(closed_by_server(&r, fd));
    CHECK(closed_by_server(&r, half));
    fb_zmtp_server_get_stats(r.s, &st);
    CHECK_EQ(st.handshake_timeouts, 2);
    CHECK_EQ(st.protocol_errors, 0);
    /* The peer that finished its handshake stays. */
    csend(r.c[0], "still", "here");
    unsigned char f[8][512];
    size_t l[8];
    CHECK_EQ(srecv(&r, f, l, 8, 2000), 3);
    close(fd);
    close(half);
    rig_close(&r);
}

static void test_unix_socket_listen(void)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/fb_zmtp_server_test_%d", (int)getpid());
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    strcpy(a.sun_path, path);
    /* A socket file nobody accepts on (a broker that died) is replaced. */
    int old = socket(AF_UNIX, SOCK_STREAM, 0);
    REQUIRE(bind(old, (struct sockaddr *)&a, sizeof a) == 0);
    close(old);
    fb_zmtp_server_options o;
    memset(&o, 0, sizeof o);
    o.sndhwm = 4;
    o.max_msg_bytes = 1 << 20;
    int err;
    fb_zmtp_server *s = fb_zmtp_server_new(&o, &err);
    REQUIRE(s != NULL);
    CHECK_EQ(fb_zmtp_server_listen(s, &a, sizeof a, NULL, NULL), 0);
    /* A live one is not. */
    fb_zmtp_server *s2 = fb_zmtp_server_new(&o, &err);
    CHECK_EQ(fb_zmtp_server_listen(s2, &a, sizeof a, NULL, NULL), EADDRINUSE);
    fb_zmtp_server_free(s2);
    rig r;
    memset(&r, 0, sizeof r);
    r.s = s;
    r.c[0] = client_to(&a, sizeof a);
    r.nc = 1;
    csend(r.c[0], "over", "ipc");
    unsigned char f[8][512];
    fb_zmq_msg m;
    size_t l[8];
    CHECK_EQ(srecv(&r, f, l, 8, 2000), 3);
    CHECK(l[2] == 3 && memcmp(f[2], "ipc", 3) == 0);
    csend(r.c[0], "again", "ipc");
    fb_zmtp_msg_init(&m);
    for (int tries = 0; fb_zmtp_server_msg_recv(&m, r.s, 0) < 0 && tries < 400; tries++) pump(&r, 5);
    CHECK(fb_zmtp_server_msg_gets(&m, "Peer-Address") == NULL);
    while (fb_zmtp_msg_more(&m)) fb_zmtp_server_msg_recv(&m, r.s, 0);
    rig_close(&r);
    unlink(path);
}

static void test_a_hundred_peers(void)
{
    /* Past the first 64 slots: the slot array and the ring grow (while
     * connections sit in the ring). */
    rig r;
    rig_open(&r, 16, 1 << 20, 100);
    char b[16];
    for (int i = 0; i < 100; i++) {
        snprintf(b, sizeof b, "%d", i);
        csend(r.c[i], "from", b);
    }
    unsigned char f[8][512], ids[100][9];
    size_t l[8];
    int seen[100] = {0};
    for (int got = 0; got < 100; got++) {
        REQUIRE(srecv(&r, f, l, 8, 5000) == 3);
        f[2][l[2]] = 0;
        int who = atoi((char *)f[2]);
        REQUIRE(who >= 0 && who < 100);
        CHECK_EQ(seen[who], 0);
        seen[who] = 1;
        memcpy(ids[who], f[0], 9);
    }
    /* Each answered behind its own id. */
    for (int i = 0; i < 100; i++) {
        snprintf(b, sizeof b, "%d", i);
        CHECK_EQ(ssend(&r, ids[i], 9, "to", b), 0);
    }
    for (int i = 0; i < 100; i++) {
        REQUIRE(crecv(&r, i, f, l, 8, 5000) == 2);
        f[1][l[1]] = 0;
        CHECK_EQ(atoi((char *)f[1]), i);
    }
    fb_zmtp_server_stats st;
    fb_zmtp_server_get_stats(r.s, &st);
    CHECK_EQ(st.connections, 100);
    rig_close(&r);
}

int main(void)
{
    RUN(test_messages_both_ways_behind_a_routing_id);
    RUN(test_peers_are_read_in_turn);
    RUN(test_a_busy_peer_does_not_shut_out_the_others);
    RUN(test_a_peer_that_leaves);
    RUN(test_sndhwm_then_room_again);
    RUN(test_bad_input_closes_that_connection);
    RUN(test_a_silent_connection_is_closed_after_the_handshake_time);
    RUN(test_unix_socket_listen);
    RUN(test_a_hundred_peers);
    CTEST_END();
}
