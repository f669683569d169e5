/* Tests of fb_zmtp_wire: the reading of a peer's input that both ends of
 * a connection use (fb_zmtp.c, fb_zmtp_server.c), on well-formed streams
 * cut at every byte and on random and mutated bytes (under ASan, a read
 * past the input fails the run). */
#include "ctest.h"
#include "fb_zmtp_wire.h"

#include <stdint.h>

/* A frame appended to buf at *n (flags: 1 more, 4 command). */
static void frame(unsigned char *buf, size_t *n, int flags, const void *body, size_t len)
{
    *n += fb_zmtp_frame_header(buf + *n, flags, len);
    memcpy(buf + *n, body, len);
    *n += len;
}

/* An exact copy of p[0, len) in a buffer of its own size, so that ASan
 * sees any read past it. */
static unsigned char *exact(const unsigned char *p, size_t len)
{
    unsigned char *q = malloc(len ? len : 1);
    REQUIRE(q != NULL);
    memcpy(q, p, len);
    return q;
}

static void test_a_stream_read_message_by_message_and_cut_anywhere(void)
{
    static unsigned char big[300];
    unsigned char buf[2048];
    size_t n = 0;
    memset(big, 'b', sizeof big);
    frame(buf, &n, 4, "\x04PING\x00\x0a" "ctx", 10);         /* a command between messages */
    frame(buf, &n, 1, "P", 1);
    frame(buf, &n, 0, big, sizeof big);                      /* an 8-byte size */
    size_t first_end = n;
    frame(buf, &n, 0, "single", 6);
    /* Read as a receiver does: a command, then whole messages. */
    size_t off = 0, body, need;
    uint64_t size;
    CHECK_EQ(fb_zmtp_next(buf, n, 1, 1 << 20, &body, &size, &need), FB_ZMTP_COMMAND);
    CHECK(fb_zmtp_is_command(buf + body, size, "PING"));
    off = body + size;
    CHECK_EQ(fb_zmtp_next(buf + off, n - off, 1, 1 << 20, &body, &size, &need), FB_ZMTP_MESSAGE);
    CHECK_EQ(fb_zmtp_whole_end(buf, n, 0, 1 << 20), n);
    CHECK_EQ(fb_zmtp_skip_commands(buf, n), off);
    /* Cut at every byte: never a message that is not all there. */
    for (size_t cut = 0; cut < n; cut++) {
        unsigned char *p = exact(buf, cut);
        int r = fb_zmtp_next(p, cut, 1, 1 << 20, &body, &size, &need);
        if (cut < 12) CHECK(r == FB_ZMTP_PARTIAL);            /* the command's 2 + 10 bytes */
        else CHECK(r == FB_ZMTP_COMMAND);
        size_t w = fb_zmtp_whole_end(p, cut, 0, 1 << 20);
        CHECK(w == (cut < 12 ? 0 : cut < first_end ? 12 : first_end));
        if (cut >= 12) {
            r = fb_zmtp_next(p + 12, cut - 12, 1, 1 << 20, &body, &size, &need);
            CHECK(r == (cut < first_end ? FB_ZMTP_PARTIAL : FB_ZMTP_MESSAGE));
            if (r == FB_ZMTP_PARTIAL && cut > 12 + 3 + 9) CHECK(need == first_end - cut);   /* inside the 300 bytes */
        }
        free(p);
    }
    /* Before the handshake data is refused; over max_msg too. */
    CHECK_EQ(fb_zmtp_next(buf + 12, n - 12, 0, 1 << 20, &body, &size, &need), FB_ZMTP_BAD);
    CHECK_EQ(fb_zmtp_next(buf + 12, n - 12, 1, 300, &body, &size, &need), FB_ZMTP_BAD);   /* 1 + 300 bytes */
    CHECK_EQ(fb_zmtp_next(buf + 12, n - 12, 1, 301, &body, &size, &need), FB_ZMTP_MESSAGE);
    CHECK_EQ(fb_zmtp_whole_end(buf, n, 0, 300), 12);         /* a lost connection keeps what was valid */
}

