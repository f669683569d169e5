/* test_react.c - a connection's reactions (fb_react.h), as a user thread
 * makes them on a message it read itself: no thread, a fake send. */
#define _POSIX_C_SOURCE 200809L
#include <unistd.h>

#include "ctest.h"
#include "fb_common.h"
#include "fb_react.h"

/* The fake socket's sends: each frame as a length byte and the bytes. */
static unsigned char sent[512];
static size_t sent_len;
static int send_fails;
static uint64_t took_n;

static int f_send(void *sock, const void *buf, size_t len, int flags)
{
    (void)sock;
    (void)flags;
    if (send_fails) return -1;
    REQUIRE(len < 64 && sent_len + 1 + len <= sizeof sent);
    sent[sent_len++] = (unsigned char)len;
    memcpy(sent + sent_len, buf, len);
    sent_len += len;
    return (int)len;
}

static void f_took(void *sock, uint64_t n)
{
    (void)sock;
    took_n += n;
}

static int paused;
static fb_view view;

static void setup(fb_react *x, int pings)
{
    memset(x, 0, sizeof *x);
    sent_len = 0;
    send_fails = 0;
    took_n = 0;
    paused = 0;
    x->send = f_send;
    x->flow_command = "F";
    x->flow_command_len = 1;
    x->flow_pause = 'p';
    x->flow_paused = &paused;
    x->flow_reset_command = "h";
    x->flow_reset_command_len = 1;
    x->want_command = "W";
    x->want_command_len = 1;
    x->ack_command = "A";
    x->ack_command_len = 1;
    x->view = &view;
    x->pong_command = "q";
    x->pong_command_len = 1;
    x->lease_token = "lease:";
    x->lease_token_len = 6;
    x->took_command = "t";
    x->took_command_len = 1;
    x->took = f_took;
    if (pings) {
        x->ping_command = "p";
        x->ping_command_len = 1;
        x->live_pong_command = "q";
        x->live_pong_command_len = 1;
        x->ping_interval_ns = 1000000000ull;
    }
}

/* fb_react_message on n frames given as strings (lens: NULL for strlen). */
static int react(fb_react *x, int n, const char **frames, const size_t *lens, uint64_t *ack)
{
    const unsigned char *f[4];
    size_t l[4];
    for (int i = 0; i < n; i++) {
        f[i] = (const unsigned char *)frames[i];
        l[i] = lens ? lens[i] : strlen(frames[i]);
    }
    return fb_react_message(x, (size_t)n, f, l, ack);
}

