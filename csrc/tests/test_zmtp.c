/* Tests of fb_zmtp: a ZMTP DEALER connection against a peer played by
 * hand over a real loopback TCP socket (the bytes a libzmq ROUTER sends;
 * tests/test_zmtp_transport.py checks the same against libzmq itself).
 *
 * (Over 700 lines because each step of the connection's lifecycle is played
 * against a hand-written peer that all tests share.)
 */
#define _GNU_SOURCE
#include "ctest.h"
#include "fb_common.h"
#include "fb_resolve.h"
#include "fb_zmtp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

/* -- the peer ------------------------------------------------------------------ */

typedef struct peer {
    int listener;
    struct sockaddr_in addr;
    int fd;
} peer;

static void peer_listen(peer *p)
{
    memset(p, 0, sizeof *p);
    p->fd = -1;
    p->listener = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(p->listener >= 0);
    p->addr.sin_family = AF_INET;
    p->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(p->listener, (struct sockaddr *)&p->addr, sizeof p->addr) == 0);
    socklen_t len = sizeof p->addr;
    REQUIRE(getsockname(p->listener, (struct sockaddr *)&p->addr, &len) == 0);
    REQUIRE(listen(p->listener, 4) == 0);
}

/* Drive z (its calls are how it moves) until the peer's listener has a
 * connection to accept. */
static int peer_accept(peer *p, fb_zmtp *z, int ms)
{
    uint64_t until = fb_now_ns() + (uint64_t)ms * 1000000u;
    while (fb_now_ns() < until) {
        int ev = 0;
        size_t n = sizeof ev;
        fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &n);
        struct pollfd pl = {p->listener, POLLIN, 0};
        if (poll(&pl, 1, 5) == 1) {
            p->fd = accept(p->listener, NULL, NULL);
            return p->fd >= 0;
        }
    }
    return 0;
}

/* Read exactly n bytes from the client (driving z meanwhile: it writes
 * only when called). */
static int peer_read(peer *p, fb_zmtp *z, unsigned char *buf, size_t n)
{
    size_t got = 0;
    uint64_t until = fb_now_ns() + 2000000000u;
    while (got < n && fb_now_ns() < until) {
        int ev = 0;
        size_t len = sizeof ev;
        fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);
        struct pollfd pl = {p->fd, POLLIN, 0};
        if (poll(&pl, 1, 5) == 1) {
            ssize_t r = recv(p->fd, buf + got, n - got, 0);
            if (r <= 0) return 0;
            got += (size_t)r;
        }
    }
    return got == n;
}

static void peer_write(peer *p, const void *buf, size_t n)
{
    REQUIRE(send(p->fd, buf, n, MSG_NOSIGNAL) == (ssize_t)n);
}

static const unsigned char PEER_GREETING[64] = {0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 3, 0, 'N', 'U', 'L', 'L'};
static const unsigned char PEER_READY[] = "\x04\x1c\x05READY\x0bSocket-Type\x00\x00\x00\x06ROUTER";
#define PEER_READY_LEN (sizeof PEER_READY - 1)

/* Accept, check the client's greeting and READY, answer with ours. */
static void peer_handshake(peer *p, fb_zmtp *z)
{
    REQUIRE(peer_accept(p, z, 2000));
    unsigned char g[64 + 2 + 28];
    REQUIRE(peer_read(p, z, g, sizeof g));
    CHECK(g[0] == 0xFF && g[9] == 0x7F && g[10] == 3 && memcmp(g + 12, "NULL", 4) == 0);
    CHECK(g[64] == 4 && g[65] == 28 && memcmp(g + 66, "\x05READY\x0bSocket-Type\x00\x00\x00\x06" "DEALER", 28) == 0);
    peer_write(p, PEER_GREETING, 64);
    peer_write(p, PEER_READY, PEER_READY_LEN);
}

static void peer_close(peer *p)
{
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
}

/* The end of a test: the connection, the peer's end, its listener. */
static void finish(fb_zmtp *z, peer *p)
{
    fb_zmtp_close(z, 0);
    peer_close(p);
    close(p->listener);
}