static void test_what_a_peer_may_not_send(void)
{
    unsigned char buf[64];
    size_t n, body, need;
    uint64_t size;
    /* Reserved flag bits. */
    CHECK_EQ(fb_zmtp_next((const unsigned char *)"\x10\x01x", 3, 1, 100, &body, &size, &need), FB_ZMTP_BAD);
    /* A command with "more". */
    CHECK_EQ(fb_zmtp_next((const unsigned char *)"\x05\x01x", 3, 1, 100, &body, &size, &need), FB_ZMTP_BAD);
    /* A command inside a message. */
    n = 0;
    frame(buf, &n, 1, "a", 1);
    frame(buf, &n, 4, "\x04PING", 5);
    CHECK_EQ(fb_zmtp_next(buf, n, 1, 100, &body, &size, &need), FB_ZMTP_BAD);
    /* A command over FB_ZMTP_MAX_COMMAND, said before its body arrives. */
    unsigned char h[9];
    size_t hl = fb_zmtp_frame_header(h, 4, FB_ZMTP_MAX_COMMAND + 1);
    CHECK_EQ(fb_zmtp_next(h, hl, 1, 100, &body, &size, &need), FB_ZMTP_BAD);
    /* A size near 2^64 is refused, not added. */
    memcpy(h, "\x02\xff\xff\xff\xff\xff\xff\xff\xf0", 9);
    CHECK_EQ(fb_zmtp_next(h, 9, 1, UINT64_MAX, &body, &size, &need), FB_ZMTP_PARTIAL);
    CHECK(need > 0);
    CHECK_EQ(fb_zmtp_next(h, 9, 1, 1 << 20, &body, &size, &need), FB_ZMTP_BAD);
    CHECK_EQ(fb_zmtp_whole_end(h, 9, 0, UINT64_MAX), 0);
    /* Two frames whose sum passes max_msg. */
    n = 0;
    frame(buf, &n, 1, "0123456789", 10);
    frame(buf, &n, 0, "0123456789", 10);
    CHECK_EQ(fb_zmtp_next(buf, n, 1, 19, &body, &size, &need), FB_ZMTP_BAD);
    CHECK_EQ(fb_zmtp_next(buf, n, 1, 20, &body, &size, &need), FB_ZMTP_MESSAGE);
}

static void test_random_and_mutated_bytes(void)
{
    unsigned char valid[512];
    size_t vn = 0;
    frame(valid, &vn, 4, "\x05READY\x0bSocket-Type\x00\x00\x00\x06" "DEALER", 28);
    frame(valid, &vn, 1, "P", 1);
    frame(valid, &vn, 0, "0123456789abcdef", 16);
    for (int round = 0; round < 200000; round++) {
        unsigned char src[600];
        size_t len;
        if (round & 1) {                                  /* random bytes, mostly small flags */
            len = rndn(64);
            for (size_t i = 0; i < len; i++) src[i] = (unsigned char)(rndn(4) ? rndn(8) : rnd());
        } else {                                          /* the valid stream, a few bytes changed */
            len = vn;
            memcpy(src, valid, vn);
            for (int k = rndn(4); k >= 0; k--) src[rndn((unsigned)vn)] = (unsigned char)rnd();
            len = rndn((unsigned)len + 1);
        }
        unsigned char *p = exact(src, len);
        size_t body = 0, need = 0;
        uint64_t size = 0;
        uint64_t max = rndn(2) ? 1 << 20 : rndn(100);
        int r = fb_zmtp_next(p, len, (int)rndn(2), max, &body, &size, &need);
        CHECK(r >= FB_ZMTP_BAD && r <= FB_ZMTP_COMMAND);
        if (r == FB_ZMTP_COMMAND) {
            CHECK(body + size <= len && size <= FB_ZMTP_MAX_COMMAND);
            const unsigned char *t;
            size_t tl;
            if (fb_zmtp_ready_type(p + body, size, &t, &tl)) CHECK(t >= p + body && t + tl <= p + body + size);
            unsigned char pong[32];
            CHECK(fb_zmtp_pong(pong, p + body, size) <= sizeof pong);
        }
        size_t w = fb_zmtp_whole_end(p, len, (int)rndn(2), max);
        CHECK(w <= len);
        CHECK(fb_zmtp_skip_commands(p, w) <= w);
        free(p);
    }
}

int main(void)
{
    RUN(test_a_stream_read_message_by_message_and_cut_anywhere);
    RUN(test_what_a_peer_may_not_send);
    RUN(test_random_and_mutated_bytes);
    CTEST_END();
}
