/* test_leases.c - a session's PING answered in the data plane
 * (fb_leases.h): PONG at once or behind what waits, the lease granted
 * only to lease pings it may answer, the grant never shortened, a gone
 * peer said, nothing answered before the instance is said.  The socket
 * is a test's: its sends are recorded, and it refuses as told. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctest.h"
#include "fb_leases.h"
#include "fb_protocol.h"

#include "fake_msg.h"

/* The socket: frames sent, and what it answers. */
static char sent[16][80];
static size_t sent_len[16];
static int sent_flags[16];
static int nsent;
static int refuse;                   /* 0: takes everything; else the errno of every send */
static int s_send(void *sock, const void *buf, size_t len, int flags)
{
    (void)sock;
    if (refuse) return -1;
    REQUIRE(nsent < 16 && len <= 80);
    memcpy(sent[nsent], buf, len);
    sent_len[nsent] = len;
    sent_flags[nsent] = flags;
    nsent++;
    return (int)len;
}
static int s_errno(void) { return refuse; }
static fb_zmq_api api;

static fb_link *session(fb_links *t, uint32_t link, int acks)
{
    fb_link *s = &t->at[link];
    s->session = 1;
    s->acks = (uint8_t)acks;
    REQUIRE(fb_links_name(t, link, (const uint8_t *)"peer", 4) == 0);
    return s;
}

static uint64_t u64(const char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | (uint8_t)p[i];
    return v;
}

static void test_nothing_answered_before_the_instance_is_said(void)
{
    fb_links t;
    fb_leases l = {0};
    REQUIRE(fb_links_init(&t) == 0);
    fb_link *s = session(&t, 1, 1);
    nsent = 0;
    CHECK_EQ(fb_leases_pong(&l, s, &api, NULL, &Z, "tok", 3, NULL, 0, 1000), FB_PONG_NOT);
    CHECK_EQ(nsent, 0);
    CHECK_EQ(fb_leases_set(&l, "x", FB_INSTANCE_MAX + 1, 0), -1);
    CHECK_EQ(errno, EINVAL);
    fb_links_free(&t, &Z);
}

static void test_liveness_pong_at_once(void)
{
    fb_links t;
    fb_leases l = {0};
    REQUIRE(fb_links_init(&t) == 0);
    REQUIRE(fb_leases_set(&l, "inst-1", 6, 0) == 0);
    fb_link *s = session(&t, 1, 0);
    nsent = 0;
    CHECK_EQ(fb_leases_pong(&l, s, &api, NULL, &Z, "tok", 3, NULL, 0, 5000), FB_PONG_SENT);
    CHECK_EQ(nsent, 4);
    CHECK(sent_len[0] == 4 && memcmp(sent[0], "peer", 4) == 0);
    CHECK(sent_len[1] == 1 && sent[1][0] == FB_CMD_PONG);
    CHECK(sent_len[2] == 3 && memcmp(sent[2], "tok", 3) == 0);
    CHECK(sent_len[3] == 6 && memcmp(sent[3], "inst-1", 6) == 0);
    CHECK_EQ(sent_flags[3] & 2, 0);                 /* the last frame */
    CHECK_EQ(l.answered, 1);
    CHECK_EQ(l.granted, 0);
    CHECK_EQ(s->lease_end_ns, 0);
    CHECK_EQ(s->last_sent_ns, 5000);
    fb_links_free(&t, &Z);
}