static fb_zmtp *open_to(peer *p, int sndhwm, uint64_t max_msg)
{
    fb_zmtp_options o = {0};
    o.sndhwm = sndhwm;
    o.max_msg_bytes = max_msg;
    o.reconnect_ivl_ns = 20000000u;
    o.reconnect_ivl_max_ns = 40000000u;
    int err = 0;
    fb_zmtp *z = fb_zmtp_open(&p->addr, sizeof p->addr, &o, &err);
    REQUIRE(z != NULL);
    return z;
}

/* One message's frames off z, waiting up to ms for it: the count, or -1. */
static int recv_message(fb_zmtp *z, unsigned char frames[][512], size_t *lens, int max, int ms)
{
    uint64_t until = fb_now_ns() + (uint64_t)ms * 1000000u;
    int n = 0;
    fb_zmq_msg m;
    for (;;) {
        fb_zmtp_msg_init(&m);
        if (fb_zmtp_msg_recv(&m, z, FB_ZMTP_DONTWAIT) < 0) {
            fb_zmtp_msg_close(&m);
            CHECK_EQ(errno, EAGAIN);
            if (n) return -1;                    /* a message is given whole */
            if (fb_now_ns() >= until) return -1;
            int fd = 0;
            size_t len = sizeof fd;
            fb_zmtp_getsockopt(z, FB_ZMTP_FD, &fd, &len);
            struct pollfd pl = {fd, POLLIN, 0};
            poll(&pl, 1, 5);
            continue;
        }
        size_t size = fb_zmtp_msg_size(&m);
        if (n < max) {
            lens[n] = size;
            memcpy(frames[n], fb_zmtp_msg_data(&m), size < 512 ? size : 512);
        }
        n++;
        int more = fb_zmtp_msg_more(&m);
        fb_zmtp_msg_close(&m);
        if (!more) return n;
    }
}

/* -- tests ----------------------------------------------------------------------- */

static void test_handshake_and_messages_both_ways(void)
{
    peer p;
    peer_listen(&p);
    fb_zmtp *z = open_to(&p, 16, 1 << 20);
    /* Sent before the connection exists: queued, and it goes after the
     * handshake (as the client's HELLO does). */
    CHECK_EQ(fb_zmtp_send(z, "HELLO", 5, FB_ZMTP_SNDMORE), 5);
    CHECK_EQ(fb_zmtp_send(z, "{}", 2, 0), 2);
    CHECK(!fb_zmtp_connected(z));
    peer_handshake(&p, z);
    unsigned char got[2 + 5 + 2 + 2];
    REQUIRE(peer_read(&p, z, got, sizeof got));
    CHECK(memcmp(got, "\x01\x05HELLO\x00\x02{}", sizeof got) == 0);
    CHECK(fb_zmtp_connected(z));

    /* From the peer: a short frame, then a long one (8-byte size). */
    static unsigned char big[300];
    memset(big, 'x', sizeof big);
    unsigned char hdr[9] = {0x02, 0, 0, 0, 0, 0, 0, 0x01, 0x2c};
    peer_write(&p, "\x01\x04" "DATA", 6);
    peer_write(&p, hdr, 9);
    peer_write(&p, big, sizeof big);
    unsigned char frames[4][512];
    size_t lens[4];
    CHECK_EQ(recv_message(z, frames, lens, 4, 2000), 2);
    CHECK_EQ(lens[0], 4);
    CHECK(memcmp(frames[0], "DATA", 4) == 0);
    CHECK_EQ(lens[1], 300);
    CHECK(memcmp(frames[1], big, 300) == 0);
    int more = 1;
    size_t len = sizeof more;
    CHECK_EQ(fb_zmtp_getsockopt(z, FB_ZMTP_RCVMORE, &more, &len), 0);
    CHECK_EQ(more, 0);

    /* To the peer: a long frame goes with an 8-byte size. */
    CHECK_EQ(fb_zmtp_send(z, big, sizeof big, 0), 300);
    unsigned char out[9 + 300];
    REQUIRE(peer_read(&p, z, out, sizeof out));
    CHECK(memcmp(out, hdr, 9) == 0);
    fb_zmtp_stats st;
    fb_zmtp_get_stats(z, &st);
    CHECK_EQ(st.connects, 1);
    CHECK_EQ(st.disconnects, 0);
    finish(z, &p);
}