static void put_u64(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static void test_flow_pauses_and_resumes(void)
{
    fb_react x;
    setup(&x, 0);
    uint64_t ack = 0;
    CHECK_EQ(react(&x, 2, (const char *[]){"F", "p"}, NULL, &ack), FB_REACT_TAKEN);
    CHECK_EQ(paused, 1);
    CHECK_EQ(x.flow_pauses, 1);
    CHECK_EQ(react(&x, 2, (const char *[]){"F", "p"}, NULL, &ack), FB_REACT_TAKEN);
    CHECK_EQ(x.flow_pauses, 1);                     /* paused already: not counted */
    CHECK_EQ(react(&x, 2, (const char *[]){"F", "r"}, NULL, &ack), FB_REACT_TAKEN);
    CHECK_EQ(paused, 0);
    CHECK_EQ(react(&x, 2, (const char *[]){"F", "p"}, NULL, &ack), FB_REACT_TAKEN);
    CHECK_EQ(x.flow_pauses, 2);
    /* A new session's WELCOME: not paused, and the owner's to read. */
    CHECK_EQ(react(&x, 2, (const char *[]){"h", "{}"}, NULL, &ack), FB_REACT_OWNER);
    CHECK_EQ(paused, 0);
    /* Malformed: the owner's, the flag untouched. */
    CHECK_EQ(react(&x, 2, (const char *[]){"F", "pp"}, NULL, &ack), FB_REACT_OWNER);
    CHECK_EQ(paused, 0);
    CHECK_EQ(react(&x, 2, (const char *[]){"D", "data"}, NULL, &ack), FB_REACT_OWNER);
    CHECK_EQ(sent_len, 0);
    /* More frames than any reaction's message: the owner's, untouched. */
    const unsigned char *many[FB_REACT_FRAMES_MAX + 1];
    size_t many_lens[FB_REACT_FRAMES_MAX + 1];
    for (int i = 0; i <= FB_REACT_FRAMES_MAX; i++) {
        many[i] = (const unsigned char *)(i ? "p" : "F");
        many_lens[i] = 1;
    }
    CHECK_EQ(fb_react_message(&x, FB_REACT_FRAMES_MAX + 1, many, many_lens, &ack), FB_REACT_OWNER);
    CHECK_EQ(paused, 0);
}

/* A WANT [W, flags, ops, seq] subscribing key, into store. */
static int want(fb_react *x, unsigned char flags, const char *key, unsigned seq, uint64_t *ack)
{
    unsigned char ops[64], f[1] = {flags}, s[8];
    size_t k = strlen(key);
    memcpy(ops, "FB\x01\x00\x01\x00\x00\x00", 8);
    ops[8] = (unsigned char)k;
    ops[9] = 1;
    memcpy(ops + 10, key, k);
    ops[10 + k] = FB_OP_F_SUBSCRIBE;
    put_u64(s, seq);
    const char *frames[4] = {"W", (const char *)f, (const char *)ops, (const char *)s};
    size_t lens[4] = {1, 1, 11 + k, 8};
    return react(x, 4, frames, lens, ack);
}

static void test_a_want_is_applied_and_its_ack_sent_or_handed_back(void)
{
    fb_react x;
    fb_view_init(&view);
    fb_view_grant(&view, UINT64_MAX);               /* under a lease: acknowledge at once */
    setup(&x, 0);
    uint64_t ack = 0;
    CHECK_EQ(want(&x, FB_WANT_RESET, "room.1", 1, &ack), FB_REACT_TAKEN);
    CHECK_EQ(fb_view_match(&view, "room.1", 6), 1);
    CHECK(sent_len == 11 && sent[0] == 1 && sent[1] == 'A' && sent[2] == 8 && sent[3] == 1);   /* [A, 1] */
    CHECK_EQ(view.acked, 1);

    send_fails = 1;                                 /* the socket does not take it now */
    CHECK_EQ(want(&x, 0, "room.2", 2, &ack), FB_REACT_ACK);
    CHECK_EQ(ack, 2);                               /* the owner's to send */
    CHECK_EQ(fb_view_match(&view, "room.2", 6), 1);
    CHECK_EQ(view.acked, 1);

    const char *bad[3] = {"W", "", "junk"};         /* malformed: the owner's to report */
    CHECK_EQ(react(&x, 3, bad, NULL, &ack), FB_REACT_OWNER);
    CHECK_EQ(x.wants_refused, 1);
    CHECK_EQ(fb_view_match(&view, "room.1", 6), 1);
    fb_view_free(&view);
}

static void test_a_lease_pong_is_applied(void)
{
    fb_react x;
    fb_view_init(&view);
    fb_view_forget(&view);                          /* a session: no lease yet */
    setup(&x, 0);
    uint64_t t0 = fb_now_ns(), ack = 0;
    CHECK_EQ(fb_view_ask_renewal(&view, t0, 1), 1);
    CHECK_EQ(fb_view_take_renewal(&view), 1);       /* (the ping was sent) */
    unsigned char token[14] = "lease:", lease[8];
    put_u64(token + 6, t0);
    put_u64(lease, 100000);                         /* 100 ms */
    const char *pong[4] = {"q", (const char *)token, "inst", (const char *)lease};
    size_t lens[4] = {1, 14, 4, 8};
    CHECK_EQ(react(&x, 4, pong, lens, &ack), FB_REACT_TAKEN);
    CHECK(fb_view_in_lease(&view, t0 + 89999999ull));   /* counted from the ping's send time */
    CHECK(!fb_view_in_lease(&view, t0 + 90000000ull));
    CHECK_EQ(view.renew, FB_VIEW_RENEW_NONE);
    /* Without a lease: answered (ask again), and the owner's. */
    CHECK_EQ(fb_view_ask_renewal(&view, t0, 1), 1);
    CHECK_EQ(react(&x, 3, pong, lens, &ack), FB_REACT_OWNER);
    CHECK_EQ(view.renew, FB_VIEW_RENEW_NONE);
    /* A flush's PONG, and a malformed lease, are the owner's. */
    const char *flush[4] = {"q", "flush-1", "inst", (const char *)lease};
    size_t flush_lens[4] = {1, 7, 4, 8};
    CHECK_EQ(react(&x, 4, flush, flush_lens, &ack), FB_REACT_OWNER);
    size_t short_lens[4] = {1, 14, 4, 7};
    CHECK_EQ(react(&x, 4, pong, short_lens, &ack), FB_REACT_OWNER);
    CHECK_EQ(view.leases, 1);
    fb_view_free(&view);
}

static void test_the_lease_ping_goes_when_the_view_asks(void)
{
    fb_react x;
    fb_view_init(&view);
    fb_view_forget(&view);
    setup(&x, 1);
    x.lease_ask = "ask";
    x.lease_ask_len = 3;
    unsigned char token[FB_REACT_TOKEN_MAX + 8];
    uint64_t now = fb_now_ns();
    CHECK_EQ(fb_react_lease_ping(&x, now, token), 0);   /* nobody asked */
    CHECK_EQ(sent_len, 0);
    CHECK_EQ(fb_view_ask_renewal(&view, now, 1), 1);
    CHECK_EQ(fb_react_lease_ping(&x, now, token), 1);
    /* [p, lease: + now u64 LE, ask] */
    CHECK(sent_len == 2 + 15 + 4 && sent[0] == 1 && sent[1] == 'p' && sent[2] == 14);
    CHECK(memcmp(sent + 3, "lease:", 6) == 0);
    uint64_t t = 0;
    for (int i = 7; i >= 0; i--) t = t << 8 | sent[9 + i];
    CHECK_EQ(t, now);
    CHECK(sent[17] == 3 && memcmp(sent + 18, "ask", 3) == 0);
    CHECK_EQ(view.renew, FB_VIEW_RENEW_SENT);
    CHECK_EQ(x.lease_pings, 1);
    CHECK_EQ(fb_react_lease_ping(&x, now, token), 0);   /* asked once, sent once */
    /* The socket does not take it: asked for again, the token handed back. */
    fb_view_lease(&view, now, 100000);
    CHECK_EQ(fb_view_ask_renewal(&view, now, 1), 1);
    send_fails = 1;
    CHECK_EQ(fb_react_lease_ping(&x, now + 7, token), -1);
    CHECK_EQ(view.renew, FB_VIEW_RENEW_WANTED);
    CHECK(memcmp(token, "lease:", 6) == 0 && token[6] == (unsigned char)(now + 7));
    x.lease_ask = NULL;                             /* no lease pings configured */
    send_fails = 0;
    CHECK_EQ(fb_react_lease_ping(&x, now, token), 0);
    CHECK_EQ(view.renew, FB_VIEW_RENEW_WANTED);
    fb_view_free(&view);
}

static void test_liveness_pings_and_pongs(void)
{
    fb_react x;
    fb_view_init(&view);
    setup(&x, 1);
    uint64_t ack = 0, now = 5000000000ull;
    x.next_ping_ns = now + 10;
    CHECK_EQ(fb_react_ping_wait_ms(&x, now), 1);
    CHECK_EQ(fb_react_ping_if_due(&x, now), 0);     /* not yet */
    CHECK_EQ(fb_react_ping_if_due(&x, now + 10), 1);
    CHECK(sent_len == 3 && sent[0] == 1 && sent[1] == 'p' && sent[2] == 0);   /* [p, ""] */
    CHECK_EQ(x.next_ping_ns, now + 10 + 1000000000ull);
    CHECK_EQ(fb_react_ping_wait_ms(&x, now + 10), 1000);
    send_fails = 1;                                 /* not taken: not sent, and the next a second on */
    CHECK_EQ(fb_react_ping_if_due(&x, now + 2000000000ull), 0);
    CHECK_EQ(x.pings_sent, 1);
    CHECK_EQ(x.next_ping_ns, now + 3000000000ull);

    /* The PONG of a broker not known yet is the owner's; once known, taken. */
    const char *pong[3] = {"q", "", "inst"};
    CHECK_EQ(react(&x, 3, pong, NULL, &ack), FB_REACT_OWNER);
    fb_react_set_instance(&x, "inst", 4);
    CHECK_EQ(react(&x, 3, pong, NULL, &ack), FB_REACT_TAKEN);
    CHECK_EQ(x.pongs_taken, 1);
    CHECK_EQ(react(&x, 3, (const char *[]){"q", "", "new!"}, NULL, &ack), FB_REACT_OWNER);   /* restarted */
    CHECK_EQ(react(&x, 3, (const char *[]){"q", "flush-1", "inst"}, NULL, &ack), FB_REACT_OWNER);
    CHECK_EQ(x.pongs_taken, 1);
    char big[FB_REACT_INSTANCE_MAX + 1];
    memset(big, 'i', sizeof big);
    fb_react_set_instance(&x, big, sizeof big);     /* overlong: never known */
    CHECK_EQ(react(&x, 3, pong, NULL, &ack), FB_REACT_OWNER);
    setup(&x, 0);
    CHECK_EQ(fb_react_ping_wait_ms(&x, now), -1);   /* no pings configured */
    CHECK_EQ(fb_react_ping_if_due(&x, now), 0);
    fb_view_free(&view);
}

static void test_took_frees_what_the_broker_took(void)
{
    fb_react x;
    fb_view_init(&view);
    setup(&x, 0);
    uint64_t ack = 0;
    unsigned char n[8];
    put_u64(n, 42);
    const char *took[2] = {"t", (const char *)n};
    size_t lens[2] = {1, 8};
    CHECK_EQ(react(&x, 2, took, lens, &ack), FB_REACT_TAKEN);
    CHECK_EQ(took_n, 42);
    size_t bad[2] = {1, 7};
    CHECK_EQ(react(&x, 2, took, bad, &ack), FB_REACT_OWNER);
    CHECK_EQ(took_n, 42);
    x.took = NULL;                                  /* a pyzmq socket keeps nothing */
    CHECK_EQ(react(&x, 2, took, lens, &ack), FB_REACT_OWNER);
    CHECK_EQ(react(&x, 0, took, lens, &ack), FB_REACT_OWNER);
    fb_view_free(&view);
}

int main(void)
{
    RUN(test_flow_pauses_and_resumes);
    RUN(test_a_want_is_applied_and_its_ack_sent_or_handed_back);
    RUN(test_a_lease_pong_is_applied);
    RUN(test_the_lease_ping_goes_when_the_view_asks);
    RUN(test_liveness_pings_and_pongs);
    RUN(test_took_frees_what_the_broker_took);
    CTEST_END();
}