static void test_lease_ping_grants_only_when_it_may(void)
{
    fb_links t;
    fb_leases l = {0};
    REQUIRE(fb_links_init(&t) == 0);
    REQUIRE(fb_leases_set(&l, "inst", 4, 0) == 0);
    fb_link *s = session(&t, 1, 1);
    /* No lease here (a broker with an upstream): the owner answers. */
    CHECK_EQ(fb_leases_pong(&l, s, &api, NULL, &Z, "t", 1, "lease", 5, 0), FB_PONG_NOT);
    REQUIRE(fb_leases_set(&l, "inst", 4, 2000000000ull) == 0);   /* 2 s */
    /* Not "lease", or a session that did not say "ack": the owner's. */
    CHECK_EQ(fb_leases_pong(&l, s, &api, NULL, &Z, "t", 1, "leash", 5, 0), FB_PONG_NOT);
    CHECK_EQ(fb_leases_pong(&l, s, &api, NULL, &Z, "t", 1, "lease!", 6, 0), FB_PONG_NOT);
    fb_link *other = &t.at[2];
    other->session = 1;
    CHECK_EQ(fb_leases_pong(&l, other, &api, NULL, &Z, "t", 1, "lease", 5, 0), FB_PONG_NOT);
    nsent = 0;
    CHECK_EQ(fb_leases_pong(&l, s, &api, NULL, &Z, "t", 1, "lease", 5, 1000), FB_PONG_SENT);
    CHECK_EQ(nsent, 5);
    CHECK_EQ(sent_len[4], 8);
    CHECK_EQ(u64(sent[4]), 2000000);                /* µs */
    CHECK_EQ(s->lease_end_ns, 1000 + 2000000000ull);
    CHECK_EQ(l.granted, 1);
    /* The owner's own grant never shortens it; a later one lengthens it. */
    fb_leases_grant(s, 5);
    CHECK_EQ(s->lease_end_ns, 1000 + 2000000000ull);
    fb_leases_grant(s, 3000000000ull);
    CHECK_EQ(s->lease_end_ns, 3000000000ull);
    fb_links_free(&t, &Z);
}

static void test_pong_waits_behind_what_waits_and_on_a_full_pipe(void)
{
    fb_links t;
    fb_leases l = {0};
    REQUIRE(fb_links_init(&t) == 0);
    REQUIRE(fb_leases_set(&l, "inst", 4, 1000000000ull) == 0);
    fb_link *s = session(&t, 1, 1);
    /* Something waits: the PONG goes behind it, nothing sent now. */
    fb_qentry *data = fb_qentry_new(&Z, 1);
    REQUIRE(data && fb_qentry_frame(&Z, data, 0, "batch", 5) == 0);
    data->records = 3;
    fb_linkq_push(&s->q, data);
    nsent = 0;
    CHECK_EQ(fb_leases_pong(&l, s, &api, NULL, &Z, "tk", 2, "lease", 5, 10), FB_PONG_QUEUED);
    CHECK_EQ(nsent, 0);
    fb_qentry *e = s->q.head->next;
    REQUIRE(e && e == s->q.tail);
    CHECK_EQ(e->nframes, 4);
    CHECK_EQ(e->cmd, FB_CMD_PONG);
    CHECK_EQ(e->records, 0);
    CHECK(memcmp(m_data(&e->frames[1]), "tk", 2) == 0);
    CHECK_EQ(u64(m_data(&e->frames[3])), 1000000);
    CHECK_EQ(s->lease_end_ns, 10 + 1000000000ull);  /* granted as it is queued */
    /* A loss to tell waits too (the GAP goes first). */
    fb_linkq_clear(&Z, &s->q);
    s->q.lost = 4;
    CHECK_EQ(fb_leases_pong(&l, s, &api, NULL, &Z, "tk", 2, NULL, 0, 10), FB_PONG_QUEUED);
    CHECK_EQ(nsent, 0);
    fb_linkq_clear(&Z, &s->q);
    s->q.lost = 0;
    /* A full pipe: queued. */
    refuse = EAGAIN;
    CHECK_EQ(fb_leases_pong(&l, s, &api, NULL, &Z, "tk", 2, NULL, 0, 10), FB_PONG_QUEUED);
    CHECK(s->q.head && s->q.head->nframes == 3);
    fb_linkq_clear(&Z, &s->q);
    /* A gone peer: said, nothing queued, nothing granted. */
    uint64_t answered_before = l.answered;
    refuse = EHOSTUNREACH;
    CHECK_EQ(fb_leases_pong(&l, s, &api, NULL, &Z, "tk", 2, NULL, 0, 10), FB_PONG_GONE);
    CHECK(s->q.head == NULL);
    CHECK_EQ(l.answered, answered_before);
    refuse = 0;
    fb_links_free(&t, &Z);
    CHECK_EQ(live, 0);
}

int main(void)
{
    api.send = s_send;
    api.last_error = s_errno;
    RUN(test_nothing_answered_before_the_instance_is_said);
    RUN(test_liveness_pong_at_once);
    RUN(test_lease_ping_grants_only_when_it_may);
    RUN(test_pong_waits_behind_what_waits_and_on_a_full_pipe);
    CTEST_END();
}