static void test_a_message_is_given_whole(void)
{
    peer p;
    peer_listen(&p);
    fb_zmtp *z = open_to(&p, 16, 1 << 20);
    peer_handshake(&p, z);
    /* The first frame alone: nothing yet, and EVENTS says no input. */
    peer_write(&p, "\x01\x03" "PUB", 5);
    usleep(20000);
    fb_zmq_msg m;
    fb_zmtp_msg_init(&m);
    CHECK_EQ(fb_zmtp_msg_recv(&m, z, FB_ZMTP_DONTWAIT), -1);
    CHECK_EQ(errno, EAGAIN);
    int ev = 0;
    size_t len = sizeof ev;
    fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);
    CHECK(!(ev & FB_ZMTP_POLLIN));
    CHECK(ev & FB_ZMTP_POLLOUT);
    /* The FD wakes a poller when the rest comes. */
    int fd = 0;
    len = sizeof fd;
    fb_zmtp_getsockopt(z, FB_ZMTP_FD, &fd, &len);
    struct pollfd pl = {fd, POLLIN, 0};
    CHECK_EQ(poll(&pl, 1, 0), 0);
    peer_write(&p, "\x00\x02hi", 4);
    CHECK_EQ(poll(&pl, 1, 2000), 1);
    len = sizeof ev;
    fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);
    CHECK(ev & FB_ZMTP_POLLIN);
    /* Read into the connection: the descriptor no longer shows it (the
     * kernel's socket is empty), fb_zmtp_buffered does. */
    CHECK_EQ(poll(&pl, 1, 0), 0);
    CHECK(fb_zmtp_buffered(z));
    CHECK(fb_zmtp_pending(z));
    unsigned char frames[4][512];
    size_t lens[4];
    CHECK_EQ(recv_message(z, frames, lens, 4, 2000), 2);
    CHECK(lens[1] == 2 && memcmp(frames[1], "hi", 2) == 0);
    /* All the kernel had was read: a reader can go to the poll at once. */
    CHECK(!fb_zmtp_pending(z));
    /* Read to EAGAIN, the FD is quiet again (the kernel holds nothing for it). */
    len = sizeof ev;
    fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);
    CHECK(!(ev & FB_ZMTP_POLLIN));
    CHECK(!fb_zmtp_buffered(z));
    CHECK_EQ(poll(&pl, 1, 0), 0);
    fb_zmtp_msg_close(&m);
    finish(z, &p);
}

static void test_sndhwm_and_a_full_kernel_buffer(void)
{
    peer p;
    peer_listen(&p);
    fb_zmtp *z = open_to(&p, 4, 1 << 20);
    /* Not connected yet (not accepted): four messages queue, the fifth is
     * refused, the frames after a message's first are always taken. */
    for (int i = 0; i < 4; i++) CHECK_EQ(fb_zmtp_send(z, "m", 1, 0), 1);
    CHECK_EQ(fb_zmtp_send(z, "m", 1, 0), -1);
    CHECK_EQ(errno, EAGAIN);
    int ev = 0;
    size_t len = sizeof ev;
    fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);
    CHECK(!(ev & FB_ZMTP_POLLOUT));
    peer_handshake(&p, z);
    unsigned char got[12];
    REQUIRE(peer_read(&p, z, got, sizeof got));
    CHECK(memcmp(got, "\x00\x01m\x00\x01m\x00\x01m\x00\x01m", 12) == 0);
    CHECK_EQ(fb_zmtp_send(z, "m", 1, 0), 1);
    REQUIRE(peer_read(&p, z, got, 3));

    /* The peer stops reading: the kernel's buffers fill, then sndhwm. */
    static unsigned char chunk[65536];
    int sent = 0, refused = 0;
    for (int i = 0; i < 10000 && !refused; i++) {
        if (fb_zmtp_send(z, chunk, sizeof chunk, 0) < 0) refused = errno == EAGAIN;
        else sent++;
    }
    CHECK(refused);
    CHECK(sent >= 4);
    /* The peer reads everything: what was queued arrives whole, in order. */
    size_t total = (size_t)sent * (9 + sizeof chunk), got_bytes = 0;
    static unsigned char sink[1 << 16];
    uint64_t until = fb_now_ns() + 5000000000u;
    while (got_bytes < total && fb_now_ns() < until) {
        len = sizeof ev;
        fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);
        struct pollfd pl = {p.fd, POLLIN, 0};
        if (poll(&pl, 1, 5) == 1) {
            ssize_t r = recv(p.fd, sink, sizeof sink, 0);
            if (r <= 0) break;
            got_bytes += (size_t)r;
        }
    }
    CHECK_EQ(got_bytes, total);
    len = sizeof ev;
    fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);
    CHECK(ev & FB_ZMTP_POLLOUT);
    /* All sent: the descriptor is quiet (room is asked for only while
     * bytes wait for it: it is level-triggered). */
    int fd = 0;
    len = sizeof fd;
    fb_zmtp_getsockopt(z, FB_ZMTP_FD, &fd, &len);
    struct pollfd pl = {fd, POLLIN, 0};
    CHECK_EQ(poll(&pl, 1, 0), 0);
    finish(z, &p);
}

static void test_a_lost_connection_keeps_whole_messages_and_comes_back(void)
{
    peer p;
    peer_listen(&p);
    fb_zmtp *z = open_to(&p, 16, 1 << 20);
    peer_handshake(&p, z);
    /* Two whole messages and half of a third, then the peer goes. */
    peer_write(&p, "\x00\x03one\x01\x03two\x00\x01!\x01\x05three", 19);
    usleep(20000);
    int ev = 0;
    size_t len = sizeof ev;
    fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);  /* reads it all */
    peer_close(&p);
    usleep(20000);
    /* The whole messages read before it went are still given. */
    unsigned char frames[4][512];
    size_t lens[4];
    CHECK_EQ(recv_message(z, frames, lens, 4, 2000), 1);
    CHECK(lens[0] == 3 && memcmp(frames[0], "one", 3) == 0);
    CHECK(fb_zmtp_connected(z));                /* (the end is read after them) */
    CHECK_EQ(recv_message(z, frames, lens, 4, 2000), 2);
    CHECK(lens[0] == 3 && memcmp(frames[0], "two", 3) == 0 && lens[1] == 1);
    len = sizeof ev;
    fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);
    CHECK(!(ev & FB_ZMTP_POLLIN));
    CHECK(!fb_zmtp_connected(z));
    /* A message sent now is for the next connection. */
    CHECK_EQ(fb_zmtp_send(z, "again", 5, 0), 5);
    /* It connects again by itself (driven by its calls), handshakes, and
     * what was queued since goes; the half message is gone. */
    peer_handshake(&p, z);
    unsigned char got[7];
    REQUIRE(peer_read(&p, z, got, sizeof got));
    CHECK(memcmp(got, "\x00\x05" "again", 7) == 0);
    fb_zmq_msg m;
    fb_zmtp_msg_init(&m);
    CHECK_EQ(fb_zmtp_msg_recv(&m, z, 0), -1);
    fb_zmtp_msg_close(&m);
    fb_zmtp_stats st;
    fb_zmtp_get_stats(z, &st);
    CHECK_EQ(st.connects, 2);
    CHECK_EQ(st.disconnects, 1);
    CHECK_EQ(st.protocol_errors, 0);
    finish(z, &p);
}

static void test_bad_input_closes_the_connection(void)
{
    static const char *bad[] = {
        "\x08\x01x",                             /* a reserved flag bit */
        "\x05\x01x",                             /* a command with "more" */
        "\x01\x01x\x04\x04\x04PING",             /* a command inside a message */
        "\x02\x00\x00\x00\x00\x00\x10\x00\x01",  /* a frame over max_msg_bytes (1 MiB) */
    };
    static const size_t bad_len[] = {3, 3, 9, 9};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        peer p;
        peer_listen(&p);
        fb_zmtp *z = open_to(&p, 16, 1 << 20);
        peer_handshake(&p, z);
        unsigned char frames[4][512];
        size_t lens[4];
        peer_write(&p, bad[i], bad_len[i]);
        CHECK_EQ(recv_message(z, frames, lens, 4, 100), -1);
        fb_zmtp_stats st;
        fb_zmtp_get_stats(z, &st);
        CHECK_EQ(st.protocol_errors, 1);
        CHECK(!fb_zmtp_connected(z));
        peer_close(&p);
        /* ...and it connects again. */
        peer_handshake(&p, z);
        peer_write(&p, "\x00\x02ok", 4);
        CHECK_EQ(recv_message(z, frames, lens, 4, 2000), 1);
        CHECK(lens[0] == 2 && memcmp(frames[0], "ok", 2) == 0);
        finish(z, &p);
    }
    /* A peer that is not ZMTP, or not a ROUTER. */
    for (int i = 0; i < 2; i++) {
        peer p;
        peer_listen(&p);
        fb_zmtp *z = open_to(&p, 16, 1 << 20);
        REQUIRE(peer_accept(&p, z, 2000));
        unsigned char g[94];
        REQUIRE(peer_read(&p, z, g, sizeof g));
        if (i == 0) {
            peer_write(&p, "HTTP/1.1 400 Bad Request\r\n\r\n" "................................................", 64);
        } else {
            peer_write(&p, PEER_GREETING, 64);
            peer_write(&p, "\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB", 27);
        }
        unsigned char frames[4][512];
        size_t lens[4];
        CHECK_EQ(recv_message(z, frames, lens, 4, 100), -1);
        fb_zmtp_stats st;
        fb_zmtp_get_stats(z, &st);
        CHECK_EQ(st.protocol_errors, 1);
        CHECK_EQ(st.connects, 0);
        finish(z, &p);
    }
}

static void test_ping_is_answered_between_messages(void)
{
    peer p;
    peer_listen(&p);
    fb_zmtp *z = open_to(&p, 16, 1 << 20);
    peer_handshake(&p, z);
    /* A message being built when the PING arrives: the PONG goes before it. */
    CHECK_EQ(fb_zmtp_send(z, "A", 1, FB_ZMTP_SNDMORE), 1);
    peer_write(&p, "\x04\x09\x04PING\x00\x0a" "ab", 11);
    peer_write(&p, "\x00\x01z", 3);
    unsigned char frames[4][512];
    size_t lens[4];
    CHECK_EQ(recv_message(z, frames, lens, 4, 2000), 1);
    CHECK_EQ(fb_zmtp_send(z, "B", 1, 0), 1);
    unsigned char got[9 + 6];
    REQUIRE(peer_read(&p, z, got, sizeof got));
    CHECK(memcmp(got, "\x04\x07\x04PONGab\x01\x01" "A\x00\x01" "B", sizeof got) == 0);
    finish(z, &p);
}

static void test_nobody_listening_is_tried_again(void)
{
    peer p;
    peer_listen(&p);
    close(p.listener);                           /* the port is free: refused */
    fb_zmtp *z = open_to(&p, 16, 1 << 20);
    CHECK_EQ(fb_zmtp_send(z, "HELLO", 5, 0), 5);
    int ev = 0;
    size_t len = sizeof ev;
    for (int i = 0; i < 5; i++) {
        fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);
        usleep(10000);
    }
    /* The listener comes (the same port), and the queued HELLO arrives. */
    p.listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(p.listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    REQUIRE(bind(p.listener, (struct sockaddr *)&p.addr, sizeof p.addr) == 0);
    REQUIRE(listen(p.listener, 4) == 0);
    /* The reconnect timer makes the FD readable: a poller need not spin. */
    int fd = 0;
    len = sizeof fd;
    fb_zmtp_getsockopt(z, FB_ZMTP_FD, &fd, &len);
    struct pollfd pl = {fd, POLLIN, 0};
    CHECK_EQ(poll(&pl, 1, 1000), 1);
    peer_handshake(&p, z);
    unsigned char got[7];
    REQUIRE(peer_read(&p, z, got, sizeof got));
    CHECK(memcmp(got, "\x00\x05HELLO", 7) == 0);
    finish(z, &p);
}

static void test_close_lingers_only_for_what_is_queued(void)
{
    peer p;
    peer_listen(&p);
    close(p.listener);                           /* nobody there */
    fb_zmtp *z = open_to(&p, 16, 1 << 20);
    uint64_t t0 = fb_now_ns();
    fb_zmtp_close(z, 2000);                      /* nothing queued: at once */
    CHECK(fb_now_ns() - t0 < 500000000u);
    z = open_to(&p, 16, 1 << 20);
    CHECK_EQ(fb_zmtp_send(z, "HELLO", 5, 0), 5);
    t0 = fb_now_ns();
    fb_zmtp_close(z, 200);                       /* a message that cannot go: the linger */
    CHECK(fb_now_ns() - t0 >= 150000000u);
}

/* Read one single-frame message's bytes from the peer: "\x00" len body. */
static int peer_expect(peer *p, fb_zmtp *z, const char *body)
{
    unsigned char got[258];
    size_t n = strlen(body);
    if (!peer_read(p, z, got, n + 2)) return 0;
    return got[0] == 0 && got[1] == n && memcmp(got + 2, body, n) == 0;
}

static void test_a_reconnect_message_goes_first_on_every_new_connection(void)
{
    peer p;
    peer_listen(&p);
    fb_zmtp *z = open_to(&p, 16, 1 << 20);
    const void *frames[1] = {"back"};
    size_t lens[1] = {4};
    REQUIRE(fb_zmtp_set_reconnect_message(z, frames, lens, 1) == 0);
    peer_handshake(&p, z);
    CHECK_EQ(fb_zmtp_send(z, "first", 5, 0), 5);
    CHECK(peer_expect(&p, z, "first"));         /* not on the first connection */
    peer_close(&p);
    int ev = 0;
    size_t len = sizeof ev;
    for (int i = 0; i < 50 && fb_zmtp_connected(z); i++) {
        fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);   /* reads the end */
        usleep(2000);
    }
    CHECK(!fb_zmtp_connected(z));
    CHECK_EQ(fb_zmtp_send(z, "queued", 6, 0), 6);
    peer_handshake(&p, z);
    CHECK(peer_expect(&p, z, "back"));          /* ahead of what waited */
    CHECK(peer_expect(&p, z, "queued"));
    finish(z, &p);
}

static void test_resend_keeps_what_is_counted_until_acknowledged(void)
{
    peer p;
    peer_listen(&p);
    fb_zmtp *z = open_to(&p, 16, 1 << 20);
    REQUIRE(fb_zmtp_set_resend(z, (const unsigned char *)"P", 1, 40) == 0);
    peer_handshake(&p, z);
    uint64_t counted, acked;
    size_t kept;
    int held;
    CHECK_EQ(fb_zmtp_send(z, "Pone", 4, 0), 4);
    CHECK_EQ(fb_zmtp_send(z, "ping", 4, 0), 4);  /* not counted */
    CHECK_EQ(fb_zmtp_send(z, "Ptwo", 4, 0), 4);
    CHECK(peer_expect(&p, z, "Pone") && peer_expect(&p, z, "ping") && peer_expect(&p, z, "Ptwo"));
    fb_zmtp_resend_state(z, &counted, &acked, &kept, &held);
    CHECK(counted == 2 && acked == 0 && kept == 12 && !held);
    fb_zmtp_acked(z, 1);
    fb_zmtp_resend_state(z, &counted, &acked, &kept, &held);
    CHECK(acked == 1 && kept == 6);
    /* The bound: counted messages wait (EAGAIN) past it; others do not. */
    CHECK_EQ(fb_zmtp_send(z, "Pthree....", 10, 0), 10);
    CHECK_EQ(fb_zmtp_send(z, "Pfour.....", 10, 0), 10);
    CHECK_EQ(fb_zmtp_send(z, "Pfive.....", 10, 0), 10);
    errno = 0;
    CHECK_EQ(fb_zmtp_send(z, "Psix", 4, 0), -1);
    CHECK_EQ(errno, EAGAIN);
    CHECK_EQ(fb_zmtp_send(z, "ping", 4, 0), 4);
    CHECK(peer_expect(&p, z, "Pthree....") && peer_expect(&p, z, "Pfour.....") && peer_expect(&p, z, "Pfive.....")
          && peer_expect(&p, z, "ping"));
    fb_zmtp_acked(z, 4);                        /* the peer took two, three and four */
    /* The connection is lost: what is counted from now on is held. */
    peer_close(&p);
    int ev = 0;
    size_t len = sizeof ev;
    for (int i = 0; i < 50 && !held; i++) {
        fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);   /* reads the end */
        fb_zmtp_resend_state(z, &counted, &acked, &kept, &held);
        usleep(2000);
    }
    CHECK(held);
    CHECK_EQ(fb_zmtp_send(z, "Pseven", 6, 0), 6);
    CHECK_EQ(fb_zmtp_send(z, "hello", 5, 0), 5);
    peer_handshake(&p, z);
    CHECK(peer_expect(&p, z, "hello"));         /* the held message waits for the resume */
    /* The peer's session goes on, holding 4: five again, then seven. */
    CHECK_EQ(fb_zmtp_resume(z, 4, FB_ZMTP_RESUMED), 0);
    CHECK(peer_expect(&p, z, "Pfive.....") && peer_expect(&p, z, "Pseven"));
    fb_zmtp_resend_state(z, &counted, &acked, &kept, &held);
    CHECK(counted == 6 && acked == 4 && !held);
    /* Lost again, and the peer has a new session: what went on the old
     * connection (five, seven) is dropped, what never went goes, numbered anew. */
    peer_close(&p);
    held = 0;
    for (int i = 0; i < 50 && !held; i++) {
        fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);
        fb_zmtp_resend_state(z, &counted, &acked, &kept, &held);
        usleep(2000);
    }
    CHECK(held);
    CHECK_EQ(fb_zmtp_send(z, "Peight", 6, 0), 6);
    peer_handshake(&p, z);
    CHECK_EQ(fb_zmtp_resume(z, 0, FB_ZMTP_FRESH), 2);
    CHECK(peer_expect(&p, z, "Peight"));
    fb_zmtp_resend_state(z, &counted, &acked, &kept, &held);
    CHECK(counted == 1 && acked == 0 && kept == 8 && !held);
    finish(z, &p);
}

static int count_kept(void *arg, const unsigned char *first, size_t first_len, const unsigned char *last,
                      size_t last_len)
{
    size_t *sum = arg;
    (void)first;
    (void)last;
    *sum += first_len * 1000 + last_len;        /* each message's two sizes, checkable at once */
    return 0;
}

static void test_a_lost_connection_is_said_once_and_what_is_kept_is_walked(void)
{
    peer p;
    peer_listen(&p);
    fb_zmtp *z = open_to(&p, 16, 1 << 20);
    REQUIRE(fb_zmtp_set_resend(z, (const unsigned char *)"P", 1, 1 << 20) == 0);
    CHECK(!fb_zmtp_take_lost(z));               /* (never up yet) */
    peer_handshake(&p, z);
    CHECK_EQ(fb_zmtp_send(z, "P", 1, FB_ZMTP_SNDMORE), 1);
    CHECK_EQ(fb_zmtp_send(z, "batch", 5, 0), 5);
    CHECK_EQ(fb_zmtp_send(z, "Pone", 4, 0), 4);
    size_t sum = 0;
    CHECK_EQ(fb_zmtp_kept_each(z, count_kept, &sum), 2);
    CHECK_EQ(sum, 1 * 1000 + 5 + 4 * 1000 + 4);
    CHECK(!fb_zmtp_take_lost(z));
    peer_close(&p);
    int ev = 0, lost = 0;
    size_t len = sizeof ev;
    for (int i = 0; i < 50 && !lost; i++) {
        fb_zmtp_getsockopt(z, FB_ZMTP_EVENTS, &ev, &len);   /* reads the end */
        lost = fb_zmtp_take_lost(z);
        usleep(2000);
    }
    CHECK(lost);
    CHECK(!fb_zmtp_take_lost(z));               /* once */
    fb_zmtp_acked(z, 1);
    sum = 0;
    CHECK_EQ(fb_zmtp_kept_each(z, count_kept, &sum), 1);
    CHECK_EQ(sum, 4 * 1000 + 4);
    peer_handshake(&p, z);
    CHECK(!fb_zmtp_take_lost(z));
    finish(z, &p);
}

/* The address a name gave moved: after a loss, the name is looked up again
 * (here the numeric "127.0.0.1": the lookup is real, its answer known) and
 * the connection goes where it points now. */
static void test_a_host_name_is_looked_up_again_after_a_loss(void)
{
    peer p;
    peer_listen(&p);
    struct sockaddr_in old = p.addr;
    old.sin_addr.s_addr = htonl(0x7F000002);      /* 127.0.0.2: nobody listens there */
    fb_zmtp_options o = {0};
    o.sndhwm = 16;
    o.max_msg_bytes = 1 << 20;
    o.reconnect_ivl_ns = 20000000u;
    o.reconnect_ivl_max_ns = 40000000u;
    int err = 0;
    fb_zmtp *z = fb_zmtp_open(&old, sizeof old, &o, &err);
    REQUIRE(z != NULL);
    CHECK_EQ(fb_zmtp_set_host(z, "127.0.0.1"), 0);
    CHECK_EQ(fb_zmtp_send(z, "HELLO", 5, 0), 5);
    peer_handshake(&p, z);
    unsigned char got[7];
    REQUIRE(peer_read(&p, z, got, sizeof got));
    CHECK(memcmp(got, "\x00\x05HELLO", 7) == 0);
    struct sockaddr_in now;
    size_t len = sizeof now;
    CHECK_EQ(fb_zmtp_address(z, &now, &len), 0);
    CHECK_EQ(len, sizeof now);
    CHECK(now.sin_addr.s_addr == htonl(INADDR_LOOPBACK) && now.sin_port == p.addr.sin_port);
    fb_zmtp_stats st;
    fb_zmtp_get_stats(z, &st);
    CHECK(st.lookups >= 1);
    CHECK_EQ(st.address_changes, 1);
    CHECK_EQ(st.lookup_failures, 0);
    len = 2;
    CHECK_EQ(fb_zmtp_address(z, &now, &len), -1);  /* no room: said, nothing written past it */
    finish(z, &p);

    /* Not a TCP address: no name to follow. */
    struct sockaddr un = {.sa_family = AF_UNIX};
    z = fb_zmtp_open(&un, sizeof un, &o, &err);
    REQUIRE(z != NULL);
    CHECK_EQ(fb_zmtp_set_host(z, "localhost"), -1);
    fb_zmtp_close(z, 0);
}

/* A resolver let go while its lookup runs: the lookup's thread frees it. */
static void test_a_resolver_freed_while_it_looks_up(void)
{
    fb_resolver *r = fb_resolver_new("localhost", 80);
    REQUIRE(r != NULL);
    CHECK_EQ(fb_resolver_start(r), 0);
    CHECK_EQ(fb_resolver_start(r), 0);             /* one runs already: no second */
    fb_resolver_free(r);
    usleep(100000);                                /* (ASan says whether it leaked or was used after) */

    r = fb_resolver_new("127.0.0.1", 6464);
    REQUIRE(r != NULL);
    struct sockaddr_storage a;
    memset(&a, 0, sizeof a);
    size_t len = 0;
    CHECK_EQ(fb_resolver_take(r, &a, &len, sizeof a), 0);   /* nothing looked up yet */
    CHECK_EQ(fb_resolver_start(r), 0);
    fb_resolver_stats st = {0};
    for (int i = 0; i < 200 && st.lookups == 0; i++) {
        usleep(5000);
        fb_resolver_get_stats(r, &st);
    }
    CHECK_EQ(st.lookups, 1);
    CHECK_EQ(fb_resolver_take(r, &a, &len, sizeof a), 1);
    CHECK_EQ(len, sizeof(struct sockaddr_in));
    CHECK_EQ(ntohs(((struct sockaddr_in *)&a)->sin_port), 6464);
    CHECK_EQ(fb_resolver_take(r, &a, &len, sizeof a), 0);   /* taken once */
    CHECK_EQ(fb_resolver_start(r), 0);
    for (int i = 0; i < 200 && st.lookups < 2; i++) {
        usleep(5000);
        fb_resolver_get_stats(r, &st);
    }
    CHECK_EQ(fb_resolver_take(r, &a, &len, sizeof a), 0);   /* the same address: no change */
    fb_resolver_get_stats(r, &st);
    CHECK_EQ(st.changes, 1);
    fb_resolver_free(r);
    CHECK(fb_resolver_new(NULL, 1) == NULL);
}

int main(void)
{
    RUN(test_handshake_and_messages_both_ways);
    RUN(test_a_message_is_given_whole);
    RUN(test_sndhwm_and_a_full_kernel_buffer);
    RUN(test_a_lost_connection_keeps_whole_messages_and_comes_back);
    RUN(test_bad_input_closes_the_connection);
    RUN(test_ping_is_answered_between_messages);
    RUN(test_nobody_listening_is_tried_again);
    RUN(test_close_lingers_only_for_what_is_queued);
    RUN(test_a_reconnect_message_goes_first_on_every_new_connection);
    RUN(test_resend_keeps_what_is_counted_until_acknowledged);
    RUN(test_a_lost_connection_is_said_once_and_what_is_kept_is_walked);
    RUN(test_a_host_name_is_looked_up_again_after_a_loss);
    RUN(test_a_resolver_freed_while_it_looks_up);
    CTEST_END();
}
